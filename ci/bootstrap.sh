#!/usr/bin/env bash
# Set up (or refresh) the course's virtual environment in .venv, from the repository root.
#
#   bash ci/bootstrap.sh            # idempotent: a second call installs nothing new
#
# - Python: $PYTHON, else python3.11, else python3 (3.10+).
# - A machine without a GPU gets requirements.txt as pinned, torch 2.13.0 CPU included.
# - A GPU box whose Python already has a CUDA or ROCm torch keeps it: the venv sees the system's
#   packages and the rest installs under a constraint pinning that torch, so pip never swaps it
#   for a multi-GB wheel. Set QUANTLAB_KEEP_TORCH=0 to ignore the box's torch.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for c in python3.11 python3; do command -v "$c" >/dev/null && { PY=$c; break; }; done
fi
[ -n "$PY" ] || { echo "bootstrap: no python3 found; install Python 3.11 and retry" >&2; exit 1; }
"$PY" -c 'import sys; assert sys.version_info >= (3, 10), sys.version' ||
  { echo "bootstrap: $PY is older than 3.10; set PYTHON=/path/to/python3.11" >&2; exit 1; }

# A GPU torch already on the base interpreter?
gpu_torch=$("$PY" - <<'EOF' 2>/dev/null || true
import torch
if torch.version.hip or torch.version.cuda or getattr(torch.version, "musa", None):
    print(torch.__version__)
EOF
)
if [ "${QUANTLAB_KEEP_TORCH:-1}" = 0 ]; then gpu_torch=""; fi

if [ ! -x .venv/bin/python ]; then
  if [ -n "$gpu_torch" ]; then
    echo "bootstrap: keeping this machine's torch $gpu_torch (venv with system site-packages)"
    "$PY" -m venv --system-site-packages .venv
  else
    "$PY" -m venv .venv
  fi
fi

PIP=(.venv/bin/python -m pip install --disable-pip-version-check -q)
if [ -n "$gpu_torch" ] && .venv/bin/python -c 'import torch' 2>/dev/null; then
  have=$(.venv/bin/python -c 'import torch; print(torch.__version__)')
  constraints=$(mktemp); trap 'rm -f "$constraints"' EXIT
  echo "torch==$have" >"$constraints"
  "${PIP[@]}" -c "$constraints" -r requirements-course.txt
else
  "${PIP[@]}" -r requirements.txt
fi
# The course is not installed as a package (pyproject.toml says why); a venv that has it from before loses it.
if .venv/bin/python -m pip show -q quant-lab >/dev/null 2>&1; then
  .venv/bin/python -m pip uninstall --disable-pip-version-check -q -y quant-lab
fi
# The papermill chain starts notebooks on the kernel named "python3": make it this venv's Python. A lab opened
# in JupyterLab runs in its own folder, so the kernel finds utils/ through PYTHONPATH: the caller's first
# (the chain puts its own checkout there), then this repository.
.venv/bin/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (quant-lab)" \
  --env PYTHONPATH "\${PYTHONPATH}:$PWD" >/dev/null
echo "bootstrap: .venv ready ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"

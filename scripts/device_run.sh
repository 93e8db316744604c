#!/usr/bin/env bash
# Run the lab chain on the lent GPU machine (the `device` tool) in one call, and bring the run back.
#
# Here, once:      bash ../shared/tools/device-wheels.sh        # fills .whl/ (lm-eval, papermill, ...)
# Then, via the device tool, from the repository root:
#     run(carry=['.whl'], command='bash scripts/device_run.sh h200')              # whole chain
#     run(carry=['.whl'], command='bash scripts/device_run.sh h200 --from 03_eval --resume ...')
# The run folder comes back as $OUT/run.tar.gz (the tool returns only 2 folder levels), with its
# report.md beside it; unpack it here with: tar -xzf <files_at>/run.tar.gz -C runs/
set -euo pipefail
profile=${1:?usage: device_run.sh PROFILE [ci.run args...]}; shift
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-cache
if [ -f .whl/device-install.sh ]; then
  source .whl/device-install.sh
else
  echo "device_run: no .whl/ carried: run ../shared/tools/device-wheels.sh here and carry ['.whl']" >&2
  exit 2
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0))'
runs=$(mktemp -d)
status=0
# Stop the chain inside the tool's 10-minute limit so that what it made still comes back.
timeout -k 15 --signal=INT "${CHAIN_TIMEOUT_S:-530}" \
  python3 -m ci.run --profile "$profile" --runs-dir "$runs" "$@" || status=$?
out=${OUT:-/tmp/out}; mkdir -p "$out"
tar -czf "$out/run.tar.gz" -C "$runs" .
for r in "$runs"/*/; do cp "$r/report.md" "$out/report.md" 2>/dev/null || true; cat "$r/report.md" 2>/dev/null || true; done
exit $status

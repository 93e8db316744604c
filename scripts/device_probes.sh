#!/usr/bin/env bash
# Issue 8's kernel experiments on the lent GPU, in one call of the device tool:
#     run(carry=['.whl'], command='bash scripts/device_probes.sh')      # ROUND=2 for the older GEMV sweep
# scripts/gemv_probe.py (Int4 GEMV variants, round ROUND, default 3) and scripts/grouped_probe.py (TMA
# grouped GEMM); their tables come back under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-cache
source .whl/device-install.sh
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
timeout 330 python3 scripts/gemv_probe.py --round "${ROUND:-3}" 2>&1 | tee "$out/gemv_probe.log" | grep -v "^  "
timeout 180 python3 scripts/grouped_probe.py 2>&1 | tee "$out/grouped_probe.log" | tail -28

#!/usr/bin/env bash
# Issue 8's benchmark on the lent GPU, in one call of the device tool:
#     run(kind='nvidia-h200', command='bash scripts/device_bench.sh')
# (torch and Triton are on the device already: .whl, from ../shared/tools/device-wheels.sh, is used when
# carried and not needed)
# First tests/test_kernels.py compiled for the GPU (TRITON_INTERPRET=0: the same assertions as CI's
# interpreter run, on compiled kernels; the GEMV's f16x2 dequant and its fp32 fallback run only there),
# then scripts/bench_kernels.py --sweep; the table comes back as $OUT/bench.md. (scripts/gemv_ab.py, the
# probe-vs-shipped A/B of the split-K fix-up, ran here until that question was settled.)
set -uo pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-cache
[ ! -f .whl/device-install.sh ] || source .whl/device-install.sh
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
TRITON_INTERPRET=0 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py 2>&1 | tail -15
tests=$?
timeout 420 python3 scripts/bench_kernels.py --sweep 2>&1 | tee "$out/bench.log" | grep -v "^  row:"
exit $(( tests || $? ))

#!/usr/bin/env bash
# The kernel benchmark on a lent GPU, in one call of at most ~8 minutes:
#     run(kind='nvidia-h200', command='bash scripts/device_bench.sh')
# First the kernel tests compiled for the GPU (TRITON_INTERPRET=0: the same assertions as CI's interpreter
# run, on compiled kernels; the GEMV's f16x2 dequant, its fp32 fallback and its compiled-kernel launches
# run only there), then scripts/bench_kernels.py --sweep (SWEEP=0: without the sweeps), whose table,
# the eager-call rows of the Int4 GEMV included, comes back as $OUT/bench.md with its log.
# (torch and Triton are on the device already; .whl is used when carried and not needed.)
set -uo pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-cache
[ ! -f .whl/device-install.sh ] || source .whl/device-install.sh
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
TRITON_INTERPRET=0 timeout 180 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_gemv.py tests/test_w4a16.py tests/test_timing.py \
    2>&1 | tee "$out/tests.log" | tail -15
tests=${PIPESTATUS[0]}
sweep=--sweep; [ "${SWEEP:-1}" = 0 ] && sweep=
timeout 300 python3 scripts/bench_kernels.py $sweep 2>&1 | tee "$out/bench.log" | grep -v "^  row:"
bench=${PIPESTATUS[0]}
echo "tests exit $tests, bench exit $bench"
exit $(( tests || bench ))

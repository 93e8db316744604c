#!/usr/bin/env bash
# Issue 8's kernel experiments on the lent GPU, in one call of the device tool:
#     run(carry=['.whl'], command='bash scripts/device_probes.sh')      # ROUND=2 for the older GEMV sweep
#     run(carry=['.whl'], command='NCU=scripts/probe_cfg/gemv_ncu_h200.json ROUND=4 GROUPED=0 bash scripts/device_probes.sh')
# NCU (a --ncu json of scripts/gemv_probe.py): first ncu --set full of those GEMV launches ($OUT/ncu.txt);
# then scripts/gemv_probe.py (Int4 GEMV variants, round ROUND, default 3) and, unless GROUPED=0,
# scripts/grouped_probe.py (TMA grouped GEMM); their tables come back under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-cache
source .whl/device-install.sh
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
if [ -n "${NCU:-}" ]; then
  # NCU_ARGS: other ncu sections, e.g. "--section WarpStateStats --print-details all" for the stall reasons
  timeout 150 ncu ${NCU_ARGS:---set full} -k regex:_int4_gemv python3 scripts/gemv_probe.py --ncu "$NCU" >"$out/ncu.txt" 2>&1
  echo "ncu rc=$?"; grep -E "_int4_gemv|Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Registers Per|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|No Eligible" "$out/ncu.txt"
fi
timeout "${PROBE_S:-330}" python3 scripts/gemv_probe.py --round "${ROUND:-3}" 2>&1 | tee "$out/gemv_probe.log" | grep -v "^  "
[ "${GROUPED:-1}" = 0 ] || timeout 180 python3 scripts/grouped_probe.py 2>&1 | tee "$out/grouped_probe.log" | tail -28

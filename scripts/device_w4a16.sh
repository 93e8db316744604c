#!/usr/bin/env bash
# The W4A16 kernel's device run, in one call of the device tool (< 10 minutes), on the lent H100:
#     run(kind='nvidia-h100-x1', carry=['.whl', '.gsm8k'], command='bash scripts/device_w4a16.sh')
# (.whl: bash ../shared/tools/device-wheels.sh; .gsm8k: see scripts/rehearsal_7b.sh's header.)
#  1. tests/test_w4a16.py compiled for the GPU (TRITON_INTERPRET=0), while GPTQModel's Marlin builds (nvcc)
#     in the background;
#  2. the 7B-shaped random pair (scripts/make_7b_pair.py);
#  3. scripts/bench_w4a16.py: the kernel against the Int4 GEMV and bf16 at Qwen2.5-7B's shapes, M = 1..16,
#     cold under CUDA graphs, and eager calls (SWEEP=1: also its tile sweep);
#  4. scripts/profile_decode.py: BF16 against Int4 (gptq_backend quantlab) per compiled decode step at
#     batch 16, split by torch's profiler; then Marlin's columns added to the kernel table (built by now);
#  5. with the time left, scripts/bench_lab03.py: Lab 03's own lm-eval path, BF16 and Int4-quantlab,
#     decode compiled, batch 16 (LAB03_SETTINGS overrides the settings).
# `bash scripts/device_w4a16.sh sweep`: only the kernel's tests (within TESTS_TIMEOUT s, default 120; TESTS_MORE:
# more test files) and its tile sweep (within SWEEP_TIMEOUT s, default 330; each unpacking, with registers
# and spills; the SASS itself: scripts/w4a16_sass.py, here) at gate/up, down and q/o, M = 1 and 16, beside bf16 and
# the Int4 GEMV, then Marlin's columns for the same shapes once its build is done (~9 minutes). `table`: the kernel's tests,
# the trained fixture's Int4 generations through quantlab against gptq_torch (scripts/fixture_agreement.py; FIXTURE_BATCH, default
# 16, the rows the fused kernel takes: above 16 a decode step dequantizes and calls cuBLAS; FIXTURE_LIMIT, default 320), and
# the kernel table at its default tile, every shape and M, with Marlin's columns once built (~9 minutes; FIXTURE=0:
# no fixture; TESTS=0: no tests; TESTS_TIMEOUT and TESTS_MORE as for `sweep`; TABLE_TIMEOUT, default 150 s).
# `gated`: GATED_STEPS in order (default "tests bench lab03 profile"; also kbench, eager, fixture): the kernel's tests (TESTS_MORE, TESTS_TIMEOUT), gate and up
# fused against two launches (scripts/bench_gated.py at GATED_ROWS, default "1 16"; GATED_SWEEP='' skips its tile
# sweep), the 7B-shaped pair, then
# Lab 03's own path (LAB03_LIMIT, default 320), the decode profile (PROFILE_ARGS, e.g. --int4-unfused), the kernel table
# (kbench: KBENCH_ROWS, default "1 16", without Marlin, within KBENCH_TIMEOUT s, default 120), one eager call's host
# time piece by piece (eager: scripts/eager_w4a16.py),
# the trained fixture through quantlab against gptq_torch (fixture).
# `splits`: the Gluon kernel's split-K at gate/up and down (SPLITS_ROWS, default "1 2 4 16"; SPLITS_SHAPES; SPLITS_ARGS,
# e.g. "--block-n 64 128 --stages 1 3"), each with its programs and how many fit the GPU at once, and eager calls
# at M = 1, with nothing compiling beside them.
# `model`: the kernel's tests, the 7B-shaped pair, Lab 03's own path (BF16 against Int4-quantlab, compiled, batch 16,
# LAB03_LIMIT problems, default 64, within LAB03_TIMEOUT s; KBENCH=1 first: the kernel table at M = 1 and 16 without
# Marlin), then (unless PROFILE=0) the decode profile under both attentions with lm-eval's stops (~9 minutes).
# From this checkout with the wheels and GSM8K kept in .dev/kernel/: carry ['.dev/kernel/.whl', '.dev/kernel/.gsm8k'],
# command 'ln -sfn .dev/kernel/.whl .whl && ln -sfn .dev/kernel/.gsm8k .gsm8k && bash scripts/device_w4a16.sh MODE'.
# Back under $OUT: run.log, tests.log, bench_w4a16.{md,json}, profile_decode.{md,json}, bench_lab03.{md,json}.
set -uo pipefail
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-570}
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
say() { printf '[%s +%4ss] %s\n' "$(date -u +%H:%M:%S)" $(( $(date +%s) - T0 )) "$*"; }
OUT=${OUT:-/tmp/out}; W=/tmp/quantlab-rehearsal
mkdir -p "$OUT" "$W"
RUNTMP=$(mktemp -d /tmp/w4a16-run.XXXX)   # this call's outputs: a warm machine keeps an earlier call's
exec > >(tee -a "$OUT/run.log") 2>&1
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-cache
[ -f .whl/device-install.sh ] || { say "no .whl/ carried: bash ../shared/tools/device-wheels.sh, carry ['.whl']"; exit 2; }
source .whl/device-install.sh || { say "wheel install failed"; exit 2; }
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'

unpack_gsm8k() {   # the carried GSM8K (.gsm8k/*.jsonl.xz) into $W/gsm8k, once per machine
  [ -f "$W/gsm8k/test.jsonl" ] && return 0
  mkdir -p "$W/gsm8k"
  for f in train test; do python3 -c 'import lzma, sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())' \
    ".gsm8k/$f.jsonl.xz" > "$W/gsm8k/$f.jsonl" || say "no .gsm8k carried"; done
}

build_pair() {   # a warm machine keeps the pair of an earlier call (built aside, then moved into place)
  [ -f "$W/models/build.json" ] && { say "the 7B-shaped pair of an earlier call is here"; return 0; }
  say "building the 7B-shaped pair"
  rm -rf "$W/models.partial"
  timeout 150 python3 scripts/make_7b_pair.py --out "$W/models.partial" --data "$W/gsm8k" > /tmp/build.log 2>&1 \
    && mv "$W/models.partial" "$W/models" || { say "build failed"; tail -20 /tmp/build.log; return 3; }
}

MARLIN=
case "${1:-all}" in gated|model|splits) ;;   # host-bound timings there: no compiler running beside them
  *) say "Marlin: building in the background (its own process group)"
     MAX_JOBS=8 setsid python3 - > /tmp/marlin_build.log 2>&1 <<'EOF' &
import torch
from utils import gptq, gptq_kernels
qw, qz, s = gptq.pack_gptq_int4(torch.randn(256, 256), 128)
m = gptq_kernels.build_kernel("gptq_marlin", {"qweight": qw, "qzeros": qz, "scales": s}, "cuda", torch.float16,
                              compile_extensions=True)
print("marlin built", type(m).__name__, m(torch.randn(1, 256, device="cuda", dtype=torch.float16)).shape)
EOF
     MARLIN=$! ;;
esac

if [ "${1:-all}" = gated ]; then
  STEPS=" ${GATED_STEPS:-tests bench lab03 profile} "
  if [[ $STEPS == *" tests "* ]]; then
    TRITON_INTERPRET=0 timeout "${TESTS_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider tests/test_w4a16.py tests/test_w4a16_last_sum.py tests/test_w4a16_gated.py ${TESTS_MORE:-} 2>&1 |
      tee "$OUT/tests.log" | tail -2
  fi
  if [[ $STEPS == *" bench "* ]]; then
    say "gate and up: fused against two launches"
    timeout 150 python3 scripts/bench_gated.py --out $RUNTMP/gated --rows ${GATED_ROWS:-1 16} ${GATED_SWEEP---sweep} 2>&1 |
      grep -v "^INFO\|gc.collect" | grep -v "^|" | tail -70
    cp $RUNTMP/gated/bench_gated.* "$OUT/" 2>/dev/null
  fi
  unpack_gsm8k
  if [[ $STEPS == *" lab03 "* || $STEPS == *" profile "* ]]; then
    build_pair || exit 3
  fi
  for step in $STEPS; do
    case $step in
      profile)
        say "decode profile, grouped attention, lm-eval's stops"
        timeout -k 10 --signal=INT "${PROFILE_TIMEOUT:-$(( $(left) - 10 ))}" python3 scripts/profile_decode.py \
          --golden "$W/models/bf16" --int4 "$W/models/gptq-int4" --gptq-backend quantlab --lm-eval-stops \
          ${PROFILE_ARGS:-} --out $RUNTMP/profile 2>&1 | grep -v -i -e "warn(" -e "^INFO\|gc.collect" | tail -20
        cp $RUNTMP/profile/profile_decode.* "$OUT/" 2>/dev/null ;;
      lab03)
        say "Lab 03 settings (${LAB03_LIMIT:-320} problems)"
        PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout -k 10 --signal=INT "${LAB03_TIMEOUT:-240}" \
          python3 scripts/bench_lab03.py --golden "$W/models/bf16" --int4 "$W/models/gptq-int4" --data "$W/gsm8k" \
          --limit "${LAB03_LIMIT:-320}" --out $RUNTMP/lab03 --settings ${LAB03_SETTINGS:-golden:compiled:16 int4:compiled:16:quantlab} 2>&1 |
          grep -v -i -e "warn(" -e "^ *$" -e "it/s\]" -e "s/it\]" | tail -12
        cp $RUNTMP/lab03/bench_lab03.* "$OUT/" 2>/dev/null ;;
      fixture)
        say "the trained fixture: quantlab against gptq_torch"
        timeout "${FIXTURE_TIMEOUT:-300}" python3 scripts/fixture_agreement.py --out $RUNTMP/agree --limit "${FIXTURE_LIMIT:-320}" --batch "${FIXTURE_BATCH:-16}" 2>&1 |
          grep -v -i "warn(\|^INFO\|gc.collect\|it/s\]" | tail -6
        cp $RUNTMP/agree/fixture_agreement.* "$OUT/" 2>/dev/null ;;
      eager)
        say "one eager call's host time, piece by piece"
        timeout 120 python3 scripts/eager_w4a16.py --profile --out $RUNTMP/eager/eager_w4a16.md 2>&1 | grep -v "^INFO" | head -8
        cp $RUNTMP/eager/eager_w4a16.md "$OUT/" 2>/dev/null ;;
      kbench)
        say "the kernel table at M = ${KBENCH_ROWS:-1 16}, eager calls"
        # shellcheck disable=SC2086
        timeout "${KBENCH_TIMEOUT:-120}" python3 scripts/bench_w4a16.py --out $RUNTMP/kbench --no-marlin --rows ${KBENCH_ROWS:-1 16} 2>&1 |
          grep -v "^INFO\|gc.collect" | grep -v "^|" | tail -12
        cp $RUNTMP/kbench/bench_w4a16.* "$OUT/" 2>/dev/null ;;
    esac
  done
  say "done"; exit 0
fi
if [ "${1:-all}" = model ]; then
  TRITON_INTERPRET=0 timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_w4a16.py tests/test_w4a16_last_sum.py 2>&1 | tee "$OUT/tests.log" | tail -2
  if [ "${KBENCH:-0}" = 1 ]; then
    timeout 120 python3 scripts/bench_w4a16.py --out $RUNTMP/kbench --no-marlin --rows 1 16 2>&1 | grep -v "^INFO\|gc.collect" |
      grep -v "^|" | tail -12
    cp $RUNTMP/kbench/bench_w4a16.* "$OUT/" 2>/dev/null
  fi
  unpack_gsm8k
  build_pair || exit 3
  say "Lab 03 settings (${LAB03_LIMIT:-64} problems)"
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout -k 10 --signal=INT "${LAB03_TIMEOUT:-200}" \
    python3 scripts/bench_lab03.py --golden "$W/models/bf16" --int4 "$W/models/gptq-int4" --data "$W/gsm8k" \
    --limit "${LAB03_LIMIT:-64}" --out $RUNTMP/lab03 --settings golden:compiled:16 int4:compiled:16:quantlab 2>&1 |
    grep -v -i -e warn -e "^ *$" -e "it/s\]" -e "s/it\]" | tail -12
  cp $RUNTMP/lab03/bench_lab03.* "$OUT/" 2>/dev/null
  [ "${PROFILE:-1}" = 1 ] || { say "done"; exit 0; }
  say "decode profile, both attentions, lm-eval's stops"
  timeout -k 10 --signal=INT $(( $(left) - 15 )) python3 scripts/profile_decode.py --golden "$W/models/bf16" \
    --int4 "$W/models/gptq-int4" --gptq-backend quantlab --attention sdpa_grouped sdpa --lm-eval-stops --out $RUNTMP/profile 2>&1 |
    grep -v -i -e warn -e "^INFO\|gc.collect" | tail -30
  cp $RUNTMP/profile/profile_decode.* "$OUT/" 2>/dev/null
  say "done"; exit 0
fi
if [ "${1:-all}" = table ]; then
  [ "${TESTS:-1}" = 1 ] && TRITON_INTERPRET=0 timeout "${TESTS_TIMEOUT:-120}" python3 -m pytest -q -p no:cacheprovider \
    tests/test_w4a16.py tests/test_w4a16_last_sum.py ${TESTS_MORE:-} 2>&1 | tee "$OUT/tests.log" | tail -3
  if [ "${FIXTURE:-1}" = 1 ]; then
    say "the trained fixture: quantlab against gptq_torch"
    timeout "${FIXTURE_TIMEOUT:-300}" python3 scripts/fixture_agreement.py --out $RUNTMP/agree --limit "${FIXTURE_LIMIT:-320}" --batch "${FIXTURE_BATCH:-16}" 2>&1 | grep -v -i "warn\|^INFO\|gc.collect" | tail -16
    cp $RUNTMP/agree/fixture_agreement.* "$OUT/" 2>/dev/null
  fi
  timeout "${TABLE_TIMEOUT:-150}" python3 scripts/bench_w4a16.py --out $RUNTMP/ktable --no-marlin 2>&1 | grep -v "^INFO\|gc.collect" | grep -v "^|" | tail -30
  cp $RUNTMP/ktable/bench_w4a16.* "$OUT/" 2>/dev/null
  say "waiting for Marlin's build"; wait $MARLIN; tail -1 /tmp/marlin_build.log
  if [ -f $RUNTMP/ktable/bench_w4a16.json ] && [ "$(left)" -gt 40 ]; then
    timeout $(( $(left) - 10 )) python3 scripts/bench_w4a16.py --out $RUNTMP/ktable2 --marlin-into $RUNTMP/ktable/bench_w4a16.json \
      2>&1 | grep -v "^INFO\|gc.collect" | tail -30
    cp $RUNTMP/ktable2/bench_w4a16.* "$OUT/" 2>/dev/null
  fi
  say "done"; exit 0
fi
if [ "${1:-all}" = splits ]; then
  # shellcheck disable=SC2086
  timeout "${SPLITS_TIMEOUT:-$(( $(left) - 10 ))}" python3 scripts/bench_w4a16.py --out $RUNTMP/splits --no-marlin --splits \
    --rows ${SPLITS_ROWS:-1 2 4 16} --shapes ${SPLITS_SHAPES:-gate_proj down_proj} ${SPLITS_ARGS:-} 2>&1 | grep -v "^INFO\|gc.collect" | grep -v "^|" | tail -120
  cp $RUNTMP/splits/bench_w4a16.* "$OUT/" 2>/dev/null
  say "done"; exit 0
fi
if [ "${1:-all}" = sweep ]; then
  TRITON_INTERPRET=0 timeout "${TESTS_TIMEOUT:-120}" python3 -m pytest -q -p no:cacheprovider tests/test_w4a16.py tests/test_w4a16_last_sum.py ${TESTS_MORE:-} \
    2>&1 | tee "$OUT/tests.log" | tail -3
  timeout "${SWEEP_TIMEOUT:-330}" python3 scripts/bench_w4a16.py --out $RUNTMP/ksweep --no-marlin --sweep --rows 1 16 \
    --shapes "gate_proj, up_proj" down_proj "q_proj, o_proj" 2>&1 | grep -v "^INFO\|gc.collect" | grep -v "^|" | tail -80
  cp $RUNTMP/ksweep/bench_w4a16.* "$OUT/" 2>/dev/null
  say "waiting for Marlin's build"; wait $MARLIN; tail -2 /tmp/marlin_build.log
  if [ -f $RUNTMP/ksweep/bench_w4a16.json ] && [ "$(left)" -gt 40 ]; then
    timeout $(( $(left) - 15 )) python3 scripts/bench_w4a16.py --out $RUNTMP/ksweep2 --marlin-into $RUNTMP/ksweep/bench_w4a16.json \
      --shapes "gate_proj, up_proj" down_proj "q_proj, o_proj" 2>&1 | grep -v "^INFO\|gc.collect" | grep -v "^|" | tail -20
    cp $RUNTMP/ksweep2/bench_w4a16.* "$OUT/" 2>/dev/null
  fi
  say "done"; exit 0
fi

say "tests, compiled"
TRITON_INTERPRET=0 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_w4a16.py tests/test_w4a16_last_sum.py 2>&1 | tee "$OUT/tests.log" | tail -5

unpack_gsm8k
build_pair

say "kernel bench (Marlin's columns come later, once it is built)"
sweep=; [ "${SWEEP:-0}" = 1 ] && sweep=--sweep
timeout 150 python3 scripts/bench_w4a16.py --out $RUNTMP/kbench --no-marlin $sweep 2>&1 | grep -v "^INFO\|gc.collect" | tail -40
cp $RUNTMP/kbench/bench_w4a16.* "$OUT/" 2>/dev/null

if [ -f "$W/models/build.json" ] && [ "$(left)" -gt 200 ]; then
  say "decode profile"
  timeout 170 python3 scripts/profile_decode.py --golden "$W/models/bf16" --int4 "$W/models/gptq-int4" \
    --gptq-backend quantlab --out $RUNTMP/profile 2>&1 | grep -v -i -e warn -e "^INFO\|gc.collect" | head -12
  cp $RUNTMP/profile/profile_decode.* "$OUT/" 2>/dev/null
fi

say "waiting for Marlin's build"; wait $MARLIN; tail -2 /tmp/marlin_build.log
if [ -f $RUNTMP/kbench/bench_w4a16.json ] && [ "$(left)" -gt 60 ]; then
  timeout 90 python3 scripts/bench_w4a16.py --out $RUNTMP/kbench2 --marlin-into $RUNTMP/kbench/bench_w4a16.json 2>&1 |
    grep -v "^INFO\|gc.collect" | tail -40
  cp $RUNTMP/kbench2/bench_w4a16.* "$OUT/" 2>/dev/null
fi

if [ -f "$W/models/build.json" ] && [ "$(left)" -gt 120 ]; then
  say "Lab 03 settings"
  # shellcheck disable=SC2086
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout -k 10 --signal=INT $(( $(left) - 10 )) \
    python3 scripts/bench_lab03.py --golden "$W/models/bf16" --int4 "$W/models/gptq-int4" --data "$W/gsm8k" \
    --limit 32 --out $RUNTMP/lab03 --settings ${LAB03_SETTINGS:-golden:compiled:16 int4:compiled:16:quantlab} 2>&1 |
    grep -v -i -e warn -e "^ *$" | tail -20
  cp $RUNTMP/lab03/bench_lab03.* "$OUT/" 2>/dev/null
fi
ls -la "$OUT"; say "done"

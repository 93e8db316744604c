#!/usr/bin/env bash
# Lab 03 beyond one GPU, on the lent 2-GPU machine, in one call of the device tool (< 10 minutes):
#   1. a random-weight model of Qwen2.5-7B's shapes (scripts/make_7b_pair.py --bf16-only), batch 16 on 1 then
#      2 GPUs, 64 problems: the wall time per GPU count, each worker under the 24 GiB cap with its peaks;
#   2. the trained fixture in float32, batch 16: 1 GPU against 2 GPUs sample for sample, then batch size 1
#      (batch-invariant: must agree exactly) with its cost;
#   3. a random-weight model of Qwen2.5-14B's shapes (about 29.5 GB in BF16, more than one 24 GiB card) sharded
#      over both cards (lm-eval parallelize=True), each capped at 24 GiB, peaks per card.
# Every run is Lab 03's own code (scripts/multigpu_bench.py -> utils/eval_parallel.py, utils/evaluation.py).
#
# Here, once: bash ../shared/tools/device-wheels.sh (.whl/), and the real GSM8K as xz in .gsm8k/ (see
# scripts/rehearsal_7b.sh). Then: run(kind='nvidia-h100-x2', carry=['.whl', '.gsm8k'],
#   command='bash scripts/multigpu_7b.sh', timeout_s=600)
# Back under $OUT (8 files at most): 7b.md/json, fixture.md/json, 14b.md/json, multigpu.log (builds too) and
# work.tar.gz (each launch's worker logs and status, lm-eval's samples; no weights).
# PARTS="7b fixture 14b" (the default, in that order) picks parts; one is skipped when too little time is left.
set -uo pipefail
T0=$(date +%s)
BUDGET_S=${MULTIGPU_BUDGET_S:-570}
W=/tmp/quantlab-multigpu
OUT=${OUT:-/tmp/out}
PARTS=${PARTS:-7b fixture 14b}
for p in $PARTS; do case "$p" in fixture|7b|14b) ;; *) echo "multigpu_7b.sh: unknown part '$p' (fixture, 7b, 14b)" >&2; exit 2 ;; esac; done
mkdir -p "$OUT" "$W/peaks"
say() { printf '[%s +%4ss] %s\n' "$(date -u +%H:%M:%S)" $(( $(date +%s) - T0 )) "$*" | tee -a "$OUT/multigpu.log"; }
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }

if [ -f .whl/device-install.sh ]; then source .whl/device-install.sh || { say "wheel install failed"; exit 2; }
else say "no .whl/ carried: run ../shared/tools/device-wheels.sh here and carry ['.whl']"; exit 2; fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export QUANTLAB_GPU_MEMORY_GIB=24 QUANTLAB_PEAKS_DIR=$W/peaks PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee -a "$OUT/multigpu.log"
python3 -c 'import torch, transformers, accelerate, lm_eval; print("torch", torch.__version__, "transformers", transformers.__version__, "accelerate", accelerate.__version__, "lm_eval", lm_eval.__version__ if hasattr(lm_eval, "__version__") else "?", "GPUs", torch.cuda.device_count())' | tee -a "$OUT/multigpu.log"

mkdir -p "$W/gsm8k"
if [ -f .gsm8k/test.jsonl.xz ] && [ -f .gsm8k/train.jsonl.xz ]; then
  for f in train test; do python3 -c 'import lzma, sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())' \
    ".gsm8k/$f.jsonl.xz" > "$W/gsm8k/$f.jsonl"; done; say "GSM8K: the real one"
else cp fixtures/tiny-qwen2-gsm/data/*.jsonl "$W/gsm8k/"; say "GSM8K: the fixture's (no .gsm8k/ carried)"; fi

bench() {   # multigpu_bench.py with the time left (minus a margin for the summary)
  local t=$(( $(left) - 20 ))
  if [ "$t" -lt 40 ]; then say "no time left for: $*"; return 124; fi
  say "bench (timeout ${t}s): $*"
  timeout -k 10 --signal=INT "$t" python3 scripts/multigpu_bench.py "$@" --out "$OUT" 2>&1 |
    grep -v -i -e warn -e "it/s\]" -e "s/it\]" >> "$OUT/multigpu.log"
  tail -8 "$OUT/multigpu.log"
}
build() {   # make_7b_pair.py --bf16-only for one shape, into $W/models/<shape>
  local shape=$1
  [ -f "$W/models/$shape/build.json" ] && return 0
  rm -rf "$W/models/$shape"
  timeout -k 10 $(( $(left) - 60 )) python3 scripts/make_7b_pair.py --out "$W/models/$shape" --data "$W/gsm8k" \
    --shape "$shape" --bf16-only >> "$OUT/multigpu.log" 2>&1 || { say "build $shape failed (multigpu.log)"; return 3; }
  say "built $shape: $(du -sh "$W/models/$shape/bf16" | cut -f1)"
}

status=0
for part in $PARTS; do
  case "$part" in
    7b)        # 64 problems: 4 batches of 16 on one GPU, 2 on each of two
      build 7b && bench compare --model "$W/models/7b/bf16" --data "$W/gsm8k" --batch 16 --limit 64 --gpus 2 \
        --name 7b || status=$? ;;
    fixture)   # the trained fixture in float32 (its answers are not near-ties, unlike a random model's)
      bench compare --model fixtures/tiny-qwen2-gsm/bf16 --data fixtures/tiny-qwen2-gsm/data --dtype float32 \
        --batch 16 --limit 64 --invariant-limit 16 --gpus 2 --name fixture || status=$? ;;
    14b)       # memory is the question here: 64 generated tokens show it runs, peaks per card
      rm -rf "$W/models/7b"      # the disk holds one big model at a time
      build 14b && bench shard --model "$W/models/14b/bf16" --data "$W/gsm8k" --batch 16 --limit 16 \
        --max-gen-toks 64 --name 14b || status=$? ;;
  esac
done
tar -czf "$OUT/work.tar.gz" --exclude='*.safetensors' -C "$OUT" $(cd "$OUT" && ls -d *-work 2>/dev/null) 2>/dev/null
rm -rf "$OUT"/*-work
say "done (status $status)"
ls -la "$OUT"
exit $status

#!/usr/bin/env bash
# Lab 03 beyond one GPU on the lent 2-GPU machine, in parts; each call of the device tool (< 10 minutes) runs
# the parts in PARTS and stops itself at MULTIGPU_BUDGET_S (570 s), so a partial result still comes back.
#   7b-full     (the default) a random-weight model of Qwen2.5-7B's shapes (make_7b_pair.py --bf16-only), a
#               short warm-up launch (so both GPU counts find the same warm compile caches), then all 1,319
#               GSM8K problems on 1 GPU and on 2, decode compiled, batch 16, each worker capped at 24 GiB: wall
#               time per count, generation per rank, where each launch's time went, sample for sample
#               (McNemar). When the warm-up's rate says both do not fit, the most problems that do, named in
#               7b-full.md (never called the whole test set).
#   7b-one      7b-full over two calls (one call no longer holds both launches of all 1,319): the warm-up
#   7b-many     and the 1-GPU launch, kept in $W/keep; then, in the next call on the same warm machine, the
#               2-GPU launch of the same problems against it (BASELINE: another saved 1-GPU run; on a machine
#               whose compile caches are empty, a warm-up first, and the md says so)
#   int4-shard  the GPTQ-Int4 twin at Qwen2.5-14B's shapes (INT4_SHAPE=7b: 7B's; --int4-only, no BF16 folder)
#               loaded with shard: true over both cards under the cap (utils.eval_parallel.evaluate with
#               parallelize), 16 problems x 64 tokens: peaks per card, or GPTQModel's / transformers' exact
#               refusal as the finding, with the versions.
#   7b          64 problems, eager decode, 1 then 2 GPUs (the first multi-GPU run's part)
#   fixture     the trained fixture in float32: 1 GPU against 2 sample for sample, and at batch size 1
#   14b         a BF16 model of Qwen2.5-14B's shapes (more than one 24 GiB card) sharded over both cards
# Every run is Lab 03's own code (scripts/multigpu_bench.py -> utils/eval_parallel.py, utils/evaluation.py).
#
# Here, once: bash ../shared/tools/device-wheels.sh (.whl/), and the real GSM8K as xz in .gsm8k/ (see
# scripts/rehearsal_7b.sh). Then, one call each:
#   run(kind='nvidia-h100-x2', carry=['.whl', '.gsm8k'], timeout_s=600, command='bash scripts/multigpu_7b.sh')
#   run(kind='nvidia-h100-x2', carry=['.whl', '.gsm8k'], timeout_s=600,
#       command='PARTS="int4-shard 14b" bash scripts/multigpu_7b.sh')
# Back under $OUT: <part>.md / <part>.json per part (the kept-run format of docs/device-runs: the call, the
# machine, the versions, the command, the tables), multigpu.log (builds too) and work.tar.gz (each launch's
# worker logs and status, lm-eval's samples; no weights).
# A dry run of this script on a CPU: MULTIGPU_BUILD_ARGS="--tiny --device cpu" and
# MULTIGPU_BENCH_ARGS="--device cpu --decode eager --max-length 4096" (added to every build and bench).
set -uo pipefail
T0=$(date +%s)
BUDGET_S=${MULTIGPU_BUDGET_S:-570}
W=/tmp/quantlab-multigpu
OUT=${OUT:-/tmp/out}
call_cmd="bash scripts/multigpu_7b.sh"
[ -n "${MULTIGPU_BUDGET_S:-}" ] && call_cmd="MULTIGPU_BUDGET_S=$MULTIGPU_BUDGET_S $call_cmd"
[ -n "${INT4_SHAPE:-}" ] && call_cmd="INT4_SHAPE=$INT4_SHAPE $call_cmd"
[ -n "${PARTS:-}" ] && call_cmd="PARTS=\"$PARTS\" $call_cmd"
[ -n "${BASELINE:-}" ] && call_cmd="BASELINE=$BASELINE $call_cmd"
# the device-tool call each md names (MULTIGPU_CALL: give it where the call differed)
export MULTIGPU_CALL=${MULTIGPU_CALL:-"run(kind='nvidia-h100-x2', carry=['.whl', '.gsm8k'], timeout_s=600, \
command='$call_cmd')"}
PARTS=${PARTS:-7b-full}
INT4_SHAPE=${INT4_SHAPE:-14b}
for p in $PARTS; do case "$p" in 7b-full|7b-one|7b-many|int4-shard|7b|fixture|14b) ;;
  *) echo "multigpu_7b.sh: unknown part '$p' (7b-full, 7b-one, 7b-many, int4-shard, 7b, fixture, 14b)" >&2; exit 2 ;;
esac; done
case "$INT4_SHAPE" in 7b|14b) ;; *) echo "multigpu_7b.sh: INT4_SHAPE '$INT4_SHAPE': 7b or 14b" >&2; exit 2 ;; esac
mkdir -p "$OUT" "$W/peaks"
say() { printf '[%s +%4ss] %s\n' "$(date -u +%H:%M:%S)" $(( $(date +%s) - T0 )) "$*" | tee -a "$OUT/multigpu.log"; }
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }

if [ -f .whl/device-install.sh ]; then
  # shellcheck disable=SC1091  # carried from the development machine
  source .whl/device-install.sh || { say "wheel install failed"; exit 2; }
else say "no .whl/ carried: run ../shared/tools/device-wheels.sh here and carry ['.whl']"; exit 2; fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export QUANTLAB_GPU_MEMORY_GIB=24 QUANTLAB_PEAKS_DIR=$W/peaks PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
# one compile cache for every launch of the call: the warm-up fills it, both GPU counts read it
export TORCHINDUCTOR_CACHE_DIR=$W/inductor TRITON_CACHE_DIR=$W/triton
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/multigpu.log"
df -h /tmp | tail -1 | tee -a "$OUT/multigpu.log"
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -l 1 > "$W/smi.csv" 2>/dev/null & SMI_PID=$!

mkdir -p "$W/gsm8k"
real=0
if [ -f .gsm8k/test.jsonl.xz ] && [ -f .gsm8k/train.jsonl.xz ]; then
  for f in train test; do python3 -c 'import lzma, sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())' \
    ".gsm8k/$f.jsonl.xz" > "$W/gsm8k/$f.jsonl"; done
  real=1; say "GSM8K: the real one ($(wc -l < "$W/gsm8k/test.jsonl") test problems)"
else cp fixtures/tiny-qwen2-gsm/data/*.jsonl "$W/gsm8k/"; say "GSM8K: the fixture's (no .gsm8k/ carried)"; fi

bench() {   # multigpu_bench.py with the time left (minus a margin for the tar and the summary)
  local t=$(( $(left) - 20 ))
  if [ "$t" -lt 40 ]; then say "no time left for: $*"; return 124; fi
  say "bench (timeout ${t}s): $*"
  # shellcheck disable=SC2086  # MULTIGPU_BENCH_ARGS: words
  timeout -k 10 --signal=INT "$t" python3 scripts/multigpu_bench.py "$@" ${MULTIGPU_BENCH_ARGS:-} --out "$OUT" 2>&1 |
    grep -v -i -e warn -e "it/s\]" -e "s/it\]" >> "$OUT/multigpu.log"
  local rc=${PIPESTATUS[0]}
  tail -12 "$OUT/multigpu.log"
  return "$rc"
}
build() {   # make_7b_pair.py for one model into $W/models/<name>; any other model folder goes first (disk)
  local name=$1; shift
  [ -f "$W/models/$name/build.json" ] && return 0
  find "$W/models" -mindepth 1 -maxdepth 1 ! -name "$name" -exec rm -rf {} + 2>/dev/null
  rm -rf "$W/models/$name"
  local t=$(( $(left) - 60 ))
  if [ "$t" -lt 30 ]; then say "no time left to build $name"; return 124; fi
  # shellcheck disable=SC2086  # MULTIGPU_BUILD_ARGS: words
  timeout -k 10 "$t" python3 scripts/make_7b_pair.py --out "$W/models/$name" --data "$W/gsm8k" "$@" ${MULTIGPU_BUILD_ARGS:-} \
    >> "$OUT/multigpu.log" 2>&1 || { say "build $name failed (multigpu.log)"; return 3; }
  say "built $name: $(du -sh "$W/models/$name" | cut -f1)"
}
need_real() { [ "$real" = 1 ] || { say "part $1 needs the real GSM8K: carry .gsm8k/ (scripts/rehearsal_7b.sh says how)"; return 2; }; }

# the 1-vs-2-GPU comparison at 7B shapes, whole test set (parts 7b-full, 7b-one, 7b-many)
FULL_7B=(full --model "$W/models/7b/bf16" --data "$W/gsm8k" --limit 0 --batch 16 --gpus 2 --decode compiled
         --max-length 2048 --warmup 32)
status=0
for part in $PARTS; do
  case "$part" in
    7b-full)   # the budget the bench plans with leaves room for its comparison, md and this script's tar
      need_real 7b-full && build 7b --shape 7b --bf16-only &&
        bench "${FULL_7B[@]}" --deadline $(( $(date +%s) + $(left) - 35 )) --target-speedup 1.8 --name 7b-full || status=$?
      du -sh "$W/inductor" "$W/triton" 2>/dev/null | tee -a "$OUT/multigpu.log" ;;
    7b-one)
      need_real 7b-one && build 7b --shape 7b --bf16-only &&
        bench "${FULL_7B[@]}" --deadline $(( $(date +%s) + $(left) - 35 )) --one-only --keep "$W/keep" \
          --name 7b-one || status=$?
      cp "$W/keep/7b-one-1gpu.json" "$OUT/" 2>/dev/null ;;
    7b-many)   # the earlier call's 1-GPU run (or BASELINE, a copy of it carried on another machine)
      base=${BASELINE:-$W/keep/7b-one-1gpu.json}
      [ -f "$base" ] || { say "part 7b-many: no $base: run part 7b-one first (or carry its 7b-one-1gpu.json, BASELINE=)"; status=2; continue; }
      need_real 7b-many && build 7b --shape 7b --bf16-only &&
        bench "${FULL_7B[@]}" --deadline $(( $(date +%s) + $(left) - 35 )) --baseline "$base" \
          --target-speedup 1.8 --name 7b-many || status=$? ;;
    int4-shard)   # whether GPTQModel/transformers split a GPTQ checkpoint over the cards: a few problems show it
      need_real int4-shard && build "$INT4_SHAPE-int4" --shape "$INT4_SHAPE" --int4-only &&
        bench shard --model "$W/models/$INT4_SHAPE-int4/gptq-int4" --data "$W/gsm8k" --batch 16 --limit 16 \
          --max-gen-toks 64 --name int4-shard || status=$? ;;
    7b)        # 64 problems: 4 batches of 16 on one GPU, 2 on each of two
      build 7b --shape 7b --bf16-only && bench compare --model "$W/models/7b/bf16" --data "$W/gsm8k" --batch 16 \
        --limit 64 --gpus 2 --name 7b || status=$? ;;
    fixture)   # the trained fixture in float32 (its answers are not near-ties, unlike a random model's)
      bench compare --model fixtures/tiny-qwen2-gsm/bf16 --data fixtures/tiny-qwen2-gsm/data --dtype float32 \
        --batch 16 --limit 64 --invariant-limit 16 --gpus 2 --name fixture || status=$? ;;
    14b)       # memory is the question here: 64 generated tokens show it runs, peaks per card
      build 14b --shape 14b --bf16-only && bench shard --model "$W/models/14b/bf16" --data "$W/gsm8k" --batch 16 \
        --limit 16 --max-gen-toks 64 --name 14b || status=$? ;;
  esac
done
kill "$SMI_PID" 2>/dev/null; wait "$SMI_PID" 2>/dev/null
awk -F', *' 'NF == 2 && $2 + 0 > m[$1] { m[$1] = $2 + 0 }
  END { for (g in m) printf "nvidia-smi peak over the call, GPU %s: %.2f GiB\n", g, m[g] / 1024 }' \
  "$W/smi.csv" | sort | tee -a "$OUT/multigpu.log"
works=$(cd "$OUT" && ls -d ./*-work 2>/dev/null)
# shellcheck disable=SC2086  # one word per work folder
[ -n "$works" ] && tar -czf "$OUT/work.tar.gz" --exclude='*.safetensors' -C "$OUT" $works && rm -rf "$OUT"/*-work
say "done (status $status)"
ls -la "$OUT"
exit $status

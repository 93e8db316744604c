#!/usr/bin/env bash
# The rtx4090 chain rehearsed at Qwen2.5-7B-Instruct's shapes under a 24 GiB cap, on the lent GPU
# (no internet): random-weight BF16 + GPTQ-Int4 pair (scripts/make_7b_pair.py), profile rehearsal-7b.
#
# Here, once:  bash ../shared/tools/device-wheels.sh                  # .whl/ (lm-eval, papermill, ...)
#              mkdir -p .gsm8k && for f in train test; do xz -9 -c ../shared/data/gsm8k/$f.jsonl > .gsm8k/$f.jsonl.xz; done
#              (the real GSM8K, 1.2 MB compressed: what travels must stay under 64 MiB with .whl/'s 35 MB)
# Then, through the device tool, from the repository root (two calls of < 10 minutes each):
#   run(carry=['.whl', '.gsm8k'], command='bash scripts/rehearsal_7b.sh part1', timeout_s=600)   # build, Labs 01-03
#   mkdir -p .rehearsal && cp <part1 files_at>/run.tar.gz .rehearsal/     # here, between the calls
#   run(carry=['.whl', '.gsm8k', '.rehearsal'], command='bash scripts/rehearsal_7b.sh part2', timeout_s=600)  # Labs 04-05
# part2 resumes part1's run (ci.run --resume RUN --from the first lab without results): the one still on a
# warm machine, else the carried .rehearsal/run.tar.gz, and then it rebuilds the pair first (same seed).
#   bash scripts/rehearsal_7b.sh all      # everything in one go (a machine with no 10-minute limit)
#   BENCH_SETTINGS="..." bash scripts/rehearsal_7b.sh bench   # Lab 03's settings side by side (bench/bench_lab03.md)
# Back under $OUT: summary.md / summary.json (per lab: seconds, GPU peaks, host peaks; Lab 03 extrapolated
# to 1,319 problems), run.tar.gz (the run folder, peaks, logs; no weights), chain.log, build.log.
set -uo pipefail
part=${1:?usage: rehearsal_7b.sh part1|part2|all|bench}
case "$part" in part1|part2|all|bench) ;; *) echo "rehearsal_7b.sh: unknown part '$part': part1, part2, all or bench" >&2; exit 2 ;; esac
T0=$(date +%s)
BUDGET_S=${REHEARSAL_BUDGET_S:-565}        # the whole script, inside the tool's 600 s
W=/tmp/quantlab-rehearsal
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" "$W/peaks" "$W/runs" "$W/logs"
say() { printf '[%s +%4ss] %s\n' "$(date -u +%H:%M:%S)" $(( $(date +%s) - T0 )) "$*"; }
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-cache

say "rehearsal $part: setup"
if [ -f .whl/device-install.sh ]; then
  source .whl/device-install.sh || { say "wheel install failed"; exit 2; }
else
  say "no .whl/ carried: run ../shared/tools/device-wheels.sh here and carry ['.whl']"; exit 2
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name(0))'
df -h /tmp | tail -1; free -g | head -2

# GSM8K: the real one when carried (prompt lengths like Qwen's), else the fixture's synthetic problems
if [ ! -f "$W/gsm8k/test.jsonl" ]; then
  mkdir -p "$W/gsm8k"
  if [ -f .gsm8k/test.jsonl.xz ] && [ -f .gsm8k/train.jsonl.xz ]; then   # xz: 1.2 MB instead of 4.9 under the 64 MiB
    for f in train test; do python3 -c 'import lzma, sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())' \
      ".gsm8k/$f.jsonl.xz" > "$W/gsm8k/$f.jsonl"; done; echo real > "$W/gsm8k/SOURCE"
  elif [ -f .gsm8k/test.jsonl ]; then cp .gsm8k/train.jsonl .gsm8k/test.jsonl "$W/gsm8k/"; echo real > "$W/gsm8k/SOURCE"
  else cp fixtures/tiny-qwen2-gsm/data/*.jsonl "$W/gsm8k/"; echo "fixture (synthetic: shorter prompts)" > "$W/gsm8k/SOURCE"
       say "WARNING: no .gsm8k/ carried: the fixture's synthetic GSM8K (prompts ~470 tokens instead of ~700)"; fi
fi
say "GSM8K: $(cat "$W/gsm8k/SOURCE")"

# Monitors: GPU memory (nvidia-smi) and host memory in use, one line a second, for the per-lab peaks
( while sleep 1; do echo "$(date +%s),$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)"
  done >> "$W/logs/smi.csv" 2>/dev/null ) & SMI_PID=$!
( while sleep 1; do awk -v t="$(date +%s)" '/^MemTotal/{m=$2} /^MemAvailable/{a=$2} END{print t "," (m-a)*1024}' \
    /proc/meminfo; done >> "$W/logs/host.csv" ) & HOST_PID=$!
stop_monitors() { kill "$SMI_PID" "$HOST_PID" 2>/dev/null; wait "$SMI_PID" "$HOST_PID" 2>/dev/null; }

if [ ! -f "$W/models/build.json" ]; then
  say "building the 7B-shaped pair (random weights, seed 0) into $W/models"
  rm -rf "$W/models.partial"
  # shellcheck disable=SC2086  # REHEARSAL_BUILD_ARGS="--tiny --device cpu": a dry run of this script on a CPU
  timeout -k 10 "$(left)" python3 scripts/make_7b_pair.py --out "$W/models.partial" --data "$W/gsm8k" \
    ${REHEARSAL_BUILD_ARGS:-} 2>&1 | tee -a "$W/logs/build.log"
  if [ -f "$W/models.partial/build.json" ]; then mv "$W/models.partial" "$W/models"
  else say "build failed (build.log)"; fi
  du -sh "$W"/models*/* 2>/dev/null
else
  say "models already built: $(du -sh "$W/models" | cut -f1)"
fi

chain() {   # ci.run with the time left, its lines timestamped (epoch seconds) for the per-lab windows
  local t=$(( $(left) - 40 ))
  if [ "$t" -lt 30 ]; then say "no time left for the chain"; return 124; fi
  say "chain (timeout ${t}s): $*"
  timeout -k 15 --signal=INT "$t" python3 -m ci.run --runs-dir "$W/runs" "$@" 2>&1 |
    while IFS= read -r line; do printf '%s %s\n' "$(date +%s)" "$line"; done | tee -a "$W/logs/chain.log"
}
prof=${REHEARSAL_PROFILE:-ci/profiles/rehearsal-7b.yaml}   # another profile file: a CPU dry run of this script
status=0
if [ -f "$W/models/build.json" ]; then
  case "$part" in
    part1)
      sed 's/^name: rehearsal-7b$/name: rehearsal-7b\nskip: [04_divergence, 05_kernels]/' "$prof" > "$W/part1.yaml"
      chain --profile "$W/part1.yaml" || status=$? ;;
    part2)
      run1=$(ls -dt "$W"/runs/*-rehearsal-7b 2>/dev/null | head -1)
      if [ -z "$run1" ] && [ -f .rehearsal/run.tar.gz ]; then
        mkdir -p "$W/carried" && tar -xzf .rehearsal/run.tar.gz -C "$W/carried"
        cp -n "$W"/carried/peaks/*.json "$W/peaks/" 2>/dev/null       # part1's peaks and logs, for the summary
        for f in chain.log smi.csv host.csv; do cat "$W/carried/logs/$f" >> "$W/logs/$f" 2>/dev/null; done
        run1=$(ls -dt "$W"/carried/runs/*-rehearsal-7b 2>/dev/null | head -1)
      fi
      if [ -z "$run1" ]; then say "no part1 run here or in .rehearsal/run.tar.gz: running the whole chain"
        chain --profile "$prof" || status=$?
      else
        from=$(python3 - "$run1" <<'EOF'
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
labs = sorted(p.parent.name for p in Path("labs").glob("*/[0-9][0-9]_*.ipynb"))
done = [l for l in labs if (run / l / "results.json").is_file()]
print(next((l for l in labs if l not in done), ""))
EOF
)
        if [ -z "$from" ]; then say "$run1 has every lab already"; else
          say "resuming $run1 from $from"; chain --profile "$prof" --resume "$run1" --from "$from" || status=$?; fi
      fi ;;
    all) chain --profile "$prof" || status=$? ;;
    bench)   # Lab 03's generation settings side by side (scripts/bench_lab03.py), no chain
      say "Lab 03 settings: ${BENCH_SETTINGS:=golden:eager:16 golden:compiled:16 int4:eager:16:gptq_triton int4:compiled:16:gptq_triton}"
      # shellcheck disable=SC2086
      PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout -k 15 --signal=INT $(( $(left) - 30 )) \
        python3 scripts/bench_lab03.py --golden "$W/models/bf16" --int4 "$W/models/gptq-int4" --data "$W/gsm8k" \
        --limit "${BENCH_LIMIT:-32}" --out "$OUT/bench" --settings $BENCH_SETTINGS 2>&1 | tee "$OUT/bench.log" |
        grep -v -i -e warn -e "^ *$" | tail -40 || status=$? ;;
  esac
  if [ "$part" = part2 ] || [ "$part" = all ] && [ "$(left)" -gt 75 ]; then
    say "lm-eval's automatic batch size at 7B under the cap"
    timeout -k 5 $(( $(left) - 45 )) python3 scripts/probe_auto_batch.py "$W/models/bf16" --cap-gib 24 \
      --out "$W/logs/auto_batch.json" 2>&1 | grep -v -e Warning -e warn | tail -8
  fi
else
  status=3
fi
stop_monitors

if [ "$part" != bench ]; then
  say "summary"
  latest=$(ls -dt "$W"/runs/*-rehearsal-7b 2>/dev/null | head -1)
  cp "$W/models/build.json" "$W/logs/build.json" 2>/dev/null
  python3 scripts/rehearsal_summary.py --run "${latest:-$W/runs/none}" --work "$W" --out "$OUT" || say "summary failed"
fi
# the run folder, peaks and logs, without the model weights (those stay under $W/models)
tar -czf "$OUT/run.tar.gz" --exclude='*/captures/*' --exclude='*.safetensors' -C "$W" runs peaks logs gsm8k/SOURCE 2>/dev/null
cp "$W/logs/chain.log" "$W/logs/build.log" "$OUT/" 2>/dev/null
ls -la "$OUT"
say "done (status $status)"
exit $status

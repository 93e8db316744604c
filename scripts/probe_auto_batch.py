"""What lm-eval's batch_size=auto picks for GSM8K generation at a model's size, under a GPU memory cap.

lm-eval's generate_until probes with a (batch, max_length) forward over full logits, five times, halving
from max_batch_size on out-of-memory (lm_eval/models/huggingface.py _detect_batch_size;
EleutherAI/lm-evaluation-harness#3252). With max_length unset that is the model's maximum (32,768 for
Qwen2.5). This loads the model once and asks lm-eval's own probe at each max_length given.

    python scripts/probe_auto_batch.py MODEL_DIR --cap-gib 24 --max-lengths 0 2048 --out auto_batch.json
(0 means unset: the model's maximum)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--cap-gib", type=float, default=24)
    ap.add_argument("--max-lengths", type=int, nargs="+", default=[2048, 0])
    ap.add_argument("--max-batch-size", type=int, default=64)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    from utils import evaluation as ev
    from utils.gpu_cap import apply_cap

    cap = apply_cap(args.cap_gib)
    print("cap:", cap["reason"], flush=True)
    t0 = time.perf_counter()
    lm = ev.load_lm(str(args.model), device=args.device, batch_size="auto", max_batch_size=args.max_batch_size)
    probes = []
    for ml in args.max_lengths:
        lm._max_length = ml or None                       # lm-eval's own attribute behind its max_length
        t0 = time.perf_counter()
        bs = lm._detect_batch_size()
        probes.append({"max_length": lm.max_length, "batch_size": bs, "seconds": round(time.perf_counter() - t0, 1)})
        print(f"max_length {lm.max_length}: batch_size auto -> {bs}", flush=True)
        args.out.write_text(json.dumps({"model": str(args.model), "cap": cap, "max_batch_size": args.max_batch_size,
                                        "probes": probes}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Measure a model's GSM8K accuracy over a local data folder with lm-eval's own gsm8k task.

    python scripts/fixture_accuracy.py --model fixtures/tiny-qwen2-gsm/bf16 \\
        --data fixtures/tiny-qwen2-gsm/data --limit 500 --device cuda

The data folder holds train.jsonl (few-shot examples) and test.jsonl (the problems) in the
openai/gsm8k layout. Prints strict-match and flexible-extract accuracy +- stderr, and throughput;
lm-eval's own aggregated results and per-sample log go under --output (a temporary folder if unset).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from utils import evaluation as ev  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a local checkpoint folder (BF16 or GPTQ)")
    ap.add_argument("--data", required=True, help="folder with train.jsonl and test.jsonl")
    ap.add_argument("--limit", type=int, default=None, help="first N test problems (default: all)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    ap.add_argument("--backend", default="hf", choices=ev.BACKENDS)
    ap.add_argument("--batch-size", default="auto", help="an integer or auto")
    ap.add_argument("--num-fewshot", type=int, default=5)
    ap.add_argument("--max-gen-toks", type=int, default=256)
    ap.add_argument("--dtype", default="auto", help="auto (float32 CPU / bfloat16 GPU; GPTQ: bf16 / fp16)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--output", default=None, help="folder for lm-eval's outputs and summary.json")
    args = ap.parse_args(argv)

    batch = args.batch_size if str(args.batch_size).startswith("auto") else int(args.batch_size)
    out = Path(args.output) if args.output else Path(tempfile.mkdtemp(prefix="fixture_accuracy_"))
    try:
        files = ev.data_files_from_folder(args.data, param="--data")
        run = ev.run_gsm8k(args.model, out, label=Path(args.model).name, data_files=files, backend=args.backend,
                           device=args.device, batch_size=batch, num_fewshot=args.num_fewshot, limit=args.limit,
                           seed=args.seed, max_gen_toks=args.max_gen_toks, dtype=args.dtype, param="--model")
    except ev.EvalInputError as exc:
        print(f"fixture_accuracy: {exc}", file=sys.stderr)
        return 2
    print(f"\nmodel {args.model}  data {args.data}  n={run['n']}  device {args.device}  "
          f"dtype {run['settings']['dtype']}  lm-eval {run['settings']['lm_eval_version']}")
    for f in ev.FILTERS:
        a = run["accuracy"][f]
        print(f"  {f:17s} {100 * a['acc']:6.2f} % +- {100 * a['stderr']:.2f}")
    tp = run["throughput"]
    print(f"  throughput        {tp['problems_per_s']:.2f} problems/s, {tp['tokens_per_s']:.1f} generated tokens/s "
          f"({tp['generated_tokens']} tokens in {tp['seconds']:.1f} s)")
    summary = {k: v for k, v in run.items() if k != "problems"}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(f"  lm-eval outputs   {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

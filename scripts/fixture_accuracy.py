"""Measure a model's GSM8K accuracy over a local data folder with lm-eval's own gsm8k task.

    python scripts/fixture_accuracy.py --model fixtures/tiny-qwen2-gsm/bf16 \\
        --data fixtures/tiny-qwen2-gsm/data --limit 500 --device cuda

The data folder holds train.jsonl (few-shot examples) and test.jsonl (the problems) in the
openai/gsm8k layout. With --record golden|int4 (that fixture model, its data, all problems) the result
goes into fixtures/tiny-qwen2-gsm/accuracy.json, the one place the fixture's accuracy is quoted from,
and docs/fixture.md's table is rendered from it. Prints strict-match and flexible-extract accuracy +- stderr, and throughput;
lm-eval's own aggregated results and per-sample log go under --output (a temporary folder if unset).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from utils import evaluation as ev  # noqa: E402
from utils.eval_settings import EvalSettings  # noqa: E402
from utils import fixture  # noqa: E402

DOCS = Path(__file__).resolve().parents[1] / "docs" / "fixture.md"
TABLE_START, TABLE_END = "<!-- accuracy table: rendered from accuracy.json -->", "<!-- end of accuracy table -->"


def docs_with_table(text: str, table: str) -> str:
    """docs/fixture.md with its accuracy table replaced by `table`."""
    if TABLE_START not in text or TABLE_END not in text:
        raise ValueError(f"{DOCS} lacks the markers {TABLE_START} ... {TABLE_END}")
    head, rest = text.split(TABLE_START, 1)
    return f"{head}{TABLE_START}\n{table}{TABLE_END}{rest.split(TABLE_END, 1)[1]}"


def _check_record_args(args) -> str | None:
    """Why --record cannot keep this run, or None."""
    paths = fixture.fixture_paths()
    if Path(args.model).resolve() != paths[args.record].resolve():
        return f"--record {args.record}: --model must be {paths[args.record]}, got {args.model}"
    if Path(args.data).resolve() != paths["test"].parent.resolve():
        return f"--record: --data must be the fixture's {paths['test'].parent}, got {args.data}"
    if args.limit is not None:
        return "--record: only a run over every held-out problem is recorded; drop --limit"
    if not args.machine:
        return "--record: say which machine measured it, e.g. --machine '2-core CPU'"
    return None


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
    ap.add_argument("--record", choices=fixture.MODELS, default=None,
                    help="keep the result as this fixture model's accuracy (fixtures/tiny-qwen2-gsm/accuracy.json)")
    ap.add_argument("--machine", default=None, help="with --record: the machine that measured it, in words")
    args = ap.parse_args(argv)
    if args.record and (why := _check_record_args(args)):
        print(f"fixture_accuracy: {why}", file=sys.stderr)
        return 2

    batch = args.batch_size if str(args.batch_size).startswith("auto") else int(args.batch_size)
    out = Path(args.output) if args.output else Path(tempfile.mkdtemp(prefix="fixture_accuracy_"))
    try:
        files = ev.data_files_from_folder(args.data, param="--data")
        settings = EvalSettings.from_params(backend=args.backend, device=args.device, batch_size=batch,
                                            num_fewshot=args.num_fewshot, limit=args.limit, seed=args.seed,
                                            max_gen_toks=args.max_gen_toks, dtype=args.dtype, param="--model")
        run = ev.run_gsm8k(args.model, out, label=Path(args.model).name, data_files=files, settings=settings)
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
    if args.record:
        command = shlex.join(["scripts/fixture_accuracy.py", *(argv if argv is not None else sys.argv[1:])])
        print(f"  recorded in       {fixture.record_accuracy(args.record, run, command, args.machine)}")
        try:
            table = fixture.accuracy_markdown(fixture.read_accuracy())
        except ValueError as exc:
            print(f"  docs table left as it is: {exc}")
        else:
            DOCS.write_text(docs_with_table(DOCS.read_text(), table))
            print(f"  table rendered in {DOCS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

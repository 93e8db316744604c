"""Lab 03 beyond one GPU, measured: lm-eval's data parallelism on 1 and N GPUs sample for sample, and one
model sharded over the cards under the profile's memory cap. Every run is Lab 03's own code path
(utils.eval_parallel: accelerate launch workers; utils.evaluation: lm-eval's gsm8k task).

    python scripts/multigpu_bench.py compare --model M --data D --limit 256 --batch 16 --gpus 2 \\
        --invariant-limit 64 --name fixture --out OUT       # 1 vs N GPUs at batch 16, and at batch 1
    python scripts/multigpu_bench.py shard --model M14 --data D --limit 16 --batch 16 --name 14b --out OUT

Writes OUT/<name>.md and OUT/<name>.json (refused if either exists: an earlier run is never overwritten).
Both GPU counts are launched the same way (worker processes), so their wall times compare.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from utils import eval_parallel as ep  # noqa: E402
from utils import evaluation as ev  # noqa: E402
from utils.eval_settings import EvalSettings  # noqa: E402
from utils.results import atomic_write_json, atomic_write_text  # noqa: E402


def _machine() -> str:
    import torch

    if not torch.cuda.is_available():
        return f"CPU, torch {torch.__version__}"
    names = {torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())}
    return f"{torch.cuda.device_count()} x {', '.join(sorted(names))}, torch {torch.__version__}"


def _table(rows: list[dict]) -> str:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join("" if r.get(k) is None else str(r.get(k)) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def _peaks(run: dict) -> list[dict]:
    return [{"rank": w["rank"], "device": w["device"], "cap": (w.get("cap") or {}).get("reason"),
             "gpu_peak_allocated_gib": w.get("gpu_peak_allocated_gib"),
             "gpu_peak_reserved_gib": w.get("gpu_peak_reserved_gib"), "host_peak_rss_gib": w.get("host_peak_rss_gib")}
            for w in (run.get("parallel") or {}).get("workers", [])]


def compare(args, data: dict, settings: EvalSettings) -> tuple[list[dict], dict]:
    rows, detail = [], {}
    for bs, limit in ((args.batch, args.limit), (1, args.invariant_limit)):
        if not limit:
            continue
        s = settings.replace(batch_size=bs, limit=limit)
        one = ep.run_gsm8k_parallel(args.model, args.work, label=f"{args.name}-bs{bs}-1gpu", gpus=1,
                                    data_files=data, settings=s)
        many = ep.run_gsm8k_parallel(args.model, args.work, label=f"{args.name}-bs{bs}-{args.gpus}gpu",
                                     gpus=args.gpus, data_files=data, settings=s)
        r1, rn = ep.row(f"batch {bs}, 1 GPU", one), ep.row(f"batch {bs}, {args.gpus} GPUs", many, one)
        for r, run in ((r1, one), (rn, many)):
            r["problems/s (generation)"] = round(run["throughput"]["problems_per_s"] or 0, 3)
        rn["wall speed-up"] = round(r1["wall s"] / rn["wall s"], 2)
        rn["generation speed-up"] = round(r1["generation s"] / rn["generation s"], 2)
        rows += [r1, rn]
        detail[f"batch {bs}"] = {"compare": ep.compare(one, many), "peaks_1gpu": _peaks(one),
                                 f"peaks_{args.gpus}gpu": _peaks(many)}
    return rows, detail


def shard(args, data: dict, settings: EvalSettings) -> tuple[list[dict], dict]:
    import torch

    from utils import gpu_cap

    cap = gpu_cap.apply_cap()                    # this process holds the model: the profile's cap on every card
    torch.cuda.reset_peak_memory_stats()
    t0 = time.monotonic()
    run = ep.evaluate("sharded", args.model, args.work, data_files=data,
                      settings=settings.replace(parallelize=True, batch_size=args.batch, limit=args.limit))
    wall = time.monotonic() - t0
    pk = gpu_cap.peaks()
    row = {"setting": f"shard over {torch.cuda.device_count()} GPUs", "batch": args.batch, "n": run["n"],
           "wall s": round(wall, 1), "generation s": round(run["throughput"]["seconds"], 1),
           "cap": cap.get("reason"),
           **{f"GPU {i} peak allocated GiB": round(v, 2)
              for i, v in enumerate(pk.get("gpu_peak_allocated_gib_per_card") or [pk["gpu_peak_allocated_gib"]])},
           "host peak RSS GiB": round(pk["host_peak_rss_gib"], 2)}
    return [row], {"peaks": pk, "cap": cap, "settings": run["settings"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("compare", "shard"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True, help="GSM8K folder: train.jsonl and test.jsonl")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--limit", type=int, required=True)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--invariant-limit", type=int, default=0, help="problems re-run at batch size 1 (0: none)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--decode", default="eager", choices=("eager", "compiled"))
    ap.add_argument("--max-gen-toks", type=int, default=256)
    ap.add_argument("--max-length", type=int, default=2048)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    md, js = args.out / f"{args.name}.md", args.out / f"{args.name}.json"
    for f in (md, js):
        if f.exists():
            raise SystemExit(f"--out: {f} exists already; give another --name or --out (nothing is overwritten)")
    args.work = args.out / f"{args.name}-work"
    data = ev.data_files_from_folder(args.data, param="--data")
    settings = EvalSettings.from_params(dtype=args.dtype, decode=args.decode, max_gen_toks=args.max_gen_toks,
                                        max_length=args.max_length, device=args.device, param="--model")
    rows, detail = (compare if args.mode == "compare" else shard)(args, data, settings)
    command = "python scripts/multigpu_bench.py " + " ".join(sys.argv[1:] if argv is None else argv)
    head = (f"# Lab 03 beyond one GPU: {args.mode}, {args.name}\n\nMachine: {_machine()}; "
            f"GPU memory cap {os.environ.get('QUANTLAB_GPU_MEMORY_GIB', 'none')} GiB per process. "
            f"Model {args.model}, dtype {args.dtype}, decode {args.decode}, max_gen_toks {args.max_gen_toks}.\n"
            f"Command: `{command}`\n\n")
    atomic_write_json(js, {"command": command, "machine": _machine(), "rows": rows, "detail": detail})
    atomic_write_text(md, head + _table(rows) + "\n")
    print(head + _table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Lab 03's generation settings, measured: lm-eval's own gsm8k task on a subset, each setting in turn.

    python scripts/bench_lab03.py --golden DIR --int4 DIR --data GSM8K_DIR --limit 32 --out OUT \
        --settings golden:eager:16 golden:compiled:16 int4:eager:16:gptq_triton int4:compiled:16:gptq_triton

A setting is model:decode:batch[:gptq_kernel] (utils.decode: eager | compiled). Each one runs through
utils.evaluation.run_gsm8k (the lab's own call) under the GPU memory cap, and is compared with the first
setting of the same model (the baseline): are the generations and the per-sample scores identical?
The time for all 1,319 problems is an EXTRAPOLATION from the measured calls (utils.decode.extrapolate_seconds).
Writes bench_lab03.json and bench_lab03.md into --out after every setting (a run cut short keeps its rows).
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GSM8K_TEST = 1319


def parse_setting(text: str) -> dict:
    from utils.decode import DECODES

    parts = text.split(":")
    if len(parts) not in (3, 4) or parts[0] not in ("golden", "int4") or not parts[2].isdigit() or parts[2] == "0":
        raise SystemExit(f"--settings: {text!r} is not model:decode:batch[:gptq_kernel] "
                         f"(model golden or int4, batch a positive integer)")
    if parts[1] not in DECODES:
        raise SystemExit(f"--settings: {text!r}: decode {parts[1]!r} is not one of {list(DECODES)}")
    return {"name": text, "model": parts[0], "decode": parts[1], "batch": int(parts[2]),
            "gptq_backend": parts[3] if len(parts) == 4 else "auto"}


def compare(base: dict, run: dict) -> dict:
    b, r = {p["doc_id"]: p for p in base["problems"]}, {p["doc_id"]: p for p in run["problems"]}
    common = sorted(set(b) & set(r))
    same_text = sum(b[i]["generation"] == r[i]["generation"] for i in common)
    same_score = sum(all(b[i][f] == r[i][f] for f in ("strict-match", "flexible-extract")) for i in common)
    return {"compared": len(common), "identical_generations": same_text, "identical_scores": same_score}


def markdown(rows: list[dict], meta: dict) -> str:
    head = ("| setting | GPTQ kernel | batch | status | seconds | problems/s | tokens/s | first call s | steady ms/step "
            "| peak reserved GiB | 1,319 problems, min (extrapolated) | identical generations | identical scores |")
    out = [f"# Lab 03 generation settings on {meta['device']} (GPU memory cap {meta['cap_gib']} GiB)", "",
           f"lm-eval gsm8k, {meta['limit']} problems, max_gen_toks {meta['max_gen_toks']}, max_length "
           f"{meta['max_length']}; torch {meta['torch']}, transformers {meta['transformers']}. Command: `{meta['command']}`.",
           "The 1,319-problem times are EXTRAPOLATED from the measured calls (utils.decode.extrapolate_seconds).",
           "", head, "|" + "---|" * 13]
    for r in rows:
        d, c = r.get("decode_run") or {}, r.get("vs_baseline") or {}
        f = lambda v, p=1: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
        out.append(f"| {r['name']} | {r.get('gptq_kernels') or '-'} | {r['batch']} | {r['status']} | {f(r.get('seconds'))} "
                   f"| {f(r.get('problems_per_s'), 2)} | {f(r.get('tokens_per_s'))} | {f(d.get('first_call_s'))} "
                   f"| {f(d.get('steady_ms_per_step'))} | {f(r.get('peak_reserved_gib'), 2)} "
                   f"| {f(None if r.get('extrapolated_s') is None else r['extrapolated_s'] / 60)} "
                   f"| {c.get('identical_generations', '-')}/{c.get('compared', '-')} "
                   f"| {c.get('identical_scores', '-')}/{c.get('compared', '-')} |")
    errors = [r for r in rows if r["status"] != "ok"]
    out += [""] + [f"- {r['name']}: {r['error']}" for r in errors]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--golden", type=Path, required=True)
    ap.add_argument("--int4", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True, help="folder with train.jsonl and test.jsonl")
    ap.add_argument("--settings", nargs="+", required=True, type=parse_setting)
    ap.add_argument("--limit", type=int, default=32)
    ap.add_argument("--max-gen-toks", type=int, default=256)
    ap.add_argument("--max-length", type=int, default=2048)
    ap.add_argument("--cap-gib", type=float, default=24)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    import torch
    import transformers

    from utils import evaluation as ev
    from utils.decode import extrapolate_seconds
    from utils.eval_settings import EvalSettings
    from utils.gpu_cap import apply_cap
    from utils.results import atomic_write_text

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no GPU on this machine; run this on the GPU machine, "
                         "or pass --device cpu (decode eager only)")
    earlier = [p.name for p in (args.out / "bench_lab03.json", args.out / "bench_lab03.md", args.out / "runs")
               if p.exists()]
    if earlier:
        raise SystemExit(f"--out: {args.out} already holds an earlier run ({', '.join(earlier)}); "
                         f"pass a new folder, nothing was overwritten")
    cap = apply_cap(args.cap_gib) if args.device == "cuda" else {"reason": "cpu: no cap"}
    print("cap:", cap["reason"], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"cap_gib": args.cap_gib, "limit": args.limit, "max_gen_toks": args.max_gen_toks,
            "max_length": args.max_length, "torch": torch.__version__, "transformers": transformers.__version__,
            "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
            "command": "python scripts/bench_lab03.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    data = ev.data_files_from_folder(args.data, param="--data")
    rows, baselines = [], {}
    for s in args.settings:
        row = {**s, "status": "ok"}
        rows.append(row)
        print(f"== {s['name']}", flush=True)
        if args.device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        try:
            r = ev.run_gsm8k(str(getattr(args, s["model"])), args.out / "runs" / s["name"].replace(":", "_"),
                             label=s["model"], data_files=data, settings=EvalSettings.from_params(
                                 device=args.device, batch_size=s["batch"], limit=args.limit,
                                 max_gen_toks=args.max_gen_toks, max_length=args.max_length,
                                 gptq_backend=s["gptq_backend"], decode=s["decode"], param=s["name"]))
        except Exception as exc:  # noqa: BLE001 - a setting that fails (out of memory, no compile) is a finding
            row.update(status="failed", error=f"{type(exc).__name__}: {str(exc)[:400]}")
            traceback.print_exc()
        else:
            tp, st = r["throughput"], r["settings"]
            row.update(seconds=tp["seconds"], problems_per_s=tp["problems_per_s"], tokens_per_s=tp["tokens_per_s"],
                       decode_run=st["decode"], gptq_kernels=", ".join(st.get("gptq_kernels") or []) or None,
                       accuracy=r["accuracy"], prompt_tokens=st["prompt_tokens"],
                       extrapolated_s=extrapolate_seconds(st["decode"], s["batch"], args.max_gen_toks, GSM8K_TEST))
            base = baselines.setdefault(s["model"], r)
            row["baseline"] = next(x["name"] for x in rows if x["model"] == s["model"] and x["status"] == "ok")
            row["vs_baseline"] = compare(base, r)
        row["wall_s"] = time.perf_counter() - t0
        if args.device == "cuda":
            row["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
            row["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        r = None
        gc.collect()
        torch._dynamo.reset()             # the next setting compiles its own model, not against stale guards
        atomic_write_text(args.out / "bench_lab03.json", json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
        atomic_write_text(args.out / "bench_lab03.md", markdown(rows, meta))
        print(markdown(rows, meta), flush=True)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

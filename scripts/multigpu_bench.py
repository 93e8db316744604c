"""Lab 03 beyond one GPU, measured: lm-eval's data parallelism on 1 and N GPUs sample for sample, and one
model sharded over the cards under the profile's memory cap. Every run is Lab 03's own code path
(utils.eval_parallel: accelerate launch workers; utils.evaluation: lm-eval's gsm8k task).

    python scripts/multigpu_bench.py full --model M --data D --limit 0 --batch 16 --gpus 2 --decode compiled \\
        --max-length 2048 --warmup 32 --budget-s 450 --name 7b-full --out OUT   # every problem, 1 and N GPUs
    python scripts/multigpu_bench.py compare --model M --data D --limit 256 --batch 16 --gpus 2 \\
        --invariant-limit 64 --name fixture --out OUT       # 1 vs N GPUs at batch 16, and at batch 1
    python scripts/multigpu_bench.py shard --model M14 --data D --limit 16 --batch 16 --name 14b --out OUT

`full` first runs a short warm-up launch (so both measured launches find the same warm compile caches), then
all problems (--limit 0) on 1 and on N GPUs if the warm-up's rate says both fit --budget-s, else the most
that do (a multiple of batch x N), and its md says which. Writes OUT/<name>.md and OUT/<name>.json (refused
if either exists: an earlier run is never overwritten) in the format of docs/device-runs; a part that
fails writes them too, with the error. Both GPU counts are launched the same way, so their wall times compare.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import multigpu_md as md  # noqa: E402
from utils import eval_parallel as ep  # noqa: E402
from utils import evaluation as ev  # noqa: E402
from utils.eval_settings import EvalSettings  # noqa: E402
from utils.gsm_synth import read_gsm8k  # noqa: E402
from utils.results import atomic_write_json, atomic_write_text  # noqa: E402

MARGIN_S = 10               # kept free after the last launch: comparison, md, json
WARM_COMPILE_FRACTION = 0.5  # planning: a compile from warm caches costs at most this share of the cold one
CALL_SAFETY = 1.1           # planning: the warm-up's prefill is spread over its longer calls' steps
OVERRUN_S = 8               # a launch may run this far past --budget-s before it is stopped (md still written)
PHASES = ("start: launch to the worker's own code (interpreter, accelerate's launcher, imports); init: process "
          "group and GPU cap; load: model and tokenizer; first call: the first generate call (prefill, and a "
          "compiled decode's trace, compile and CUDA-graph capture); lm-eval: its task, prompts, scoring, "
          "gathering and files; exit: worker done to launcher gone. They add up to the launch's wall time.")


def _peaks(run: dict) -> list[dict]:
    return [{"rank": w["rank"], "device": w["device"], "cap": (w.get("cap") or {}).get("reason"),
             "gpu_peak_allocated_gib": w.get("gpu_peak_allocated_gib"),
             "gpu_peak_reserved_gib": w.get("gpu_peak_reserved_gib"), "host_peak_rss_gib": w.get("host_peak_rss_gib")}
            for w in (run.get("parallel") or {}).get("workers", [])]


def plan_limit(warm: dict, *, target: int, gpus: int, batch: int, max_gen_toks: int, seconds: float,
               counts: tuple[int, ...] | None = None) -> dict:
    """The most problems (target at most) whose 1-GPU and `gpus`-GPU launches both fit `seconds`, predicted from
    the generate calls of a warm-up launch's rank 0 (full batches, then a smaller one): its fixed cost (wall
    minus generation: start, load, lm-eval, exit); a steady full call (its seconds per step x max_gen_toks, a
    call that runs to max_gen_toks as a random model's does; CALL_SAFETY more); the first call's compile, from
    warm caches (WARM_COMPILE_FRACTION of the warm-up's); and, for a launch whose last batch is smaller, what the
    warm-up's smaller last call cost beyond a full one (a new shape compiles again, cold: no launch has the same
    one; without such a call, none where the recorder pads a smaller batch, else the whole cold compile).
    Below the target the limit is a multiple of batch x gpus (no smaller last batch). counts: the GPU counts
    launched in `seconds` (default 1 and gpus; a call that runs only the 1-GPU launch plans for it alone)."""
    w = warm["parallel"]["workers"][0]
    dec = w.get("decode") or {}
    calls = dec.get("per_call") or []
    fixed = warm["parallel"]["wall_seconds"] - w["throughput"]["seconds"]
    per_step = [c["seconds"] / c["steps"] for c in calls[1:] if c.get("batch") == batch and c.get("steps")]
    if per_step and calls:
        step = statistics.median(per_step)
        call = step * max_gen_toks

        def beyond(c: dict) -> float:           # what a call cost beyond its steps at the steady rate
            return max(c["seconds"] - step * (c.get("steps") or max_gen_toks), 0)
        cold = beyond(calls[0])
        compile_s = WARM_COMPILE_FRACTION * cold
        if warm["n"] % batch and len(calls) > 2:          # measured: padded to a full call, or compiled again
            last_s = beyond(calls[-1])
        else:
            last_s = 0.0 if dec.get("pads_smaller_batches") else cold
    else:                       # one call only: it is the rate (compile included), nothing added
        call = calls[0]["seconds"] if calls else w["throughput"]["seconds"]
        compile_s = last_s = 0.0
    call *= CALL_SAFETY

    def launch(n: int, g: int) -> float:
        share = math.ceil(n / g)
        return fixed + compile_s + math.ceil(share / batch) * call + (last_s if share % batch else 0)

    def every(n: int) -> float:             # the launches this call makes, one after the other
        return sum(launch(n, g) for g in (counts or (1, gpus)))

    out = {"seconds": seconds, "fixed_s": fixed, "call_s": call, "warm_compile_s": compile_s,
           "smaller_last_batch_s": last_s, "target": target}
    rounds = batch * gpus
    for n in [target] + list(range(target // rounds * rounds, 0, -rounds)):
        if every(n) <= seconds:
            why = "" if n == target else (f"{target:,} would take about {every(target):.0f} s: {launch(target, 1):.0f} "
                                          f"on 1 GPU and {launch(target, gpus):.0f} on {gpus}")
            return {**out, "limit": n, "predicted_s": {1: launch(n, 1), gpus: launch(n, gpus)}, "why": why}
    return {**out, "limit": None, "predicted_s": {}, "why": f"even {rounds} problems on 1 and {gpus} GPUs would take "
            f"about {every(rounds):.0f} s, more than the {seconds:.0f} s left"}


def longest_prompt(model: str, data: dict, n: int, settings: EvalSettings, work: Path) -> int:
    """Tokens of the longest of the first n prompts, as lm-eval builds them (its task, few-shot count and seed)
    and the model's tokenizer counts them."""
    from lm_eval.tasks import get_task_dict

    from utils.models import load_tokenizer

    folder = ev.write_local_task(data, Path(work) / "prompts" / "task").parent
    task = get_task_dict([ev.LOCAL_TASK], ev.task_manager(folder))[ev.LOCAL_TASK]
    task.set_config(key="num_fewshot", value=settings.num_fewshot)
    task.set_fewshot_seed(seed=settings.seed)
    task.build_all_requests(limit=n, rank=0, world_size=1)
    tok = load_tokenizer(model)
    return max(len(tok.encode(inst.args[0], add_special_tokens=False)) for inst in task.instances)


def warmup_settings(s: EvalSettings, n: int, longest: int) -> EvalSettings:
    """The warm-up's settings: n problems and, for a compiled decode, as many new tokens as fill max_length
    after its longest prompt. Why: the static cache is as long as a launch's first call needs (utils.decode),
    and a measured launch's first call holds the test set's longest prompts; so the warm-up compiles the
    step for a max_length cache, the shape both measured launches replay, not a shorter one of its own."""
    if s.decode != "compiled" or s.max_length is None or s.max_length - longest <= s.max_gen_toks:
        return s.replace(limit=n)
    return s.replace(limit=n, max_gen_toks=s.max_length - longest)


def _launch_summary(run: dict) -> dict:
    w = run["parallel"]["workers"][0]
    return {"gpus": run["parallel"]["gpus"], "n": run["n"], "wall_s": run["parallel"]["wall_seconds"],
            "first_call_s": (w.get("decode") or {}).get("first_call_s")}


def full(args, data: dict, settings: EvalSettings) -> tuple[list[dict], dict]:
    """Warm-up, plan, then the same problems on 1 and on N GPUs, each launched the same way so that their wall
    times compare; a launch that fails or runs out of time is recorded, and no speed-up is claimed without both.
    Over two device calls (each < 10 minutes): --one-only runs the warm-up and the 1-GPU launch and --keep
    saves it; the next call's --baseline reads it back and runs the N-GPU launch on the same problems (a
    warm-up first only where this machine's compile caches are empty: not the machine of the first call)."""
    left = args.budget_s if args.deadline is None else args.deadline - time.time()
    deadline = time.monotonic() + left
    total = len(read_gsm8k(data["test"]))
    target = total if args.limit == 0 else min(args.limit, total)
    s = settings.replace(batch_size=args.batch)
    detail = {"total": total, "target": target, "gpus": args.gpus, "decode": s.decode, "ran": None, "failed": {},
              "tables": {}, "one_only": args.one_only}
    runs, phases, plan = {}, [], None
    if args.baseline:
        runs[1] = args.baseline_run
        detail["baseline"] = {"path": str(args.baseline), "launched_at": runs[1]["parallel"]["launched_at"]}
        target = detail["target"] = runs[1]["n"]
    cache = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or "/nonexistent")
    if not args.baseline or not any(cache.glob("*")):
        # the warm-up runs on every GPU the measured launches use: the compile caches serve the device they were
        # made on, so a warm-up on GPU 0 alone leaves the other ranks compiling cold; each rank gets args.warmup
        # problems, so rank 0 (what plan_limit reads) makes the calls it plans from
        n = args.warmup * args.gpus
        ws = warmup_settings(s, n, longest_prompt(args.model, data, n, s, args.work))
        warm = ep.run_gsm8k_parallel(args.model, args.work, label=f"{args.name}-warmup", gpus=args.gpus,
                                     data_files=data, settings=ws, timeout_s=deadline - time.monotonic())
        detail["warmup"] = {**_launch_summary(warm), "max_gen_toks": ws.max_gen_toks,
                            "cache_len": (warm["settings"]["decode"] or {}).get("cache_len")}
        phases = md.launch_rows(f"warm-up, {args.gpus} GPUs", warm, ep.worker_phases)
        counts = (args.gpus,) if args.baseline else (1,) if args.one_only else (1, args.gpus)
        plan = plan_limit(warm, target=target, gpus=args.gpus, batch=args.batch, max_gen_toks=args.max_gen_toks,
                          seconds=deadline - time.monotonic() - MARGIN_S, counts=counts)
        if args.baseline and plan["limit"] != target:
            plan.update(limit=None, why=f"the {args.gpus}-GPU launch of the baseline's {target:,} problems would not "
                        f"fit the time left ({plan['why'] or plan['limit']})")
        detail["plan"] = plan
        print(f"plan: {plan}", flush=True)
    if args.baseline:
        phases += md.launch_rows("1 GPU (the earlier call)", runs[1], ep.worker_phases)
    limit = target if plan is None else plan["limit"]
    if limit is not None:
        for g in [g for g in (1, args.gpus) if g not in runs and not (args.one_only and g > 1)]:
            try:
                runs[g] = ep.run_gsm8k_parallel(args.model, args.work, label=f"{args.name}-{g}gpu", gpus=g,
                                                data_files=data, settings=s.replace(limit=limit),
                                                timeout_s=max(deadline - time.monotonic() + OVERRUN_S, 1))
            except ep.WorkerError as exc:
                detail["failed"][g] = str(exc)
                break
            phases += md.launch_rows(f"{g} GPU{'s' if g > 1 else ''}", runs[g], ep.worker_phases)
            if args.keep:
                atomic_write_json(args.keep / f"{args.name}-{g}gpu.json", runs[g])
    rows = []
    for g, run in runs.items():
        rows.append({"GPUs": g, "problems": run["n"], "wall s": round(run["parallel"]["wall_seconds"], 1),
                     "generation s, per rank": md.per_rank(run, lambda w: w["throughput"]["seconds"]),
                     "first call s, per rank": md.per_rank(run, lambda w: (w.get("decode") or {}).get("first_call_s")),
                     "peak allocated GiB, per rank": md.per_rank(run, lambda w: w.get("gpu_peak_allocated_gib"), 2),
                     "peak reserved GiB, per rank": md.per_rank(run, lambda w: w.get("gpu_peak_reserved_gib"), 2)})
    if len(runs) == 2:
        one, many = runs[1], runs[args.gpus]
        detail["ran"] = one["n"]
        detail["speedup_wall"] = one["parallel"]["wall_seconds"] / many["parallel"]["wall_seconds"]
        detail["speedup_generation"] = one["throughput"]["seconds"] / many["throughput"]["seconds"]
        rows[1].update({"speed-up, wall": round(detail["speedup_wall"], 2),
                        "speed-up, generation": round(detail["speedup_generation"], 2)})
        c = ep.compare(one, many)
        detail["compare"] = c
        detail["tables"][f"Sample for sample: 1 GPU against {args.gpus} (Lab 03's own comparison)"] = [{
            "problems": c["n"], "differing generations": c["differing_generations"],
            "differing scores, strict-match": c["differing_scores_strict-match"],
            "differing scores, flexible-extract": c["differing_scores_flexible-extract"],
            "strict-match %, 1 GPU": round(100 * c["acc_one"], 2), f"strict-match %, {args.gpus} GPUs":
            round(100 * c["acc_many"], 2), "McNemar p": round(c["mcnemar_p"], 4),
            "first differing": c["first_differing"]}]
    elif plan is not None and plan["limit"] is None:
        detail["error"] = plan["why"]
    detail["tables"]["Where each launch's wall time went, per rank (s)"] = (PHASES, phases)
    detail["peaks"] = {g: _peaks(r) for g, r in runs.items()}
    detail["notes"] = md.full_notes(detail, args.target_speedup)
    return rows, detail


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


def _card_peaks(torch) -> dict:
    n = torch.cuda.device_count()
    return {f"GPU {i} peak allocated GiB": round(torch.cuda.max_memory_allocated(i) / md.GIB, 2) for i in range(n)} | {
        f"GPU {i} peak reserved GiB": round(torch.cuda.max_memory_reserved(i) / md.GIB, 2) for i in range(n)}


def shard(args, data: dict, settings: EvalSettings) -> tuple[list[dict], dict]:
    """One model over every visible card in this process (the lab's shard: true), under the cap on each card.
    A load or run that fails is this part's finding: its exact error is kept, not raised."""
    import torch

    from utils import gpu_cap
    from utils.models import is_gptq

    cap = gpu_cap.apply_cap()                    # this process holds the model: the profile's cap on every card
    for i in range(torch.cuda.device_count()):
        torch.cuda.reset_peak_memory_stats(i)
    s = settings.replace(parallelize=True, batch_size=args.batch, limit=args.limit)
    kind = "GPTQ-Int4" if is_gptq(args.model) else "unquantized"
    gib = sum(f.stat().st_size for f in Path(args.model).glob("*.safetensors")) / md.GIB
    base = {"setting": f"{kind} shard over {torch.cuda.device_count()} GPUs", "weights GiB": round(gib, 2),
            "batch": args.batch}
    info = {"cap": cap, "model": {"kind": kind, "weights_gib": gib, "path": str(args.model)},
            "max_memory_per_gpu": ev.model_args(args.model, parallelize=True).get("max_memory_per_gpu")}
    t0 = time.monotonic()
    try:
        run = ep.evaluate("sharded", args.model, args.work, data_files=data, settings=s)
    except Exception as exc:  # noqa: BLE001 - a refusal to shard is what this part records
        info["error"] = f"{type(exc).__name__}: {exc}"
        info["traceback"] = traceback.format_exc()[-6000:]
        info["notes"] = [f"**Finding: this model did not run sharded** ({kind}, max_memory_per_gpu "
                         f"{info['max_memory_per_gpu']}), after {time.monotonic() - t0:.1f} s. The exact error:",
                         "```\n" + info["error"][:3000] + "\n```"]
        return [{**base, "status": "failed", **_card_peaks(torch)}], info
    wall = time.monotonic() - t0
    info.update(settings=run["settings"], peaks=gpu_cap.peaks())
    row = {**base, "status": "ran", "n": run["n"], "wall s (load included)": round(wall, 1),
           "generation s": round(run["throughput"]["seconds"], 1),
           "GPTQ kernels": ", ".join(run["settings"].get("gptq_kernels") or []) or "-", **_card_peaks(torch),
           "host peak RSS GiB": round(info["peaks"]["host_peak_rss_gib"], 2)}
    info["notes"] = [f"{kind} model split over {torch.cuda.device_count()} cards by accelerate's device map "
                     f"(planned for max_memory_per_gpu {info['max_memory_per_gpu']}), every card under "
                     f"{cap.get('reason')}."]
    return [row], info


def check_baseline(args) -> dict:
    """The run --baseline names: a 1-GPU `full` run of this model, batch, decode and lengths (--keep wrote it),
    or the comparison would be of two different things."""
    if args.mode != "full" or args.one_only:
        raise SystemExit("--baseline: only with `full` and without --one-only (it is the other half of one)")
    try:
        run = json.loads(args.baseline.read_text())
        got = {"GPUs": run["parallel"]["gpus"], "model": run["model_path"], "batch": run["settings"]["batch_size"],
               "decode": run["settings"]["decode"]["decode"], "max_gen_toks": run["settings"]["max_gen_toks"],
               "max_length": run["settings"]["max_length"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"--baseline: {args.baseline} is not a 1-GPU run kept by `full --one-only --keep DIR` "
                         f"({type(exc).__name__}: {exc}); run that first, on this machine") from exc
    want = {"GPUs": 1, "model": str(args.model), "batch": args.batch, "decode": args.decode,
            "max_gen_toks": args.max_gen_toks, "max_length": args.max_length}
    differ = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    if differ:
        raise SystemExit(f"--baseline: {args.baseline} ran with other settings than this call's: "
                         + ", ".join(f"{k} {a!r} there, {b!r} here" for k, (a, b) in differ.items()))
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("full", "compare", "shard"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True, help="GSM8K folder: train.jsonl and test.jsonl")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--limit", type=int, required=True, help="problems (full: 0 is all of test.jsonl)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--invariant-limit", type=int, default=0, help="compare: problems re-run at batch size 1 (0: none)")
    ap.add_argument("--warmup", type=int, default=32, help="full: problems per GPU of the warm-up launch, which "
                    "runs on --gpus GPUs (at least 2 batches: the rates full plans with; a smaller last one measures "
                    "its cost)")
    ap.add_argument("--budget-s", type=float, default=450, help="full: seconds for the warm-up and both launches")
    ap.add_argument("--deadline", type=float, default=None, help="full: instead of --budget-s, the epoch second "
                    "by which they must be done (the caller's clock: this script's imports count)")
    ap.add_argument("--one-only", action="store_true", help="full: the warm-up and the 1-GPU launch only")
    ap.add_argument("--keep", type=Path, help="full: save each measured launch's run as <keep>/<name>-<g>gpu.json")
    ap.add_argument("--baseline", type=Path, help="full: a 1-GPU run saved by --keep: only the N-GPU launch runs, "
                    "on its problems, compared with it")
    ap.add_argument("--target-speedup", type=float, default=None, help="full: the wall speed-up the md checks")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--decode", default="eager", choices=("eager", "compiled"))
    ap.add_argument("--max-gen-toks", type=int, default=256)
    ap.add_argument("--max-length", type=int, default=2048)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    if args.limit < (0 if args.mode == "full" else 1):
        raise SystemExit(f"--limit: {args.limit} problems (full takes 0 for all of them)")
    out_md, out_js = args.out / f"{args.name}.md", args.out / f"{args.name}.json"
    for f in (out_md, out_js):
        if f.exists():
            raise SystemExit(f"--out: {f} exists already; give another --name or --out (nothing is overwritten)")
    if (args.one_only or args.keep) and args.mode != "full":
        raise SystemExit("--one-only and --keep: only with `full` (its 1-GPU launch, kept for a later --baseline)")
    args.baseline_run = check_baseline(args) if args.baseline else None
    if args.keep:
        try:                                  # before any launch: a launch measured and then not kept is lost
            args.keep.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SystemExit(f"--keep: cannot make {args.keep} ({exc}); give a folder this user can write") from exc
    args.work = args.out / f"{args.name}-work"
    data = ev.data_files_from_folder(args.data, param="--data")
    settings = EvalSettings.from_params(dtype=args.dtype, decode=args.decode, max_gen_toks=args.max_gen_toks,
                                        max_length=args.max_length, device=args.device, param="--model")
    command = "python scripts/multigpu_bench.py " + " ".join(sys.argv[1:] if argv is None else argv)
    t0 = time.monotonic()
    try:
        rows, detail = {"full": full, "compare": compare, "shard": shard}[args.mode](args, data, settings)
        status = 0
    except Exception as exc:  # noqa: BLE001 - the md says what failed rather than vanish
        rows, detail, status = [], {"error": f"{type(exc).__name__}: {exc}",
                                    "notes": [f"**This part failed**: {type(exc).__name__}: {exc}"]}, 1
    seconds = time.monotonic() - t0
    where = f"{md.machine()}, {seconds:.0f} s for this part"
    cap = os.environ.get("QUANTLAB_GPU_MEMORY_GIB")
    settings_line = (f"Model `{args.model}`, dtype {args.dtype}, decode {args.decode}, batch {args.batch}, "
                     f"max_gen_toks {args.max_gen_toks}, max_length {args.max_length}; "
                     + (f"GPU memory cap {cap} GiB in every process (QUANTLAB_GPU_MEMORY_GIB, utils/gpu_cap.py)."
                        if cap else "no GPU memory cap (QUANTLAB_GPU_MEMORY_GIB unset)."))
    vers = md.versions()
    text = md.header(f"Lab 03 beyond one GPU: {args.name} ({args.mode})", call=os.environ.get("MULTIGPU_CALL"),
                     command=command, vers=vers, where=where, settings=settings_line)
    text += "\n".join(n + "\n" for n in detail.get("notes", []))
    if rows:
        text += "\n" + md.table(rows) + "\n"
    for title, trows in (detail.get("tables") or {}).items():
        intro, trows = trows if isinstance(trows, tuple) else ("", trows)
        if trows:
            text += f"\n## {title}\n\n" + (intro + "\n\n" if intro else "") + md.table(trows) + "\n"
    atomic_write_json(out_js, {"command": command, "call": os.environ.get("MULTIGPU_CALL"), "machine": md.machine(),
                               "versions": vers, "seconds": seconds, "rows": rows, "detail": detail})
    atomic_write_text(out_md, text)
    print(text, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())

"""What scripts/multigpu_bench.py writes: each part as a kept run of docs/device-runs (the device-tool call,
the machine, the versions, the command, then the tables), so that its md can be copied there as it is.

Only formatting and facts about this machine here; what is measured is multigpu_bench.py's.
"""
from __future__ import annotations

import os
import platform
import subprocess
import time

PACKAGES = ("torch", "transformers", "accelerate", "lm_eval", "triton", "gptqmodel", "datasets")
GIB = 2**30


def versions() -> dict:
    """The versions that decide how Lab 03 runs here (a package not installed says so)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    try:
        import torch

        out["CUDA (torch)"] = torch.version.cuda or "none"
    except ImportError:
        pass
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        out["driver"] = smi.stdout.split()[0] if smi.returncode == 0 and smi.stdout.split() else "?"
    except (OSError, subprocess.TimeoutExpired):
        out["driver"] = "no nvidia-smi"
    return out


def machine() -> str:
    import torch

    if not torch.cuda.is_available():
        return f"CPU ({os.cpu_count()} cores), no GPU"
    names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
    return f"{torch.cuda.device_count()} x {', '.join(names)}"


def table(rows: list[dict]) -> str:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join("" if r.get(k) is None else str(r.get(k)).replace("|", "\\|") for k in keys) + " |"
              for r in rows]
    return "\n".join(lines)


def header(title: str, *, call: str | None, command: str, vers: dict, where: str, settings: str) -> str:
    """The top of a kept run: what it is, the device-tool call that made it, machine and versions, the command."""
    v = ", ".join(f"{k} {val}" for k, val in vers.items())
    lines = [f"# {title}", "", f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {where}; {v}.", ""]
    if call:
        lines += ["The device-tool call (from the repository root):", "", "```", call, "```", ""]
    lines += [f"The command this part ran: `{command}`", "", settings, "", ""]
    return "\n".join(lines)


def _r(x, nd=1):
    return None if x is None else round(x, nd)


def full_notes(detail: dict, target_speedup: float | None) -> list[str]:
    """The sentences of a `full` part that depend on what happened: how many problems, the warm-up, the target."""
    plan, total, out = detail.get("plan") or {}, detail["total"], []
    ran = detail.get("ran")
    if ran is None and detail.get("failed"):
        out.append("**No comparison**: a launch did not complete in the time left (below); a 1-GPU run that did "
                   "is in the tables alone, and no speed-up is claimed.")
    elif ran is None and detail.get("one_only"):
        out.append(f"**The 1-GPU launch only** ({plan.get('limit') or 0:,} problems): the {detail['gpus']}-GPU "
                   "launch runs in the next call (--baseline), and the comparison is in its file.")
    elif ran is None:
        out.append(f"**No full run**: {plan.get('why') or detail.get('error') or 'see the log'}.")
    elif ran == total:
        out.append(f"**All {total:,} problems** of the test set ran on each GPU count.")
    elif ran == detail["target"]:
        out.append(f"The first {ran:,} of the {total:,} problems ran on each GPU count (the --limit asked for).")
    else:
        out.append(f"**Not all {total:,} problems: {ran:,}**, the most that fit the time left "
                   f"({plan.get('seconds', 0):.0f} s) by the warm-up's rate ({plan.get('why', '')}). "
                   f"No number here is for the whole test set.")
    if plan.get("call_s") is not None:
        out.append(f"The plan, from the warm-up's rank 0: {plan['fixed_s']:.1f} s a launch besides generating (start, "
                   f"load, lm-eval, exit), {plan['call_s']:.2f} s a full generate call (its steady rate "
                   f"with a margin), {plan['warm_compile_s']:.1f} s for a compile from warm caches (assumed: half of "
                   f"the warm-up's cold one), {plan['smaller_last_batch_s']:.1f} s more for a smaller last batch.")
    warm = detail.get("warmup")
    if warm:
        compiled = detail.get("decode") == "compiled"
        caches = (f"TORCHINDUCTOR_CACHE_DIR={os.environ.get('TORCHINDUCTOR_CACHE_DIR', 'default')}, "
                  f"TRITON_CACHE_DIR={os.environ.get('TRITON_CACHE_DIR', 'default')}")
        cache = (f", {warm['max_gen_toks']} new tokens a problem so that its static cache is {warm['cache_len']} "
                 "tokens long like the measured launches'" if compiled and warm.get("cache_len") else "")
        first = f"{_r(warm['first_call_s'])} s{' with the compile' if compiled else ''}"
        gpus = f"{warm['gpus']} GPU{'s' if warm['gpus'] != 1 else ''}"
        out.append(f"A warm-up launch ({gpus}, {warm['n']} problems{cache}, {warm['wall_s']:.1f} s, its "
                   f"first generate call {first}) ran before "
                   + (f"both measured launches, so the 1-GPU and the {detail['gpus']}-GPU runs found the same warm "
                      if not (detail.get("one_only") or detail.get("baseline")) else "this call's measured launch, "
                      "so it found warm ")
                   + f"TorchInductor and Triton caches ({caches})"
                   + ("; each rank still traces and captures its own decode step, and that time is in its first "
                      "call below." if compiled else "; with eager decode nothing of the model is compiled."))
    base = detail.get("baseline")
    if base:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(base["launched_at"]))
        out.append(f"The 1-GPU launch is an earlier call's (launched {when}, read from `{base['path']}`); "
                   + ("this call's warm-up means it ran on another machine of the same kind, or found no compile "
                      "caches." if warm else f"this call found the compile caches its warm-up left, on the same "
                      f"machine, and ran only the {detail['gpus']}-GPU launch."))
    su = detail.get("speedup_wall")
    if su is not None and target_speedup:
        verdict = "met" if su >= target_speedup else "**not met**"
        out.append(f"Wall time, launch to exit, {detail['gpus']} GPUs against 1: **{su:.2f}x** "
                   f"(generation alone {detail.get('speedup_generation', 0):.2f}x); the target of "
                   f"{target_speedup}x is {verdict} on {ran:,} problems.")
    for g, err in (detail.get("failed") or {}).items():
        out.append(f"The {g}-GPU launch failed: {err}")
    return out


def launch_rows(label: str, run: dict, phases_of) -> list[dict]:
    """One row per rank of one launch: where its wall time went (utils.eval_parallel.worker_phases)."""
    par = run["parallel"]
    rows = []
    for w in par["workers"]:
        ph = phases_of(w, par["launched_at"], par["wall_seconds"])
        dec = w.get("decode") or {}
        calls = dec.get("per_call") or []
        rows.append({"launch": label, "rank": w["rank"], **{f"{k} s": _r(v) for k, v in ph.items()},
                     "calls": dec.get("calls"), "batches": ",".join(map(str, dec.get("batches") or [])),
                     "last call s (its batch)": f"{calls[-1]['seconds']:.1f} ({calls[-1]['batch']})"
                     if len(calls) > 1 else "-", "steady ms/step": _r(dec.get("steady_ms_per_step"), 2),
                     "static cache": dec.get("cache_len") or "-"})
    return rows


def per_rank(run: dict, key, nd=1) -> str:
    """A value of every rank of a launch, comma-separated in rank order."""
    return ", ".join("-" if key(w) is None else str(round(key(w), nd)) for w in run["parallel"]["workers"])

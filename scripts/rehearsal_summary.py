"""Summarize a rehearsal (scripts/rehearsal_7b.sh): per lab wall time, GPU peaks (each kernel's torch
counters and nvidia-smi over the lab's window), host peaks; Lab 03 extrapolated to all 1,319 problems.

    python scripts/rehearsal_summary.py --run RUN_DIR --work /tmp/quantlab-rehearsal --out $OUT

Writes summary.json and summary.md into --out. Every number is read from the run's own files; the
extrapolation is labelled as one.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GSM8K_TEST = 1319
RTX4090_GBPS = 1008e9        # RTX 4090 memory bandwidth (NVIDIA spec: 21 Gbps GDDR6X, 384-bit)
HOST_RAM_ASSUMED_GB = 32     # AutoDL's own example of a 1-GPU instance (autodl.com/docs/env: 32 GB/GPU)


def _json(path: Path) -> dict:
    """A JSON file's content, {} when it is absent or cut short (a run stopped by its timeout)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _rows(path: Path) -> list[list[str]]:
    if not path.is_file():
        return []
    with path.open(newline="") as fh:
        return [r for r in csv.reader(fh) if r]


def lab_windows(chain_log: Path) -> dict[str, tuple[int, int]]:
    """{lab: (start, end)} epoch seconds, from the timestamped '[lab] running' / '[lab] complete' lines."""
    starts, ends = {}, {}
    if chain_log.is_file():
        for line in chain_log.read_text(errors="replace").splitlines():
            m = re.match(r"(\d+) \[(\d\d_\w+)\] (running|complete)", line)
            if m:
                (starts if m.group(3) == "running" else ends)[m.group(2)] = int(m.group(1))
    last = max([int(l.split()[0]) for l in chain_log.read_text(errors="replace").splitlines()
                if l.split() and l.split()[0].isdigit()], default=0) if chain_log.is_file() else 0
    return {lab: (t, ends.get(lab, last)) for lab, t in starts.items()}


def window_peak(rows, window, scale: float) -> float | None:
    """Max of column 2 (times scale) over rows whose epoch-seconds column 1 lies in the window."""
    vals = []
    for r in rows:
        try:
            t, v = int(r[0]), float(r[1])
        except (ValueError, IndexError):
            continue
        if window[0] <= t <= window[1] + 1:
            vals.append(v * scale)
    return max(vals) if vals else None


def lab03_extrapolation(res: dict, build: dict) -> list[dict]:
    """Per model: the measured subset, and all 1,319 problems extrapolated from its generate calls
    (utils.decode.extrapolate_seconds: steady per-call cost, plus the first call's warm-up or compile)."""
    from utils.decode import extrapolate_seconds

    rows = []
    for name, m in (res.get("data", {}).get("per_model") or {}).items():
        tp, s = m["throughput"], m["settings"]
        n, secs, dec = tp["problems"], tp["seconds"], s.get("decode") or {}
        bs = s["batch_size"] if isinstance(s["batch_size"], int) else (s.get("batch_sizes") or [1])[0] or 1
        step_ms = dec.get("steady_ms_per_step")
        full = extrapolate_seconds(dec, bs, s["max_gen_toks"], GSM8K_TEST)
        weights = build.get("bf16" if name == "golden" else "int4", {}).get("bytes")
        floor_ms = 1000 * weights / RTX4090_GBPS if weights else None
        full_steps = math.ceil(GSM8K_TEST / bs) * s["max_gen_toks"]      # random weights never stop early
        extra = full - step_ms / 1000 * full_steps if full is not None and step_ms else 0.0
        rows.append({"model": name, "problems": n, "batch_size": bs, "gptq_backend": s.get("gptq_backend"),
                     "gptq_kernels": s.get("gptq_kernels"), "decode": dec.get("decode"), "seconds": round(secs, 1),
                     "first_call_s": dec.get("first_call_s"), "problems_per_s": tp["problems_per_s"],
                     "tokens_per_s": tp["tokens_per_s"], "ms_per_step": step_ms, "prompt_tokens": s.get("prompt_tokens"),
                     "extrapolated_1319_min": full / 60 if full is not None else None,
                     "rtx4090_step_floor_ms": floor_ms,
                     "rtx4090_estimate_1319_min": ((max(step_ms, floor_ms) * full_steps / 1000 + extra) / 60
                                                   if step_ms and floor_ms else None)})
    return rows


def summarize(run: Path, work: Path) -> dict:
    manifest = _json(run / "run.json") or {"labs": []}
    windows = lab_windows(work / "logs" / "chain.log")
    smi, host = _rows(work / "logs" / "smi.csv"), _rows(work / "logs" / "host.csv")
    build = _json(work / "logs" / "build.json")
    labs = []
    for e in manifest["labs"]:
        lab = e["lab"]
        pk = work / "peaks" / f"{lab}.json"
        peaks = _json(pk)
        w = windows.get(lab)
        seconds = e.get("seconds")
        if e["status"] == "reused" and e.get("from"):               # a --resume run: the time of the run it reused
            earlier = Path(e["from"]).parent / "run.json"
            if earlier.is_file():
                seconds = next((x.get("seconds") for x in json.loads(earlier.read_text())["labs"] if x["lab"] == lab), None)
        labs.append({"lab": lab, "status": e["status"], "seconds": seconds,
                     "gpu_peak_allocated_gib": peaks.get("gpu_peak_allocated_gib"),
                     "gpu_peak_reserved_gib": peaks.get("gpu_peak_reserved_gib"),
                     "cap_applied": (peaks.get("cap") or {}).get("applied"),
                     "smi_peak_gib": window_peak(smi, w, 1 / 1024) if w else None,
                     "kernel_host_peak_rss_gib": peaks.get("host_peak_rss_gib"),
                     "host_used_peak_gib": window_peak(host, w, 1 / 2**30) if w else None})
    out = {"run": str(run), "status": manifest.get("status"), "failure": manifest.get("failure"),
           "host_ram_assumed_gb": HOST_RAM_ASSUMED_GB, "build": build, "labs": labs,
           "gsm8k": (work / "gsm8k" / "SOURCE").read_text().strip() if (work / "gsm8k" / "SOURCE").is_file() else "?"}
    r3 = run / "03_eval" / "results.json"
    if r3.is_file():
        out["lab03"] = lab03_extrapolation(_json(r3), build)
    ab = work / "logs" / "auto_batch.json"
    if ab.is_file():
        out["auto_batch"] = _json(ab)
    return out


def _f(v, d=1):
    return "-" if v is None else (f"{v:.{d}f}" if isinstance(v, float) else str(v))


def markdown(s: dict) -> str:
    lines = [f"# Rehearsal at Qwen2.5-7B shapes under a 24 GiB cap: {Path(s['run']).name} ({s['status']})", "",
             f"GSM8K: {s['gsm8k']}. Host RAM assumed for an AutoDL RTX 4090 instance: {s['host_ram_assumed_gb']} GB "
             "(AutoDL allocates memory per GPU by host; its docs example is 32 GB/GPU).", ""]
    b = s.get("build") or {}
    if all(k in b for k in ("tokenizer", "model", "bf16", "int4")):
        lines += [f"Build: tokenizer {_f(b['tokenizer']['seconds'])} s, model {_f(b['model']['seconds'])} s "
                  f"({b['model']['parameters'] / 1e9:.3f} B parameters), bf16 written {b['bf16']['bytes'] / 2**30:.2f} GiB "
                  f"in {_f(b['bf16']['seconds'])} s, gptq-int4 {b['int4']['bytes'] / 2**30:.2f} GiB in "
                  f"{_f(b['int4']['seconds'])} s (packing {_f(b['int4']['pack_seconds'])} s).", ""]
    lines += ["| lab | status | seconds | GPU peak allocated GiB | reserved GiB | nvidia-smi peak GiB | kernel host RSS GiB | host used peak GiB |",
              "|---|---|---|---|---|---|---|---|"]
    for l in s["labs"]:
        lines.append(f"| {l['lab']} | {l['status']} | {_f(l['seconds'])} | {_f(l['gpu_peak_allocated_gib'], 2)} | "
                     f"{_f(l['gpu_peak_reserved_gib'], 2)} | {_f(l['smi_peak_gib'], 2)} | "
                     f"{_f(l['kernel_host_peak_rss_gib'], 2)} | {_f(l['host_used_peak_gib'], 2)} |")
    reserved = [l["gpu_peak_reserved_gib"] for l in s["labs"] if l["gpu_peak_reserved_gib"] is not None]
    capped = [l["lab"] for l in s["labs"] if l["cap_applied"]]
    lines += ["", f"24 GiB cap applied in the kernels of: {', '.join(capped) or 'none'}; largest torch reserved peak "
              f"{_f(max(reserved, default=None), 2)} GiB (past the cap torch raises out-of-memory: a lab that needed "
              "more than 24 GiB fails above)."]
    if s.get("failure"):
        f = s["failure"]
        lines += ["", f"Failure: {f.get('lab')} cell {f.get('cell')}: {f.get('ename')}: {str(f.get('evalue'))[:400]}"]
    if s.get("lab03"):
        lines += ["", "Lab 03 (measured on the subset; the 1,319 figure is an EXTRAPOLATION from its generate calls; "
                  "random weights generate all max_gen_toks tokens, the worst case):", "",
                  "| model | GPTQ kernel | decode | problems | batch | seconds | first call s | problems/s | tokens/s "
                  "| steady ms/step | 1,319 problems (min, extrapolated) | RTX 4090 estimate (min) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in s["lab03"]:
            kern = f"{r['gptq_backend']} ({', '.join(r['gptq_kernels'] or [])})" if r["gptq_backend"] else "-"
            lines.append(f"| {r['model']} | {kern} | {r['decode'] or '-'} | {r['problems']} | {r['batch_size']} | "
                         f"{_f(r['seconds'])} | {_f(r['first_call_s'])} | {_f(r['problems_per_s'], 2)} | {_f(r['tokens_per_s'])} | {_f(r['ms_per_step'])} | "
                         f"{_f(r['extrapolated_1319_min'])} | {_f(r['rtx4090_estimate_1319_min'])} |")
        lines += ["", "RTX 4090 estimate: max(measured steady ms/step, weight bytes / 1008 GB/s) x the 1,319 problems' "
                  "steps, plus the same first-call cost (the step is host-bound here; a 4090 host may be faster or slower)."]
    if s.get("auto_batch"):
        lines += ["", "lm-eval batch_size=auto at 7B under the cap: " + "; ".join(
            f"max_length {r['max_length']}: {r['batch_size']} ({_f(r['seconds'])} s)" for r in s["auto_batch"]["probes"])]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    s = summarize(args.run, args.work)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(s, indent=1, default=str))
    md = markdown(s)
    (args.out / "summary.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

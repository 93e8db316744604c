"""A GPU memory cap for every lab kernel, and each kernel's peak memory written beside the run.

Why: a 24 GB card (RTX 4090) can be rehearsed on a bigger GPU only if nothing may allocate past 24 GiB.
torch.cuda.set_per_process_memory_fraction makes torch's caching allocator raise OutOfMemoryError past
the cap, as the smaller card would (the CUDA context itself, ~0.5 GiB, is outside the cap and outside
torch's counters). The chain's kernels pick it up at start through ci/kernel_hooks/sitecustomize.py
when $QUANTLAB_GPU_MEMORY_GIB is set (a profile's `env`); on a machine without a GPU it does nothing.
The peaks go to $QUANTLAB_PEAKS_DIR/<lab>.json at the kernel's start (the cap record), every few seconds
while it runs, and at its exit: a kernel that the notebook runner has to kill at shutdown (a model loader's
threads, compile workers) still leaves its record, at most one interval old.
"""
from __future__ import annotations

import json
import math
import os
import resource
import time
from pathlib import Path

CAP_ENV = "QUANTLAB_GPU_MEMORY_GIB"
PEAKS_ENV = "QUANTLAB_PEAKS_DIR"
GIB = 2**30


def parse_cap(gib) -> float | None:
    """$QUANTLAB_GPU_MEMORY_GIB as GiB (None when unset or empty); ValueError naming the variable otherwise.
    NaN would pass `cap <= 0` and make a NaN memory fraction; inf would cap nothing without a word."""
    if gib is None or str(gib).strip() == "":
        return None
    try:
        cap = float(gib)
    except (TypeError, ValueError):
        raise ValueError(f"{CAP_ENV}={gib!r} is not a number of GiB: set it to the card's memory, e.g. 24, "
                         "or unset it for no cap") from None
    if not math.isfinite(cap) or cap <= 0:
        raise ValueError(f"{CAP_ENV}={gib!r} must be a finite number of GiB > 0, e.g. 24; unset it for no cap")
    return cap


def apply_cap(gib: float | str | None = None, torch_module=None) -> dict:
    """Cap this process's torch GPU memory at `gib` GiB (default $QUANTLAB_GPU_MEMORY_GIB).
    Returns what was done; a machine without a CUDA/ROCm GPU, or no cap asked for, is a no-op."""
    gib = os.environ.get(CAP_ENV, "") if gib is None else gib
    cap = parse_cap(gib)
    if cap is None:
        return {"applied": False, "cap_gib": None, "reason": f"${CAP_ENV} not set"}
    torch = torch_module or __import__("torch")
    if not torch.cuda.is_available():
        return {"applied": False, "cap_gib": cap, "reason": "no CUDA/ROCm GPU: nothing to cap"}
    total = torch.cuda.get_device_properties(0).total_memory
    if cap * GIB >= total:
        return {"applied": False, "cap_gib": cap, "total_gib": total / GIB,
                "reason": f"the GPU has only {total / GIB:.1f} GiB: the cap is above it"}
    fraction = cap * GIB / total
    for i in range(torch.cuda.device_count()):
        torch.cuda.set_per_process_memory_fraction(fraction, i)
    return {"applied": True, "cap_gib": cap, "total_gib": total / GIB, "fraction": fraction,
            "reason": f"torch.cuda.set_per_process_memory_fraction({fraction:.4f}) on every GPU"}


def peaks(torch_module=None) -> dict:
    """Peak torch GPU memory of this process (allocated and reserved, GiB) and its peak host RSS."""
    out = {"host_peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB}  # KiB on Linux
    torch = torch_module
    if torch is None:
        import sys
        torch = sys.modules.get("torch")       # a kernel that never imported torch used no GPU
    # is_initialized() first: a flag, no CUDA call (this also runs on a background thread, and a CUDA call
    # there could break a CUDA graph being captured on the main one)
    if torch is not None and torch.cuda.is_initialized():
        out["gpu_peak_allocated_gib"] = torch.cuda.max_memory_allocated() / GIB
        out["gpu_peak_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB
        if torch.cuda.device_count() > 1:    # a model sharded over the cards: each card's own peak
            out["gpu_peak_allocated_gib_per_card"] = [torch.cuda.max_memory_allocated(i) / GIB
                                                      for i in range(torch.cuda.device_count())]
    else:
        out["gpu_peak_allocated_gib"] = out["gpu_peak_reserved_gib"] = None
    return out


def write_peaks(folder: str | Path, label: str, cap: dict, started: float) -> Path:
    """Write <folder>/<label>.json (whole file at once): the cap record, the peaks, the kernel's wall time."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{label}.json"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"label": label, "pid": os.getpid(), "cap": cap, **peaks(),
                               "kernel_seconds": round(time.time() - started, 1)}, indent=1))
    os.replace(tmp, path)
    return path


def kernel_hook(interval_s: float = 2.0, label: str | None = None) -> dict | None:
    """Called at a lab kernel's start (sitecustomize): cap from the environment; peaks written now, every
    interval_s seconds on a daemon thread, and at exit. The label is the kernel's working folder, which
    the chain sets to the lab's folder (e.g. 03_eval); a lab's worker processes give their own (03_eval-rank1)."""
    if not (os.environ.get(CAP_ENV) or os.environ.get(PEAKS_ENV)):
        return None
    import atexit
    import threading

    started = time.time()
    cap = apply_cap()
    folder = os.environ.get(PEAKS_ENV)
    if folder:
        label = label or Path.cwd().name
        write_peaks(folder, label, cap, started)

        def refresh():
            while True:
                time.sleep(interval_s)
                write_peaks(folder, label, cap, started)

        threading.Thread(target=refresh, name="quantlab-peaks", daemon=True).start()
        _HOOKED[:] = [(folder, label, cap, started)]
        atexit.register(write_final_peaks)
    return cap


_HOOKED: list[tuple] = []      # kernel_hook's peaks file, for write_final_peaks


def write_final_peaks() -> None:
    """The peaks file's last write (at exit; a process that leaves through os._exit calls it first)."""
    for args in _HOOKED:
        write_peaks(*args)


SHARD_WEIGHTS_FRACTION = 0.75   # of the cap: the rest of each card is for the KV cache and activations


def shard_memory() -> dict:
    """lm-eval's parallelize=True plans accelerate's device map by each card's free memory; under the profile's
    cap ($QUANTLAB_GPU_MEMORY_GIB) torch may use only the cap, so the map is planned for the cap instead, less
    room for the KV cache and activations. No cap: lm-eval's own plan."""
    cap = parse_cap(os.environ.get(CAP_ENV))
    return {"max_memory_per_gpu": f"{cap * SHARD_WEIGHTS_FRACTION:.1f}GiB"} if cap else {}

"""One way to time code on this device: every timer of the course (Lab 01's ceilings, Lab 05's roofline,
scripts/bench_kernels.py) calls these.

- time_op: seconds per call, one per repeat, after a warm-up; device events on a GPU, perf_counter
  after a synchronize on a CPU.
- time_kernel: one number for a kernel: on CUDA the median of CUDA-graph replays, so a Python wrapper's
  launch cost (tens of us for a Triton launch) is not counted against a ~10 us kernel.
- time_cold: time_kernel with the operands read from DRAM, not L2, as a decode step reads each layer's
  weights once per token.
- time_eager: what a caller from Python sees: N calls back to back, bracketed by synchronizes, host
  cost included.
- time_repeated / time_interleaved: the median over a few such timings, of one callable or several in
  turn (clock drift then falls on all of them alike).
"""
from __future__ import annotations

import itertools
import statistics
import time
from typing import Callable

import torch


def synchronize(device) -> None:
    """Wait for the device's queued work (nothing to wait for on a CPU)."""
    kind = torch.device(device).type
    mod = getattr(torch, kind, None)
    if kind != "cpu" and mod is not None and hasattr(mod, "synchronize"):
        mod.synchronize()


def time_op(fn: Callable[[], object], device, warmup: int = 3, repeats: int = 10) -> list[float]:
    """Seconds per call of fn, one entry per repeat; device events on GPUs, perf_counter on CPU."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    kind = torch.device(device).type
    event_cls = getattr(getattr(torch, kind, None), "Event", None) if kind != "cpu" else None
    times = []
    for _ in range(repeats):
        if event_cls is not None:
            start, end = event_cls(enable_timing=True), event_cls(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            times.append(time.perf_counter() - t0)
    return times


def time_kernel(fn, device, repeats: int = 10) -> float:
    """Seconds per call. On CUDA: median of CUDA-graph replays (triton.testing.do_bench_cudagraph);
    elsewhere: the median of time_op."""
    if str(device).startswith("cuda"):
        from triton.testing import do_bench_cudagraph
        return float(do_bench_cudagraph(fn, rep=100, return_mode="median")) * 1e-3
    return statistics.median(time_op(fn, device, warmup=2, repeats=repeats))


def operand_copies(operands: tuple, at_least_bytes: int) -> list[tuple]:
    """[operands, clone, clone, ...]: enough sets of the tensors in operands (others passed as they are)
    that together they hold at least at_least_bytes; each clone has its own storage."""
    nbytes = sum(t.numel() * t.element_size() for t in operands if hasattr(t, "element_size"))
    n = max(2, -(-at_least_bytes // max(nbytes, 1)))
    return [operands] + [tuple(t.clone() if hasattr(t, "clone") else t for t in operands) for _ in range(n - 1)]


def time_cold(call, operands: tuple, device, repeats: int = 10) -> float:
    """Seconds per call(*operands) with its operands read from DRAM, not from L2. On CUDA the CUDA-graph
    replays rotate over copies of the operands that together pass 3x the L2 cache; replaying one copy
    would let part of a layer stay in L2 and report L2 speed as DRAM's. Elsewhere, time_kernel."""
    if not str(device).startswith("cuda"):
        return time_kernel(lambda: call(*operands), device, repeats)
    l2 = torch.cuda.get_device_properties(torch.device(device)).L2_cache_size
    sets = itertools.cycle(operand_copies(operands, 3 * l2))
    return time_kernel(lambda: call(*next(sets)), device, repeats)


def time_eager(fn, device, calls: int = 200, repeats: int = 5, warmup: int = 10, host_only: bool = False) -> float:
    """Seconds per call of fn called eagerly: the median over repeats of (wall time of `calls` calls
    back to back, a synchronize before and after) / calls. When the device is faster than the host,
    this is the host's cost per call (checks, planning, launches); no CUDA graph hides it. host_only:
    stop the clock when the last call returns (the host's enqueue time), before the closing synchronize."""
    if calls < 1 or repeats < 1:
        raise ValueError(f"calls and repeats must be >= 1, got {calls}, {repeats}")
    for _ in range(warmup):
        fn()
    per_call = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        synchronize(device)
        per_call.append(((t1 if host_only else time.perf_counter()) - t0) / calls)
    return statistics.median(per_call)


def time_repeated(timer: Callable[[], float], repeats: int = 3) -> float:
    """The median of `repeats` runs of a timer (e.g. lambda: time_kernel(fn, "cuda")): a noisy machine
    then shows up as spread instead of as a number."""
    return statistics.median(timer() for _ in range(repeats))


def time_interleaved(fns: dict, device, repeats: int = 3, log=print) -> dict:
    """time_kernel of several callables, interleaved: each round times every one in turn, so drift in the
    clocks falls on all of them alike instead of on whichever ran last; name -> the median over rounds
    (seconds). Each round's times go to log (None: silent)."""
    times = {k: [] for k in fns}
    for r in range(repeats):
        for k, fn in fns.items():
            times[k].append(time_kernel(fn, device))
        if log is not None:
            log(f"  round {r}: " + ", ".join(f"{k} {v[-1] * 1e6:.1f} us" for k, v in times.items()))
    return {k: statistics.median(v) for k, v in times.items()}

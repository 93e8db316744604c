"""Clocks and power under the grouped GEMM row of issue 8 (a probe, not a test): is the H200 held by its
power limit there, and does our kernel lose on work per clock or on clocks?

    python scripts/gemm_power_probe.py      # GPU with nvidia-smi; prints a markdown table
    ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,smsp__inst_executed.sum \
        -k regex:"nvjet|_grouped|cutlass" python scripts/gemm_power_probe.py --ncu   # one call each
    source scripts/carried_triton.sh && python3 scripts/gemm_power_probe.py --pair   # + the 2-CTA pair kernels
    python scripts/gemm_power_probe.py --burst    # short bursts from a rested GPU, below the power cap

Each kernel (the torch.matmul loop, the shipped grouped GEMM, torch._grouped_mm) is replayed from
a CUDA graph for a few seconds while nvidia-smi samples the SM clock, the power draw and the active
clock-throttle reasons every 100 ms. The table gives the medians over the samples of the replay's
middle, the kernel's time per call over the same replays, its TFLOP/s, and TFLOP/s per GHz of SM
clock (work per clock: what is left once the clock is divided out).
--burst asks the same question the other way round: each kernel is timed in short bursts (1, 4, 16
calls) started after 0.2 s of a one-thread spin (torch.cuda._sleep) that keeps the clocks up at little
power, so the first calls run before the power limit bites; our kernel and the loop take turns, and the
medians over the trials are printed with their ratio. Below the cap the ratio is the schedules' alone;
a 4 s replay of each closes the table, the same kernels held at the cap in the same run.
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from bench_kernels import check, grouped_case, warm_up  # noqa: E402
from grouped_probe import grouped_tma_fixed  # noqa: E402
from utils import kernels  # noqa: E402

QUERY = "clocks.sm,power.draw,power.limit,clocks_throttle_reasons.active"


def sample(stop: threading.Event, out: list, interval_ms: int = 100) -> None:
    """nvidia-smi's SM clock (MHz), power (W), power limit (W) and throttle bitmask, every interval_ms."""
    proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                             f"-lms={interval_ms}", "-i", "0"], stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        parts = [p.strip() for p in line.split(",")]
        try:
            out.append((time.perf_counter(), float(parts[0]), float(parts[1]), float(parts[2]), parts[3]))
        except (ValueError, IndexError):
            pass
        if stop.is_set():
            break
    proc.terminate()


def graph_of(fn, calls: int) -> "torch.cuda.CUDAGraph":
    """A CUDA graph of `calls` calls of fn (called once first, so any compile or autotune is outside it)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return g


def replay(fn, seconds: float, calls_per_graph: int = 20):
    """Replay a CUDA graph of calls_per_graph calls of fn for `seconds`; (ms per call, samples)."""
    g = graph_of(fn, calls_per_graph)
    samples: list = []
    stop = threading.Event()
    th = threading.Thread(target=sample, args=(stop, samples), daemon=True)
    th.start()
    time.sleep(0.5)
    start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start_ev.record()
    n = 0
    while time.perf_counter() - t0 < seconds:
        g.replay()
        n += 1
        if n % 10 == 0:
            torch.cuda.synchronize()
    end_ev.record()
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    stop.set()
    th.join(timeout=2)
    ms = start_ev.elapsed_time(end_ev) / (n * calls_per_graph)
    mid = [s for s in samples if t0 + 0.25 * (t1 - t0) <= s[0] <= t1 - 0.1 * (t1 - t0)]
    return ms, mid


def burst_times(fns: dict, calls: int, trials: int = 15, rest_s: float = 0.2) -> dict:
    """name -> median ms per call over `trials` bursts of `calls` calls (a CUDA graph each), every burst
    started after rest_s of a one-thread spin, the kernels in turn within each trial."""
    graphs = {name: graph_of(fn, calls) for name, fn in fns.items()}
    spin = int(rest_s * 2e9)                     # cycles: about rest_s at the H200's ~2 GHz rested clock
    times = {k: [] for k in fns}
    for _ in range(trials):
        for name, g in graphs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(spin)
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / calls)
    return {k: statistics.median(v) for k, v in times.items()}


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ncu", action="store_true", help="one call of each kernel (the Triton TMA kernel at its tuned "
                                                       "tile, the shipped one), no timing: for ncu's counters")
    ap.add_argument("--group-m", type=int, nargs="*", default=[],
                    help="also the shipped kernel's tile (128 x 256 x 64, 3 stages) with these GROUP_M tile orders")
    ap.add_argument("--pair", action="store_true", help="also grouped_gluon_probe.py's 2-CTA pair kernels (B's tile "
                                                        "multicast, A's): needs a Triton past 3.6")
    ap.add_argument("--burst", action="store_true", help="time the loop and our kernel in short bursts from a "
                                                         "rested GPU, below the power cap, instead of replaying them")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gemm_power_probe.py samples a GPU: run it on the device, e.g. "
                         "run(kind='nvidia-h200', command='python3 scripts/gemm_power_probe.py')")
    print(torch.cuda.get_device_name(0), "torch", torch.__version__, flush=True)
    G, m, K, N = 8, 2048, 4096, 4096
    a, b, offs, sizes, ref = grouped_case(G, m, K, N)
    if args.ncu:      # the autotuner would launch every candidate many times under ncu: its pick, fixed
        for gm in [8] + args.group_m:
            check(grouped_tma_fixed(a, b, offs, m, 128, 256, 64, 3, 8, GM=gm), ref, torch.bfloat16, K, f"GROUP_M {gm}")
        check(kernels.grouped_matmul(a, b, offs, max_rows=m), ref, torch.bfloat16, K,
              f"shipped grouped_matmul ({kernels.grouped_kernel(a, b)})")
        torch._grouped_mm(a, b.transpose(1, 2).contiguous().transpose(1, 2), offs=offs)
        torch.cuda.synchronize()
        return
    warm_up()
    check(kernels.grouped_matmul(a, b, offs, max_rows=m), ref, torch.bfloat16, K, "grouped GEMM")
    fns = {"torch.matmul loop (cuBLAS)": lambda: kernels.grouped_matmul_loop(a, b, sizes),
           f"shipped grouped_matmul ({kernels.grouped_kernel(a, b)})":
               lambda: kernels.grouped_matmul(a, b, offs, max_rows=m)}
    for gm in args.group_m:
        check(grouped_tma_fixed(a, b, offs, m, 128, 256, 64, 3, 8, GM=gm), ref, torch.bfloat16, K, f"GROUP_M {gm}")
        fns[f"Triton TMA kernel, 128 x 256 x 64, GROUP_M {gm}"] = (
            lambda gm=gm: grouped_tma_fixed(a, b, offs, m, 128, 256, 64, 3, 8, GM=gm))
    if args.pair:
        from grouped_gluon_probe import grouped_matmul_pair
        for share_a in (False, True):
            name = f"Gluon pair, {'A' if share_a else 'B'} multicast"
            check(grouped_matmul_pair(a, b, offs, m, share_a=share_a, group_m=16 if share_a else 8), ref,
                  torch.bfloat16, K, name)
            fns[name] = (lambda share_a=share_a: grouped_matmul_pair(a, b, offs, m, share_a=share_a,
                                                                     group_m=16 if share_a else 8))
    flop = 2 * G * m * K * N
    if args.burst:
        head = ["calls per burst"] + [f"{k}, us per call" for k in fns] + ["loop / ours"]
        print("| " + " | ".join(head) + " |\n" + "|---" * len(head) + "|", flush=True)
        loop_name, ours_name = list(fns)[:2]
        for calls in (1, 4, 16, 1):
            t = burst_times(fns, calls)
            print(f"| {calls} | " + " | ".join(f"{v * 1e3:.1f}" for v in t.values())
                  + f" | {t[loop_name] / t[ours_name]:.3f} |", flush=True)
        t = {k: replay(fn, 4.0) for k, fn in fns.items()}     # the same kernels held at the cap
        print("| 4 s replay (at the cap; SM MHz) | " + " | ".join(
            f"{ms * 1e3:.1f} ({statistics.median(x[1] for x in mid) if mid else float('nan'):.0f})"
            for ms, mid in t.values()) + f" | {t[loop_name][0] / t[ours_name][0]:.3f} |", flush=True)
        return
    if hasattr(torch, "_grouped_mm"):
        bt = b.transpose(1, 2).contiguous().transpose(1, 2)
        fns["torch._grouped_mm (CUTLASS)"] = lambda: torch._grouped_mm(a, bt, offs=offs)
    print(f"| {G} x ({m}x{K}x{N}) bf16 | us per call | TFLOP/s | SM clock MHz | power W (limit) | "
          "TFLOP/s per GHz | throttle reasons |\n|---|---|---|---|---|---|---|", flush=True)
    for rnd in range(2):
        for name, fn in fns.items():
            ms, mid = replay(fn, 4.0)
            if not mid:
                print(f"| {name} | {ms * 1e3:.1f} | no nvidia-smi samples |", flush=True)
                continue
            clock = statistics.median(s[1] for s in mid)
            power = statistics.median(s[2] for s in mid)
            reasons = sorted({s[4] for s in mid})
            tf = flop / (ms * 1e-3) / 1e12
            print(f"| {name} (round {rnd}) | {ms * 1e3:.1f} | {tf:.0f} | {clock:.0f} | {power:.0f} ({mid[0][3]:.0f}) | "
                  f"{tf / (clock / 1e3):.1f} | {', '.join(reasons)} |", flush=True)


if __name__ == "__main__":
    main()

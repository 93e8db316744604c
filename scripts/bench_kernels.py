"""Benchmark the project's Triton kernels against torch on a GPU; prints a markdown table (not a test).

    python scripts/bench_kernels.py                 # the table
    python scripts/bench_kernels.py --sweep         # also time fixed Int4 GEMV tiles/splits (--sweep-gemm: GEMM tiles)
    python scripts/bench_kernels.py --out bench.md  # also write the table to a file

Targets: Triton fp16/bf16 GEMM at 8192^3 >= 90% of torch.matmul TFLOP/s in the same run; grouped GEMM
>= 1.0x a loop of torch.matmul (and vs torch._grouped_mm where it runs); Int4 GEMV at Qwen2.5-7B MLP
shapes, batch 1, >= 70% of the measured copy bandwidth and >= 3x bf16 GEMV; an eager call of the Int4
GEMV from Python <= 30 us. Each kernel's output is checked against torch before it is timed: a fast
wrong kernel is not reported as fast.

Timing (utils.timing): CUDA-graph replays, so the Python wrapper's launch cost is not counted for either
side, median of replays, and the median of 3 such timings; a GEMM row's kernels are timed in turn within
each round (time_interleaved), because what ran before a GEMM changes the clocks it gets. The GEMV rows
read their weights cold: the replays rotate over copies of the operands past 3x the L2 cache, as a
decode step reads each layer's weights once per token (the hot time, one copy replayed, is in the note).
The eager rows call the GEMV from Python N times between two synchronizes (time_eager): what a student
who calls kernels.int4_gemv directly sees. The GPU is first kept busy for a few seconds (warm_up) so
that clocks settle before anything, the autotuners included, is timed.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402

from utils import ceilings, kernels, metrics, timing  # noqa: E402


def bench(fn, repeats: int = 3) -> float:
    """Milliseconds per call: the median over `repeats` CUDA-graph timings (the timer of Lab 05's roofline)."""
    return timing.time_repeated(lambda: timing.time_kernel(fn, "cuda"), repeats) * 1e3


def bench_interleaved(fns: dict, repeats: int = 3) -> dict:
    """bench() of several callables timed in turn within each round; name -> ms (rounds printed to the log)."""
    return {k: v * 1e3 for k, v in timing.time_interleaved(fns, "cuda", repeats, log=lambda m: print(m, flush=True)).items()}


def bench_cold(call, operands: tuple, repeats: int = 3) -> float:
    """bench() with the operands read from DRAM: replays rotate over copies past 3x L2 (timing.time_cold)."""
    return timing.time_repeated(lambda: timing.time_cold(call, operands, "cuda"), repeats) * 1e3


def warm_up(seconds: float = 3.0) -> None:
    """Keep the GPU busy with bf16 matmuls so clocks settle before anything (or any autotuner) is timed."""
    import time
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def check(out, ref, dtype, k, what):
    err = metrics.relative_l2(out, ref)
    bound = metrics.matmul_error_bound(dtype, k)
    if not err <= bound:
        raise SystemExit(f"{what}: relative L2 {err:.3g} above the bound {bound:.3g}: not timing a wrong kernel")
    return err


def gemm_rows(n, sweep):
    rows = []
    for name, dt in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        a = torch.randn(n, n, device="cuda", dtype=dt)
        b = torch.randn(n, n, device="cuda", dtype=dt)
        check(kernels.matmul(a, b), a @ b, dt, n, f"GEMM {name}")
        t = bench_interleaved({"torch.matmul": lambda: torch.matmul(a, b), "ours": lambda: kernels.matmul(a, b)})
        t_ref, t_ours = t["torch.matmul"], t["ours"]
        best = kernels.matmul_tuned_config()
        tf = lambda t: 2 * n**3 / (t * 1e-3) / 1e12  # noqa: E731
        rows.append({"kernel": f"Triton GEMM {name}", "shape": f"{n}^3", "ours": f"{tf(t_ours):.0f} TFLOP/s",
                     "baseline": f"torch.matmul {tf(t_ref):.0f} TFLOP/s", "ratio": t_ref / t_ours,
                     "target": ">= 0.90", "pass": t_ref / t_ours >= 0.90, "note": f"autotuned: {best}"})
        if sweep:
            for cfg in kernels.gpu_configs():
                c = dict(cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
                try:
                    t = bench(lambda: kernels.matmul(a, b, config=c))
                    print(f"  sweep {name} {c}: {tf(t):.0f} TFLOP/s ({t_ref / t:.3f}x torch)", flush=True)
                except Exception as exc:  # noqa: BLE001 - a config that does not fit is reported, not fatal
                    print(f"  sweep {name} {c}: failed {type(exc).__name__}", flush=True)
    return rows


def gemv_rows(copy_gbps, sweep):
    rows = []
    for K, N in ((3584, 18944), (18944, 3584)):
        gen = torch.Generator().manual_seed(0)
        w = torch.randn(K, N, generator=gen) * 0.02
        qw, qz, s = (t.cuda() for t in kernels.pack_gptq_int4(w, 128))
        wd = kernels.dequant_gptq_int4(qw, qz, s, 128)
        x = torch.randn(1, K, device="cuda", dtype=torch.float16)
        ref = x.float() @ wd
        w_bf16 = wd.t().contiguous().to(torch.bfloat16)            # nn.Linear layout [N, K]
        xb = x.to(torch.bfloat16)
        t_bf16 = bench(lambda: torch.nn.functional.linear(xb, w_bf16))
        cands = [dict(), dict(dequant="f32")]                      # the default (f16x2), exact f32
        if sweep:   # one-warp 32-column tiles, every split from 6 to 4 groups per program (around one wave)
            ng = K // 128
            cands += [dict(block_n=32, num_warps=1, split_k=k, num_stages=1, fixup=f)
                      for f in kernels.GEMV_FIXUPS
                      for k in range(kernels.gemv_split(ng, 6), kernels.gemv_split(ng, 4) + 1)]
            cands += [dict(block_n=b, num_warps=w, split_k=kernels.gemv_split(ng, g), num_stages=1)
                      for b, w in ((64, 1), (128, 2)) for g in (3, 4, 5)]
        timed = []
        for cfg in cands:                                          # cold weights (see the docstring)
            check(kernels.int4_gemv(x, qw, qz, s, 128, **cfg), ref, torch.float16, K, f"Int4 GEMV {cfg}")
            t = bench_cold(lambda *o, c=cfg: kernels.int4_gemv(*o, 128, **c), (x, qw, qz, s))
            timed.append((t, cfg))
            if sweep:
                print(f"  sweep int4 {K}->{N} {cfg}: {t * 1e3:.1f} us", flush=True)
        qbytes = qw.numel() * 4 + qz.numel() * 4 + s.numel() * 2 + x.numel() * 2 + N * 2
        t_q, t_f32, t_bf16_hot = timed[0][0], timed[1][0], t_bf16
        t_q_hot = bench(lambda: kernels.int4_gemv(x, qw, qz, s, 128))
        t_bf16 = bench_cold(torch.nn.functional.linear, (xb, w_bf16))
        bf_gbps = (w_bf16.numel() * 2) / (t_bf16 * 1e-3) / 1e9
        gbps = qbytes / (t_q * 1e-3) / 1e9
        best_t, best_cfg = min(timed, key=lambda r: r[0])
        fixed = kernels.int4_gemv_default_tile(x, K, N, 128, kernels.int4_gemv_dequant(x))
        plan = kernels.int4_gemv_plan(x, qw, qz, s, 128)
        default = f"the sm_90 tile {fixed}" if fixed else f"autotuned {plan.tile}"
        rows.append({"kernel": "Triton Int4 GEMV (GPTQ, g=128)", "shape": f"1x{K} -> {N}",
                     "ours": f"{t_q * 1e3:.1f} us, {gbps:.0f} GB/s ({gbps / copy_gbps:.0%} of copy)",
                     "baseline": f"bf16 F.linear {t_bf16 * 1e3:.1f} us ({bf_gbps:.0f} GB/s)",
                     "ratio": t_bf16 / t_q, "target": ">= 3.0x and >= 70% copy BW",
                     "pass": t_bf16 / t_q >= 3.0 and gbps >= 0.7 * copy_gbps,
                     "note": f"cold weights; one copy replayed (hot): ours {t_q_hot * 1e3:.1f} us "
                             f"({qbytes / (t_q_hot * 1e-3) / 1e9 / copy_gbps:.0%} of copy), bf16 {t_bf16_hot * 1e3:.1f} us; "
                             f"default: f16x2 dequant, {default}; exact f32 dequant {t_f32 * 1e3:.1f} us cold; "
                             f"fastest of {len(cands)} tried {best_t * 1e3:.1f} us ({best_cfg or 'default'})"})
        rows.append(eager_row(K, N, x, (qw, qz, s), xb, w_bf16, t_q_hot))
    return rows


def eager_row(K, N, x, packed, xb, w_bf16, t_graphed_ms, calls: int = 500, device: str = "cuda"):
    """The Int4 GEMV called eagerly from Python, `calls` calls between two synchronizes, against bf16
    F.linear called the same way; the note gives the host's enqueue time per call and the graphed time."""
    gemv = lambda: kernels.int4_gemv(x, *packed, 128)  # noqa: E731
    linear = lambda: torch.nn.functional.linear(xb, w_bf16)  # noqa: E731
    gemv()                                      # planned (and compiled) before the clock starts
    plans = kernels.cache.plans_made
    t_eager = timing.time_eager(gemv, device, calls=calls)
    t_host = timing.time_eager(gemv, device, calls=calls, host_only=True)
    t_bf16 = timing.time_eager(linear, device, calls=calls)
    if kernels.cache.plans_made != plans:
        raise SystemExit("int4_gemv planned again for a shape it had a plan for: the eager row would time planning")
    us = 1e6
    return {"kernel": "Int4 GEMV, eager call from Python", "shape": f"1x{K} -> {N}",
            "ours": f"{t_eager * us:.1f} us per call", "baseline": f"bf16 F.linear eager {t_bf16 * us:.1f} us",
            "ratio": t_bf16 / t_eager, "target": "<= 30 us per call", "pass": t_eager * us <= 30,
            "note": f"{calls} calls between two synchronizes, hot weights; host enqueue {t_host * us:.1f} us per "
                    f"call; the same call graphed (CUDA-graph replay, the roofline's timer) {t_graphed_ms * 1e3:.1f} us"}


def grouped_case(G, m, K, N, dt=torch.bfloat16):
    """G groups of m rows: A [G*m, K], B [G, K, N], their offsets, sizes and the torch.matmul loop's result."""
    sizes = [m] * G
    a = torch.randn(G * m, K, device="cuda", dtype=dt)
    b = torch.randn(G, K, N, device="cuda", dtype=dt)
    return a, b, kernels.group_offsets(sizes, "cuda"), sizes, kernels.grouped_matmul_loop(a, b, sizes)


def grouped_rows(shapes):
    rows = []
    for G, m, K, N in shapes:
        dt = torch.bfloat16
        a, b, offs, sizes, ref = grouped_case(G, m, K, N, dt)
        ours = kernels.grouped_kernel(a, b)
        fns = {"loop": lambda: kernels.grouped_matmul_loop(a, b, sizes)}
        for k in kernels.grouped_kernels_here(a, b):                # ours (the first) and the slower ones
            check(kernels.grouped_matmul(a, b, offs, max_rows=m, kernel=k), ref, dt, K, f"grouped GEMM ({k})")
            fns[k] = lambda k=k: kernels.grouped_matmul(a, b, offs, max_rows=m, kernel=k)
        t = bench_interleaved(fns)
        t_loop, t_ours = t["loop"], t[ours]
        flop = 2 * G * m * K * N
        tf = lambda t: flop / (t * 1e-3) / 1e12  # noqa: E731
        note = "; ".join([f"{ours} kernel"] + [f"{k} {tf(t[k]):.0f} TFLOP/s" for k in t if k not in ("loop", ours)])
        try:
            bt = b.transpose(1, 2).contiguous().transpose(1, 2)   # _grouped_mm wants B column-major
            check(torch._grouped_mm(a, bt, offs=offs), ref, dt, K, "torch._grouped_mm")
            t_g = bench(lambda: torch._grouped_mm(a, bt, offs=offs))
            note += f"; torch._grouped_mm {tf(t_g):.0f} TFLOP/s (ours {t_g / t_ours:.2f}x it)"
        except Exception as exc:  # noqa: BLE001
            note += f"; torch._grouped_mm did not run: {type(exc).__name__}: {str(exc)[:80]}"
        rows.append({"kernel": f"{'Gluon' if ours == 'gluon' else 'Triton'} grouped GEMM bf16",
                     "shape": f"G={G} x ({m}x{K}x{N})",
                     "ours": f"{tf(t_ours):.0f} TFLOP/s",
                     "baseline": f"torch.matmul loop {tf(t_loop):.0f} TFLOP/s",
                     "ratio": t_loop / t_ours, "target": ">= 1.0", "pass": t_loop / t_ours >= 1.0, "note": note})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", help="also time every Int4 GEMV block_n / split_k")
    ap.add_argument("--sweep-gemm", action="store_true", help="also time every GEMM tile config")
    ap.add_argument("--n", type=int, default=8192, help="GEMM size n for n x n x n")
    ap.add_argument("--out", default=None, help="also write the markdown table here")
    args = ap.parse_args()
    if not torch.cuda.is_available() or kernels.interpreted():
        raise SystemExit("bench_kernels.py needs a GPU and TRITON_INTERPRET unset (or 0)")
    dev = torch.cuda.get_device_name(0)
    copy = ceilings.copy_bandwidth(2 * 2**30, "cuda", repeats=20)["gbps"]
    print(f"{dev}, torch {torch.__version__}, triton {triton.__version__}; copy {copy:.0f} GB/s", flush=True)
    warm_up()
    rows = []
    for part in (lambda: gemv_rows(copy, args.sweep), lambda: gemm_rows(args.n, args.sweep_gemm),
                 lambda: grouped_rows([(8, 2048, 4096, 4096), (8, 512, 4096, 4096), (64, 128, 2048, 1408)])):
        new = part()
        for r in new:
            print("  row:", r, flush=True)   # kept if a later part is cut off
        rows += new
    lines = [f"Device: {dev}; torch {torch.__version__}; triton {triton.__version__}; "
             f"copy bandwidth {copy:.0f} GB/s (read + write).", "",
             "| kernel | shape | ours | baseline | speed-up | target | met | note |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['kernel']} | {r['shape']} | {r['ours']} | {r['baseline']} | {r['ratio']:.2f}x | "
                     f"{r['target']} | {'yes' if r['pass'] else 'NO'} | {r['note']} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench.md").write_text(table + "\n")


if __name__ == "__main__":
    main()

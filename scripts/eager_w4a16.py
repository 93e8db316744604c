"""Where one eager W4A16 call's host time goes, at M = 1 on Qwen2.5-7B's shapes, on a GPU:

    python scripts/eager_w4a16.py [--out OUT/eager_w4a16.md] [--profile]

Eagerly (no CUDA graph) a call costs what the host spends issuing it, once the GPU is faster than that.
Per shape, each piece is timed alone, 200 calls back to back, and only the host's part (the clock
stops when the last call returns; utils.timing.time_eager(host_only=True)), in rounds over every piece and
shape (the median of --rounds, default 15):
the op through torch.ops, the function, the launch plan's run, each of its launches (the GEMM, and the
split-K sum where the plan has one) as the plan makes them (the operands by address), the GEMM through
Triton's own per-call wrapper instead (the operands as tensors), and the one allocation a call makes (its
output: the split-K partials are kept with the plan); and the op's whole time (host and GPU). Beside them,
in the same rounds, the Int4 GEMV's eager call (int4_gemv, the course's batch-1 kernel) on the same
weights: the host's own yardstick. --profile: cProfile's top functions of 2,000 calls of the op at each shape.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench_w4a16 import SHAPES  # noqa: E402  (Qwen2.5-7B's linear shapes; this script's folder is on the path)
from utils import gptq, timing  # noqa: E402
from utils.kernels import int4_gemv  # noqa: E402
from utils.kernels.w4a16 import w4a16_matmul, w4a16_op, w4a16_plan  # noqa: E402


def pieces(K: int, N: int) -> tuple[dict, dict, tuple]:
    """Each piece of one eager call at M = 1 at this shape, as a function to time; the plan's tile; the op's
    operands."""
    qw, qz, s = (t.cuda() for t in gptq.pack_gptq_int4(torch.randn(K, N) * 0.02, 128))
    x = torch.randn(1, K, device="cuda", dtype=torch.float16)
    plan = w4a16_plan(x, qw, qz, s, None, None, 128, 1)
    y = plan.run(x, qw, qz, s, None, None)
    int4_gemv(x, qw, qz, s, 128)                                        # its plan made (and compiled) before timing
    part = y if plan.partials is None else plan.partials
    args, sum_args, _ = plan.launch_args(x, qw, qz, s, None, None, y, part, pointers=True)     # as a call launches
    tensor_args = plan.launch_args(x, qw, qz, s, None, None, y, part)[0]
    tritons = plan.gemm.compiled[tuple(plan.gemm.grid) + (1,)]          # Triton's own per-call wrapper
    fns = {"op": lambda: w4a16_op(x, qw, qz, s, None, None, 128, 1),
           "function": lambda: w4a16_matmul(x, qw, qz, s, None, None, 128, 1),
           "plan.run": lambda: plan.run(x, qw, qz, s, None, None),
           "GEMM launch": lambda: plan.gemm(args, True),
           "GEMM launch, Triton's wrapper": lambda: tritons(*tensor_args, *plan.gemm.tail),
           "y allocated": lambda: x.new_empty(plan.shape),
           "Int4 GEMV, function": lambda: int4_gemv(x, qw, qz, s, 128)}
    if plan.sum is not None:
        fns["sum launch"] = lambda: plan.sum(sum_args, True)
    meta = {"tile": f"{plan.tile.block_n} cols, split {plan.tile.split_k}, stages {plan.tile.num_stages}"
                    f"{', last-program sum' if plan.counts is not None else ''}",
            "launch": "direct" if getattr(plan.gemm.runner, "__name__", "") == "launch" else "Triton's wrapper"}
    return fns, meta, (x, qw, qz, s)


def measure(shapes: dict, rounds: int) -> dict:
    """Host microseconds per call of every piece at every shape: the median over `rounds` rounds, each timing
    every piece of every shape in turn (a host whose speed drifts then moves all pieces and shapes alike), and
    the op's whole time (host and GPU)."""
    times = {name: {k: [] for k in [*fns, "op, host and GPU"]} for name, (fns, _, _) in shapes.items()}
    for _ in range(rounds):
        for name, (fns, _, _) in shapes.items():
            for k, fn in fns.items():
                times[name][k].append(timing.time_eager(fn, "cuda", repeats=1, host_only=True) * 1e6)
            times[name]["op, host and GPU"].append(timing.time_eager(fns["op"], "cuda", repeats=1) * 1e6)
    rows = {}
    for name, (_, meta, _) in shapes.items():
        med = {k: statistics.median(v) for k, v in times[name].items()}
        rows[name] = {**meta, **med, "op / GEMV": med["op"] / med["Int4 GEMV, function"]}
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--rounds", type=int, default=15, help="rounds over every piece and shape (the median is kept)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("eager_w4a16: torch sees no GPU here; run it on the GPU machine")
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be at least 1, got {args.rounds}")
    if args.out and args.out.exists():
        raise SystemExit(f"--out: {args.out} exists; pass a new path")
    shapes = {name: pieces(K, N) for name, (K, N) in SHAPES.items()}
    rows = measure(shapes, args.rounds)
    profiles = []
    for name, (_, _, ops) in shapes.items():
        print(name, {k: (round(v, 2) if isinstance(v, float) else v) for k, v in rows[name].items()}, flush=True)
        if args.profile:
            prof = cProfile.Profile()
            prof.runcall(lambda: [w4a16_op(*ops, None, None, 128, 1) for _ in range(2000)])
            torch.cuda.synchronize()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
            profiles.append(f"### {name}\n\n```\n{buf.getvalue().strip()}\n```\n")
    cols = list(dict.fromkeys(k for r in rows.values() for k in r))
    lines = [f"# One eager W4A16 call at M = 1, host microseconds per piece ({torch.cuda.get_device_name(0)}, "
             f"{time.strftime('%Y-%m-%d', time.gmtime())}; torch {torch.__version__})", "",
             "| shape | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
    for name, r in rows.items():
        lines.append(f"| {name} | " + " | ".join(r[c] if isinstance(r.get(c), str) else
                                                 ("-" if c not in r else f"{r[c]:.2f}" if c == "op / GEMV" else f"{r[c]:.1f}")
                                                 for c in cols) + " |")
    text = "\n".join(lines + [""] + profiles) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

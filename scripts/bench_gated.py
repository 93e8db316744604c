"""A gated MLP's gate and up projections at Qwen2.5-7B's shapes: one fused launch against two, on a GPU.

    python scripts/bench_gated.py --out DIR [--rows 1 16] [--sweep]

Per M: silu(x @ Wg) * (x @ Wu) as the Int4 model ran it before (two w4a16_matmul calls, then torch's silu
and product) against w4a16_gated_silu (one launch, x read once, silu as it writes), each with its split-K
partials summed where the model sums them (the Gluon kernel's last program where it takes it) and by the sum
kernel, with the fused kernel's registers and shared memory; beside it bf16's two F.linear and the same activation.
Cold weights under CUDA-graph replay (utils.timing.time_cold), microseconds per MLP half; relative L2 of the
fused result against float64 (the reference dequant). --sweep: fixed tiles of the fused launch (of the kernel
the call runs by default: the Gluon kernel's columns and split-K on Hopper, the Triton kernel's otherwise).
Writes bench_gated.md and bench_gated.json into --out (refuses a folder that has them).
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from utils import metrics, timing  # noqa: E402
from utils.kernels import w4a16, w4a16_fragment  # noqa: E402
from utils.kernels.w4a16 import W4A16Tile, w4a16_gated_silu, w4a16_matmul  # noqa: E402

K, N = 3584, 18944


def cold_us(call, operands) -> float:
    return statistics.median(timing.time_cold(call, operands, "cuda") for _ in range(3)) * 1e6


def unfused(x, gq, gz, gs, uq, uz, us):
    g = w4a16_matmul(x, gq, gz, gs, None, None, 128, 1)
    u = w4a16_matmul(x, uq, uz, us, None, None, 128, 1)
    return (torch.nn.functional.silu(g.float()) * u.float()).half()


def fused(x, gq, gz, gs, uq, uz, us, tile=None):
    return w4a16_gated_silu(x, (gq, gz, gs, None), (uq, uz, us, None), 128, 1, tile)


def bf16(x, wg, wu):
    return (torch.nn.functional.silu(torch.nn.functional.linear(x, wg).float())
            * torch.nn.functional.linear(x, wu).float()).to(x.dtype)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--sweep", action="store_true")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_gated: torch sees no GPU here; run it on the GPU machine")
    if any(not 1 <= m <= 16 for m in args.rows):
        raise SystemExit(f"--rows: {args.rows} must lie in 1..16 (the fused range)")
    if (args.out / "bench_gated.json").exists():
        raise SystemExit(f"--out: {args.out} already holds bench_gated.json; pass a new folder")
    args.out.mkdir(parents=True, exist_ok=True)
    from utils import gptq
    gen = torch.Generator().manual_seed(0)
    layers = []
    for _ in range(2):
        qw, qz, s = gptq.pack_gptq_int4(torch.randn(K, N, generator=gen) * 0.02, 128)
        layers.append((qw.cuda(), qz.cuda(), s.cuda(), gptq.dequantize(qw, qz, s, None, 4, "gptq", 128).t()))
    (gq, gz, gs, Wg), (uq, uz, us, Wu) = layers
    wg, wu = (W.t().contiguous().to("cuda", torch.bfloat16) for W in (Wg, Wu))
    meta = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": "python scripts/bench_gated.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    rows, sweep = [], []
    for M in args.rows:
        x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)).to("cuda", torch.float16)
        xd = x.double().cpu()
        ref = torch.nn.functional.silu(xd @ Wg.double()) * (xd @ Wu.double())
        ops = (x, gq, gz, gs, uq, uz, us)
        row = {"M": M, "bf16_us": cold_us(bf16, (x.to(torch.bfloat16), wg, wu))}
        for on in (True, False):
            w4a16_fragment.LAST_SUM = on         # the split-K sum as the model runs it, then by the sum kernel
            tag = "model" if on else "kernel"
            y = fused(*ops)
            row[f"fused_{tag}_us"] = cold_us(fused, ops)
            row[f"unfused_{tag}_us"] = cold_us(unfused, ops)
            row[f"fused_{tag}_same_bits"] = all(torch.equal(fused(*ops), y) for _ in range(3))
        w4a16_fragment.LAST_SUM = True           # as the model runs it, from here on
        plan = w4a16.w4a16_plan(x, gq, gz, gs, None, None, 128, 1, gated=True)
        compiled = plan.gemm.compiled
        row.update(last_sum=plan.counts is not None, regs=getattr(compiled, "n_regs", None),
                   shared=getattr(getattr(compiled, "metadata", None), "shared", None))
        tile = w4a16.w4a16_default_tile(M, K, N, 128, torch.cuda.get_device_properties(0).multi_processor_count,
                                        w4a16.w4a16_default_unpack(gs.dtype, False, x, 128), gated=True)
        if tile.unpack == "fragment":            # the weights the other way: registers or the ring in shared memory
            other = dataclasses.replace(tile, num_stages=w4a16_fragment.other_way(tile.num_stages))
            row["w_other_way_stages"] = other.num_stages
            row["w_other_way_us"] = cold_us(lambda *a: fused(*a, other), ops)
            row["w_other_way_same_bits"] = torch.equal(fused(*ops, other), y)
        row["fused_rel"] = metrics.relative_l2(y.cpu(), ref)
        row["unfused_rel"] = metrics.relative_l2(unfused(*ops).cpu(), ref)
        row["fused_vs_unfused_max_abs"] = (y.float() - unfused(*ops).float()).abs().max().item()
        rows.append(row)
        print({k: (round(v, 2) if isinstance(v, float) and v > 1e-3 else v) for k, v in row.items()}, flush=True)
        if args.sweep:
            unpack = tile.unpack                                           # the kernel the fused call runs
            stages = (1, w4a16_fragment.RING_STAGES)
            grid = itertools.product((64, 128), (1, 2, 4, 7), stages) if unpack == "fragment" else \
                itertools.product((32, 64, 128), (1, 2, 4, 7), (2, 3, 4))
            for bn, split, st in grid:
                tile = W4A16Tile(bn, 128, split, 4, st, unpack)
                rec = {"M": M, **vars(tile)}
                try:
                    rec["rel"] = metrics.relative_l2(fused(*ops, tile).cpu(), ref)
                    rec["us"] = cold_us(lambda *a, t=tile: fused(*a, t), ops)
                except Exception as exc:  # noqa: BLE001 - a tile that does not compile is a finding
                    rec["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                sweep.append(rec)
                print(f"  M={M} {unpack} bn={bn} split={split} stages={st}: {rec.get('us')} us {rec.get('error', '')}",
                      flush=True)
        write(args.out, meta, rows, sweep)
    print(markdown(meta, rows, sweep))
    return 0


def write(out: Path, meta, rows, sweep) -> None:
    from utils.results import atomic_write_text
    atomic_write_text(out / "bench_gated.json", json.dumps({"meta": meta, "rows": rows, "sweep": sweep}, indent=1))
    atomic_write_text(out / "bench_gated.md", markdown(meta, rows, sweep))


def markdown(meta, rows, sweep) -> str:
    out = [f"# Gate and up, fused against two launches, {meta['device']} ({meta['date']})", "",
           f"torch {meta['torch']}, Triton {meta['triton']}. `{meta['command']}`. Qwen2.5-7B's gate/up ({K} -> {N}, "
           "x2), cold weights under CUDA-graph replay, us per MLP half (both projections and silu * up).", "",
           "| M | two launches + torch silu | the same, sums by the sum kernel | fused (its sum) | fused, sums by "
           "the sum kernel | fused, the weights the other way (registers or the ring) us (same bits) | bf16 "
           "| fused rel | unfused rel | fused vs unfused, max abs | same bits x3 | fused: registers, shared bytes |",
           "|" + "---|" * 12]
    for r in rows:
        way = "ring" if r.get("w_other_way_stages", 0) >= w4a16_fragment.RING_FROM else "registers"
        other = f"{r['w_other_way_us']:.1f} ({way}: {r['w_other_way_same_bits']})" if "w_other_way_us" in r else "-"
        out.append(f"| {r['M']} | {r['unfused_model_us']:.1f} | {r['unfused_kernel_us']:.1f} "
                   f"| {r['fused_model_us']:.1f} ({'last program' if r.get('last_sum') else 'sum kernel'}) "
                   f"| {r['fused_kernel_us']:.1f} | {other} | {r['bf16_us']:.1f} | {r['fused_rel']:.2e} "
                   f"| {r['unfused_rel']:.2e} | {r['fused_vs_unfused_max_abs']:.1e} "
                   f"| {r['fused_model_same_bits'] and r['fused_kernel_same_bits']} | {r.get('regs')}, {r.get('shared')} |")
    if sweep:
        out += ["", "| M | unpack | block_n | split_k | stages | us | rel |", "|---|---|---|---|---|---|---|"]
        out += [f"| {s['M']} | {s.get('unpack', 'ptx')} | {s['block_n']} | {s['split_k']} | {s['num_stages']} | "
                f"{s['us']:.1f} | {s['rel']:.2e} |" if "us" in s else
                f"| {s['M']} | {s.get('unpack', 'ptx')} | {s['block_n']} | {s['split_k']} | {s['num_stages']} "
                f"| {s['error']} | - |" for s in sweep]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())

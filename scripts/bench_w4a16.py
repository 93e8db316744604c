"""The W4A16 kernel against GPTQModel's Marlin, the Int4 GEMV and bf16 at Qwen2.5-7B's linear shapes on a GPU.

    python scripts/bench_w4a16.py --out DIR [--rows 1 2 4 8 16] [--sweep | --splits] [--no-marlin]
    python scripts/bench_w4a16.py --out DIR2 --marlin-into DIR/bench_w4a16.json   # Marlin's columns, later

Per shape (q/o, k/v, gate/up, down projections; GPTQ Int4, group 128, sym, v1 zeros, random weights) and
rows M: each kernel's relative L2 error against float64 x @ W (W the course's reference dequant), and its
time per call under CUDA-graph replay with the weights read cold (the replays rotate over copies of the
weights past 3x L2, utils.timing.time_cold; for Marlin over that many Marlin layers built from the same
tensors; --marlin-into adds them to an earlier run's rows, so the kernel can be timed while Marlin still
builds; that pass times ours eagerly again, with no compiler beside it). Then one eager call at M = 1
from Python (utils.timing.time_eager): the kernel's own function, the custom op through torch.ops (and
its host's part: the time to enqueue), Marlin's layer. --sweep: also fixed tiles of the W4A16 kernel, to
check its default; --splits: only its split-K, at every M, with the programs and how many fit at once. Marlin is built through GPTQModel (utils.gptq_kernels.build_kernel, its nvcc JIT on first use).
Writes bench_w4a16.md and bench_w4a16.json into --out (refuses a folder that has them).
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

from utils import gptq, metrics, timing  # noqa: E402
from utils.kernels import cache, int4_gemv, w4a16, w4a16_fragment  # noqa: E402
from utils.kernels.gemv_plan import resident_programs  # noqa: E402
from utils.kernels.w4a16 import (W4A16Tile, w4a16_default_tile, w4a16_default_unpack, w4a16_matmul, w4a16_op,  # noqa: E402
                                 w4a16_plan)

SHAPES = {"q_proj, o_proj": (3584, 3584), "k_proj, v_proj": (3584, 512), "gate_proj, up_proj": (3584, 18944),
          "down_proj": (18944, 3584)}


def shape_name(name: str) -> str:
    """A SHAPES key from it or from one projection's name in it (gate_proj: 'gate_proj, up_proj')."""
    for key in SHAPES:
        if name == key or name in key.split(", "):
            return key
    raise argparse.ArgumentTypeError(f"{name!r} is none of {list(SHAPES)} nor a projection's name in them")


def median_us(fn, repeats=3) -> float:
    return statistics.median(fn() for _ in range(repeats)) * 1e6


def cold_us(call, operands) -> float:
    return median_us(lambda: timing.time_cold(call, operands, "cuda"))


def cold_modules_us(mods, x) -> float:
    """Graph replays cycling over `mods` (each its own copy of the weights), so each call reads cold."""
    it = itertools.cycle(mods)
    return median_us(lambda: timing.time_kernel(lambda: next(it)(x), "cuda"))


def compiled_report(plan, sms: int) -> dict:
    """Registers, spills and shared memory of the compiled kernel (its machine code, counted:
    scripts/w4a16_sass.py), its programs and how many of them fit the GPU at once (one wave)."""
    k = plan.gemm.compiled
    regs, shared = getattr(k, "n_regs", None), getattr(getattr(k, "metadata", None), "shared", None)
    grid = plan.gemm.grid
    rec = {"regs": regs, "spills": getattr(k, "n_spills", None), "shared": shared, "programs": grid[0] * grid[1]}
    if regs:
        rec["resident"] = resident_programs(regs, plan.tile.num_warps, sms, shared or 0)
    return rec


def layer(K, N, seed=0):
    w = torch.randn(K, N, generator=torch.Generator().manual_seed(seed)) * 0.02
    qw, qz, s = gptq.pack_gptq_int4(w, 128)
    W = gptq.dequantize(qw, qz, s, None, 4, "gptq", 128).t()              # [K, N] fp16, the reference
    return {"qweight": qw, "qzeros": qz, "scales": s, "g_idx": (torch.arange(K) // 128).to(torch.int32)}, W


def marlin_layers(tensors, n, log):
    from utils import gptq_kernels
    try:
        return [gptq_kernels.build_kernel("gptq_marlin", tensors, "cuda", torch.float16, compile_extensions=True)
                for _ in range(n)], None
    except Exception as exc:  # noqa: BLE001 - the row says why
        log(f"marlin unavailable: {exc}")
        return None, f"{type(exc).__name__}: {str(exc)[:200]}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--sweep", action="store_true")
    which.add_argument("--splits", action="store_true", help="sweep only the Gluon kernel's split-K, at every --rows "
                    "(programs from half a wave to three), at its default columns and stages or these:")
    ap.add_argument("--block-n", type=int, nargs="+", choices=(64, 128), help="with --splits: columns per program")
    ap.add_argument("--stages", type=int, nargs="+", help="with --splits: 1 (registers) or 3+ (a ring of that many)")
    ap.add_argument("--shared-x-from", type=int, help="rows from which x goes through shared memory (default "
                    f"{w4a16_fragment.SHARED_X_FROM})")
    ap.add_argument("--no-marlin", action="store_true")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), type=shape_name,
                    help=f"of {list(SHAPES)} (a projection's name alone will do, e.g. gate_proj)")
    ap.add_argument("--marlin-into", type=Path, help="an earlier run's bench_w4a16.json: add Marlin's columns to it")
    args = ap.parse_args(argv)
    if (args.block_n or args.stages) and not args.splits:
        raise SystemExit("--block-n and --stages shape the --splits sweep: pass --splits with them")
    if args.shared_x_from is not None:
        if not 1 <= args.shared_x_from <= 17:
            raise SystemExit(f"--shared-x-from: {args.shared_x_from} outside 1..17 (17: x never through shared memory)")
        w4a16_fragment.SHARED_X_FROM = args.shared_x_from
    if not torch.cuda.is_available():
        raise SystemExit("bench_w4a16: torch sees no GPU here; run it on the GPU machine")
    bad = [m for m in args.rows if not 1 <= m <= 16]
    if bad:
        raise SystemExit(f"--rows: {bad} outside 1..16 (the kernel's fused range)")
    if (args.out / "bench_w4a16.json").exists():
        raise SystemExit(f"--out: {args.out} already holds bench_w4a16.json; pass a new folder")
    args.out.mkdir(parents=True, exist_ok=True)
    log = lambda m: print(m, flush=True)  # noqa: E731
    dev = torch.cuda.get_device_name(0)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows, sweep = [], []
    earlier = None
    if args.marlin_into:
        earlier = json.loads(args.marlin_into.read_text())
        rows, sweep = earlier["rows"], earlier["sweep"]
    meta = {"device": dev, "torch": torch.__version__, "triton": __import__("triton").__version__,
            "command": "python scripts/bench_w4a16.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if earlier:
        meta["kernel_rows_from"] = earlier["meta"]
    for name, (K, N) in ((n, SHAPES[n]) for n in args.shapes):
        t, W = layer(K, N)
        if earlier:
            marlin, why = marlin_layers(t, max(2, -(-3 * l2 // (t["qweight"].numel() * 4)) + 1), log)
            for row in (r for r in rows if r["shape"] == name):
                x = torch.randn(row["M"], K, generator=torch.Generator().manual_seed(row["M"])).to("cuda", torch.float16)
                if marlin:
                    with torch.no_grad():
                        row["marlin_rel"] = metrics.relative_l2(marlin[0](x).cpu(), x.double().cpu() @ W.double())
                        row["marlin_us"] = cold_modules_us(marlin, x)
                        if row["M"] == 1:
                            row["eager_marlin_us"] = timing.time_eager(lambda: marlin[0](x), "cuda") * 1e6
                else:
                    row["marlin_reason"] = why
                if row["M"] == 1:   # ours again, eager, now that no build runs beside it (a host-bound time)
                    ops = [t[k].cuda() for k in ("qweight", "qzeros", "scales")]
                    for key, host in (("eager_op_us", False), ("eager_op_host_us", True)):
                        row[key] = timing.time_eager(lambda: w4a16_op(x, *ops, None, None, 128, 1), "cuda",
                                                     host_only=host) * 1e6
                    row["eager_us"] = timing.time_eager(lambda: w4a16_matmul(x, *ops, None, None, 128, 1), "cuda") * 1e6
                    row["eager_timed_with_marlin"] = True
                log(f"{name} M={row['M']}: marlin {row.get('marlin_us')} us, rel {row.get('marlin_rel')}")
            del marlin
            torch.cuda.empty_cache()
            write(args.out, meta, rows, sweep)
            continue
        qw, qz, s = (t[k].cuda() for k in ("qweight", "qzeros", "scales"))
        wbf = W.t().contiguous().to("cuda", torch.bfloat16)
        copies = max(2, -(-3 * l2 // (qw.numel() * 4)) + 1)
        marlin, why = (None, "--no-marlin") if args.no_marlin else marlin_layers(t, copies, log)
        for M in args.rows:
            x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)).to("cuda", torch.float16)
            ref = x.double().cpu() @ W.double()
            row = {"shape": name, "K": K, "N": N, "M": M,
                   "bound": gptq.kernel_tolerance("QuantlabLinear", torch.float16, torch.float16, K)}
            y = w4a16_matmul(x, qw, qz, s, None, None, 128, 1)
            row["ours_rel"] = metrics.relative_l2(y.cpu(), ref)
            row["ours_same_bits"] = all(torch.equal(w4a16_matmul(x, qw, qz, s, None, None, 128, 1), y) for _ in range(3))
            row["ours_us"] = cold_us(lambda a, b, c, d: w4a16_matmul(a, b, c, d, None, None, 128, 1), (x, qw, qz, s))
            tile = w4a16_default_tile(M, K, N, 128, sms, w4a16_default_unpack(s.dtype, False, x, 128))
            row["tile"] = vars(tile)
            if not args.splits and tile.unpack == "fragment" and M > 1:     # x read the other way (per warp or shared)
                default = w4a16_fragment.SHARED_X_FROM
                w4a16_fragment.SHARED_X_FROM = 2 if M < default else 17
                row["x_other_way_same_bits"] = torch.equal(w4a16_matmul(x, qw, qz, s, None, None, 128, 1), y)
                row["x_other_way_us"] = cold_us(lambda a, b, c, d: w4a16_matmul(a, b, c, d, None, None, 128, 1),
                                               (x, qw, qz, s))
                w4a16_fragment.SHARED_X_FROM = default
            if not args.splits and tile.unpack == "fragment":     # the weight the other way (registers or the ring)
                other = dataclasses.replace(tile, num_stages=w4a16_fragment.other_way(tile.num_stages))
                row["w_other_way_same_bits"] = torch.equal(w4a16_matmul(x, qw, qz, s, None, None, 128, 1, tile=other),
                                                           y)
                row["w_other_way_us"] = cold_us(lambda a, b, c, d: w4a16_matmul(a, b, c, d, None, None, 128, 1,
                                                                                tile=other), (x, qw, qz, s))
            plan = w4a16_plan(x, qw, qz, s, None, None, 128, 1)
            if not args.splits and tile.unpack == "fragment" and tile.split_k > 1:    # the split-K sum the other way
                row["last_sum"] = plan.counts is not None
                w4a16_fragment.LAST_SUM = not w4a16_fragment.LAST_SUM
                row["sum_other_way_same_bits"] = torch.equal(w4a16_matmul(x, qw, qz, s, None, None, 128, 1), y)
                row["sum_other_way_us"] = cold_us(lambda a, b, c, d: w4a16_matmul(a, b, c, d, None, None, 128, 1),
                                                  (x, qw, qz, s))
                if M == 1:
                    row["eager_sum_other_way_us"] = timing.time_eager(
                        lambda: w4a16_matmul(x, qw, qz, s, None, None, 128, 1), "cuda") * 1e6
                w4a16_fragment.LAST_SUM = not w4a16_fragment.LAST_SUM
            if not args.splits and tile.unpack == "fragment":     # beside it, the Triton kernel's default (PTX)
                ptx = w4a16_default_tile(M, K, N, 128, sms, "ptx")
                row["triton_rel"] = metrics.relative_l2(w4a16_matmul(x, qw, qz, s, None, None, 128, 1, tile=ptx).cpu(), ref)
                row["triton_us"] = cold_us(lambda a, b, c, d: w4a16_matmul(a, b, c, d, None, None, 128, 1, tile=ptx),
                                           (x, qw, qz, s))
            if args.splits and plan.sum is not None:    # the GEMM alone, into its partials, without the split-K sum
                yb = torch.empty((M, N), device="cuda", dtype=x.dtype)
                part = torch.empty((plan.tile.split_k, M, N), device="cuda", dtype=torch.float32)
                row["gemm_only_us"] = cold_us(lambda a, b, c, d: plan.gemm(
                    plan.launch_args(a, b, c, d, None, None, yb, part)[0], True), (x, qw, qz, s))
            row["bytes"] = qw.numel() * 4 + qz.numel() * 4 + s.numel() * 2 + x.numel() * 2 + M * N * 2
            row["ours_gbps"] = row["bytes"] / row["ours_us"] / 1e3
            xb = x.to(torch.bfloat16)
            row["bf16_us"] = cold_us(torch.nn.functional.linear, (xb, wbf))
            if M == 1 and not args.splits:
                g = int4_gemv(x, qw, qz, s, 128)
                row["gemv_rel"] = metrics.relative_l2(g.cpu(), ref)
                row["gemv_us"] = cold_us(lambda a, b, c, d: int4_gemv(a, b, c, d, 128), (x, qw, qz, s))
            if marlin:
                with torch.no_grad():
                    row["marlin_rel"] = metrics.relative_l2(marlin[0](x).cpu(), ref)
                    row["marlin_us"] = cold_modules_us(marlin, x)
            else:
                row["marlin_reason"] = why
            if M == 1:
                plans = cache.plans_made
                row["eager_us"] = timing.time_eager(lambda: w4a16_matmul(x, qw, qz, s, None, None, 128, 1), "cuda") * 1e6
                row["eager_op_us"] = timing.time_eager(lambda: w4a16_op(x, qw, qz, s, None, None, 128, 1), "cuda") * 1e6
                row["eager_op_host_us"] = timing.time_eager(lambda: w4a16_op(x, qw, qz, s, None, None, 128, 1), "cuda",
                                                            host_only=True) * 1e6
                row["eager_replanned"] = cache.plans_made != plans
                if marlin:
                    with torch.no_grad():
                        row["eager_marlin_us"] = timing.time_eager(lambda: marlin[0](x), "cuda") * 1e6
            log(f"{name} M={M}: ours ({tile.unpack}) {row['ours_us']:.1f} us ({row['ours_gbps']:.0f} GB/s, rel {row['ours_rel']:.2e}), "
                f"bf16 {row['bf16_us']:.1f} us" + (f", GEMV {row['gemv_us']:.1f} us" if "gemv_us" in row else ""))
            rows.append(row)
            if (args.sweep and M in (1, 16)) or args.splits:
                base = w4a16_default_tile(M, K, N, 128, sms, tile.unpack)
                tiles = ([t for bn in args.block_n or [base.block_n] for st in args.stages or [base.num_stages]
                          for t in split_tiles(dataclasses.replace(base, block_n=bn, num_stages=st), K, N, sms)]
                         if args.splits else sweep_tiles(base, K))
                for tile in tiles:
                    rec = {"shape": name, "M": M, **vars(tile), "us": None}
                    try:
                        y = w4a16_matmul(x, qw, qz, s, None, None, 128, 1, tile=tile)
                        rec["rel"] = metrics.relative_l2(y.cpu(), ref)
                        rec["us"] = cold_us(lambda a, b, c, d, tl=tile: w4a16_matmul(a, b, c, d, None, None, 128, 1,
                                                                                      tile=tl), (x, qw, qz, s))
                        rec.update(compiled_report(w4a16_plan(x, qw, qz, s, None, None, 128, 1, tile), sms))
                    except Exception as exc:  # noqa: BLE001 - a tile that does not compile is a finding
                        rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                        log(f"tile {tile} failed: {rec['error']}")
                    sweep.append(rec)
                    log(f"  sweep {name} M={M} {vars(tile)}: {rec.get('us')} us, rel {rec.get('rel')}, "
                        f"regs {rec.get('regs')}, spills {rec.get('spills')}, shared {rec.get('shared')}, "
                        f"programs {rec.get('programs')} of {rec.get('resident')} resident")
        del marlin
        torch.cuda.empty_cache()
        write(args.out, meta, rows, sweep)          # after every shape: a run cut short keeps its rows
    print(markdown(meta, rows, sweep))
    return 0


def sweep_tiles(base: W4A16Tile, K: int) -> list[W4A16Tile]:
    """Tiles around the default: for the Gluon kernel 128 columns, split-K x1 and x2, the weight loaded into
    registers one step ahead (1 stage) or through a ring of 3 to 6 slots in shared memory; for the Triton kernel
    every unpacking, 64 to 256 columns, split-K x1 and x2, 3 or 4 stages."""
    steps = K // 128
    if base.unpack == "fragment":
        splits = sorted({max(1, min(steps, round(base.split_k * f))) for f in (1, 2)})
        return [W4A16Tile(128, 128, sp, 4, stages, "fragment") for sp in splits for stages in (1, 3, 4, 6)]
    grid = [*itertools.product(("reshape", "join", "ptx"), (64, 128), (1, 2), (3, 4), (4,)),
            *itertools.product(("join", "ptx"), (128, 256), (1, 2), (3,), (8,))]
    return [W4A16Tile(bn, 128, max(1, min(steps, round(base.split_k * f * 64 / bn))), warps, st, unpack)
            for unpack, bn, f, st, warps in grid]


def split_tiles(base: W4A16Tile, K: int, N: int, sms: int) -> list[W4A16Tile]:
    """The Gluon kernel's default tile at every split-K (each a distinct number of K steps per program) whose
    programs number between half a wave and three waves of four programs per SM."""
    steps, blocks = K // base.block_k, -(-N // base.block_n)
    splits = sorted({-(-steps // per) for per in range(1, steps + 1)})
    return [dataclasses.replace(base, split_k=sp) for sp in splits if 2 * sms <= blocks * sp <= 12 * sms]


def write(out: Path, meta, rows, sweep) -> None:
    from utils.results import atomic_write_text
    atomic_write_text(out / "bench_w4a16.json", json.dumps({"meta": meta, "rows": rows, "sweep": sweep}, indent=1))
    atomic_write_text(out / "bench_w4a16.md", markdown(meta, rows, sweep))


def markdown(meta, rows, sweep) -> str:
    f = lambda v, p=1: "-" if v is None else (f"{v:.{p}e}" if p == "e" else f"{v:.{p}f}")  # noqa: E731
    out = [f"# W4A16 kernel vs Marlin on {meta['device']} ({meta['date']})", "",
           f"torch {meta['torch']}, Triton {meta['triton']}. Command: `{meta['command']}`. Cold weights under "
           "CUDA-graph replay; rel = relative L2 against float64 x @ W (W the reference dequant); the bound is "
           "the course's derived one for fp16.", "",
           "| shape | K -> N | M | ours (unpack) us | ours GB/s | ours rel | same bits x3 | Marlin us | Marlin rel "
           "| ours / Marlin | ours, x the other way (from 2 rows into shared memory, at one row by every warp) us (same "
           "bits) | ours, the weight the other way (registers or the ring in shared memory) us (same bits) "
           "| ours' split-K sum (last: its last program, kernel: the sum kernel), and the other way us (same bits) "
           "| Triton kernel (ptx) us (rel) | Int4 GEMV us (rel) | bf16 us | bound |", "|" + "---|" * 17]
    for r in rows:
        ratio = r["ours_us"] / r["marlin_us"] if r.get("marlin_us") else None
        gemv = f"{f(r.get('gemv_us'))} ({r['gemv_rel']:.1e})" if r.get("gemv_us") else "-"
        triton_col = f"{f(r['triton_us'])} ({r['triton_rel']:.1e})" if r.get("triton_us") else "-"
        other_x = f"{f(r['x_other_way_us'])} ({r['x_other_way_same_bits']})" if r.get("x_other_way_us") else "-"
        other_w = f"{f(r['w_other_way_us'])} ({r['w_other_way_same_bits']})" if r.get("w_other_way_us") else "-"
        other_sum = (f"{'last' if r['last_sum'] else 'kernel'}; {f(r['sum_other_way_us'])} "
                     f"({r['sum_other_way_same_bits']})" if r.get("sum_other_way_us") else "-")
        out.append(f"| {r['shape']} | {r['K']} -> {r['N']} | {r['M']} | {f(r['ours_us'])} ({r['tile']['unpack']}) "
                   f"| {f(r['ours_gbps'], 0)} | {r['ours_rel']:.2e} | {r['ours_same_bits']} | {f(r.get('marlin_us'))} "
                   f"| {'-' if r.get('marlin_rel') is None else format(r['marlin_rel'], '.2e')} | {f(ratio, 2)} "
                   f"| {other_x} | {other_w} | {other_sum} "
                   f"| {triton_col} | {gemv} "
                   f"| {f(r['bf16_us'])} | {r['bound']:.1e} |")
    out += ["", "Eager, one call at M = 1 from Python (hot weights, 200 calls between two synchronizes):", "",
            "| shape | w4a16_matmul us | the same, its split-K sum the other way | torch.ops.quantlab.w4a16_matmul us "
            "| its host part (enqueue) us | Marlin layer us |", "|---|---|---|---|---|---|"]
    for r in rows:
        if r["M"] == 1:
            out.append(f"| {r['shape']} | {f(r['eager_us'])} | {f(r.get('eager_sum_other_way_us'))} | {f(r['eager_op_us'])} "
                       f"| {f(r.get('eager_op_host_us'))} | {f(r.get('eager_marlin_us'))} |")
    if sweep:
        out += ["", "Tile sweep (us, cold; registers and spills of the compiled kernel):", "",
                "| shape | M | unpack | block_n | warps | split_k | stages | us | rel | regs | spills | shared | programs "
                "| resident |", "|" + "---|" * 14]
        out += [f"| {s['shape']} | {s['M']} | {s.get('unpack', 'rows' if s.get('rows') else 'reshape')} | {s['block_n']} "
                f"| {s['num_warps']} | {s['split_k']} | {s.get('num_stages', 2)} | {f(s['us'])} "
                f"| {'-' if s.get('rel') is None else format(s['rel'], '.2e')} | {s.get('regs', '-')} "
                f"| {s.get('spills', '-')} | {s.get('shared', '-')} | {s.get('programs', '-')} "
                f"| {s.get('resident', '-')} |" for s in sweep]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())

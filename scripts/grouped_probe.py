"""Grouped GEMM experiments for issue 8 (a bench, not a test): does a persistent kernel (one program
per SM walking every group's tiles) close the gap to a torch.matmul loop at a few large groups?

    python scripts/grouped_probe.py [--round 4]      # GPU (sm_90); prints a table of that round's configs

Round 1 (docs/device-runs/20261123-lab05-kernels-h100/grouped_probe.log) compared TMA loads with
pointer loads; TMA won and is now utils.kernels' path on Hopper ("shipped" below). Round 2: the
persistent variant, same TMA descriptors (B viewed as [G*K, N], K a multiple of BLOCK_K); 0.95x the
loop at 8 x 2048 rows. Round 3 (ROUNDS[3] below): Triton 3.6's automatic warp specialization on
sm_90 (tl.range(warp_specialize=True) with num_warps=4: a producer warp group for the TMA loads, two
consumer warp groups for the wgmma), on a persistent kernel shaped like Triton's tutorial 09.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from bench_kernels import grouped_case  # noqa: E402
from utils import kernels, metrics, roofline  # noqa: E402


@triton.jit
def _grouped_tma_persistent_kernel(a_desc, b_desc, c_ptr, offs_ptr, G, N, K, scm, scn, MAX_ROWS,
                                   NUM_SMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """One program per SM walks the tiles of every group (tiles counted with MAX_ROWS; a tile past its
    group's rows computes nothing useful and stores nothing); the tile and K loops are flattened so the
    TMA loads of the next tile overlap this one's epilogue (Triton tutorial 09's persistent scheme)."""
    num_m, num_n = tl.cdiv(MAX_ROWS, BLOCK_M), tl.cdiv(N, BLOCK_N)
    per_group = num_m * num_n
    k_tiles = K // BLOCK_K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    zero = tl.program_id(0) * 0                  # int32 scalars, so the loop-carried types never change
    tile = tl.program_id(0) - NUM_SMS
    ki = zero - 1
    g = zero
    start = zero
    pid_m = zero
    pid_n = zero
    for _ in tl.range(0, tl.cdiv(G * per_group - tl.program_id(0), NUM_SMS) * k_tiles, flatten=True):
        ki = tl.where(ki == k_tiles - 1, 0, ki + 1)
        if ki == 0:
            tile += NUM_SMS
            g = tile // per_group
            start = tl.load(offs_ptr + g - 1, mask=g > 0, other=0)
            pid_m, pid_n = kernels._tile_of(tile % per_group, num_m, num_n, GROUP_M)
        a = a_desc.load([start + pid_m * BLOCK_M, ki * BLOCK_K])
        b = b_desc.load([g * K + ki * BLOCK_K, pid_n * BLOCK_N])
        acc = tl.dot(a, b, acc)
        if ki == k_tiles - 1:
            Mg = tl.load(offs_ptr + g) - start
            rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = (rm < Mg)[:, None] & (rn < N)[None, :]
            tl.store(c_ptr + (start + rm)[:, None] * scm + rn[None, :] * scn, acc.to(c_ptr.dtype.element_ty),
                     mask=mask)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)


@triton.jit
def _grouped_ws_persistent_kernel(a, b, c_ptr, offs_ptr, G, N, K, scm, scn, MAX_ROWS,
                                  NUM_SMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                  BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, WS: tl.constexpr,
                                  DEVICE_DESC: tl.constexpr = False, UNIFORM: tl.constexpr = False):
    """Persistent in Triton tutorial 09's shape (an outer loop over tiles, an inner one over K, not
    flattened), which Triton 3.6 warp-specializes on sm_90: a producer warp group issues every tile's
    TMA loads ahead while the consumers run this tile's wgmma and its epilogue. a and b are host-made
    TMA descriptors, or with DEVICE_DESC plain pointers whose descriptors are made here
    (tl.make_tensor_descriptor), the form tutorial 09 warp-specializes on Hopper (triton-lang/triton
    PR 7136 verified it there, not the host-descriptor one). UNIFORM (a diagnosis, valid only when every
    group has MAX_ROWS rows): no loads of offs in the loop."""
    if DEVICE_DESC:
        a_desc = tl.make_tensor_descriptor(a, shape=[tl.load(offs_ptr + G - 1), K], strides=[K, 1],
                                           block_shape=[BLOCK_M, BLOCK_K])
        b_desc = tl.make_tensor_descriptor(b, shape=[G * K, N], strides=[N, 1], block_shape=[BLOCK_K, BLOCK_N])
    else:
        a_desc = a
        b_desc = b
    num_m, num_n = tl.cdiv(MAX_ROWS, BLOCK_M), tl.cdiv(N, BLOCK_N)
    per_group = num_m * num_n
    for tile in tl.range(tl.program_id(0), G * per_group, NUM_SMS, warp_specialize=WS):
        g = tile // per_group
        if UNIFORM:
            start = g * MAX_ROWS
        else:
            start = tl.load(offs_ptr + g - 1, mask=g > 0, other=0)
        pid_m, pid_n = kernels._tile_of(tile % per_group, num_m, num_n, GROUP_M)
        acc = kernels._tma_tile_acc(a_desc, b_desc, start, g, pid_m, pid_n, K, BLOCK_M, BLOCK_N, BLOCK_K)
        if UNIFORM:
            Mg = MAX_ROWS
        else:
            Mg = tl.load(offs_ptr + g) - start
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (rm < Mg)[:, None] & (rn < N)[None, :]
        tl.store(c_ptr + (start + rm)[:, None] * scm + rn[None, :] * scn, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _grouped_tma_fixed_kernel(a_desc, b_desc, c_ptr, offs_ptr, N, K, scm, scn,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                              GROUP_M: tl.constexpr, TMA_STORE: tl.constexpr):
    """utils.kernels._grouped_tma_kernel, and with TMA_STORE its tile written by one bulk TMA store
    through a descriptor made here whose rows end at the group's end (TMA drops the rows past it), in
    place of 128 x 256 masked pointer stores (round 4)."""
    g = tl.program_id(1)
    start, Mg = kernels._group_rows(offs_ptr, g)
    pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(Mg, BLOCK_M), tl.cdiv(N, BLOCK_N)
    if pid < num_m * num_n:
        pid_m, pid_n = kernels._tile_of(pid, num_m, num_n, GROUP_M)
        acc = kernels._tma_tile_acc(a_desc, b_desc, start, g, pid_m, pid_n, K, BLOCK_M, BLOCK_N, BLOCK_K)
        if TMA_STORE:
            c_desc = tl.make_tensor_descriptor(c_ptr, shape=[start + Mg, N], strides=[scm, 1],
                                               block_shape=[BLOCK_M, BLOCK_N])
            c_desc.store([start + pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty))
        else:
            rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = (rm < Mg)[:, None] & (rn < N)[None, :]
            tl.store(c_ptr + (start + rm)[:, None] * scm + rn[None, :] * scn, acc.to(c_ptr.dtype.element_ty),
                     mask=mask)


def grouped_tma_fixed(a, b, offs, max_rows, BM, BN, BK, stages, warps, tma_store=False, GM=8):
    """The non-persistent TMA kernel at one config (no autotuning), optionally with the TMA-store epilogue."""
    G, K, N = b.shape
    assert K % BK == 0 and a.is_contiguous() and b.is_contiguous()
    c = torch.empty((a.shape[0], N), device=a.device, dtype=a.dtype)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, device=a.device, dtype=torch.int8))
    a_desc = TensorDescriptor.from_tensor(a, [BM, BK])
    b_desc = TensorDescriptor.from_tensor(b.reshape(G * K, N), [BK, BN])
    grid = (triton.cdiv(max_rows, BM) * triton.cdiv(N, BN), G)
    _grouped_tma_fixed_kernel[grid](a_desc, b_desc, c, offs, N, K, c.stride(0), c.stride(1), BLOCK_M=BM,
                                    BLOCK_N=BN, BLOCK_K=BK, GROUP_M=GM, TMA_STORE=tma_store,
                                    num_stages=stages, num_warps=warps)
    return c


def _persistent_launch(kernel, a, b, offs, max_rows, BM, BN, BK, stages, warps, GM, device_desc=False,
                       **constexprs):
    """Launch a persistent kernel taking (a, b, c, offs, G, N, K, ...): one program per SM; a and b as
    host TMA descriptors, or as the tensors themselves with device_desc."""
    G, K, N = b.shape
    assert K % BK == 0 and a.is_contiguous() and b.is_contiguous()
    c = torch.empty((a.shape[0], N), device=a.device, dtype=a.dtype)
    if device_desc:   # the descriptors are written to global scratch memory the kernel asks for
        triton.set_allocator(lambda size, align, stream: torch.empty(size, device=a.device, dtype=torch.int8))
        a_arg, b_arg = a, b
        constexprs["DEVICE_DESC"] = True
    else:
        a_arg = TensorDescriptor.from_tensor(a, [BM, BK])
        b_arg = TensorDescriptor.from_tensor(b.reshape(G * K, N), [BK, BN])
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    tiles = G * triton.cdiv(max_rows, BM) * triton.cdiv(N, BN)
    kernel[(min(sms, tiles),)](a_arg, b_arg, c, offs, G, N, K, c.stride(0), c.stride(1), max_rows,
                               NUM_SMS=min(sms, tiles), BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=GM,
                               num_stages=stages, num_warps=warps, **constexprs)
    return c


def grouped_ws_persistent(a, b, offs, max_rows, BM, BN, BK, stages, warps, ws=True, GM=8):
    return _persistent_launch(_grouped_ws_persistent_kernel, a, b, offs, max_rows, BM, BN, BK, stages, warps,
                              GM, WS=ws)


def grouped_ws_devdesc(a, b, offs, max_rows, BM, BN, BK, stages, warps, ws=True, uniform=False, GM=8):
    return _persistent_launch(_grouped_ws_persistent_kernel, a, b, offs, max_rows, BM, BN, BK, stages, warps,
                              GM, device_desc=True, WS=ws, UNIFORM=uniform)


def grouped_tma_persistent(a, b, offs, max_rows, BM, BN, BK, stages, warps, GM=8):
    return _persistent_launch(_grouped_tma_persistent_kernel, a, b, offs, max_rows, BM, BN, BK, stages, warps, GM)


# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps, warp_specialize). Round 3 on the H100: the
# non-persistent shipped kernel (utils.kernels._grouped_tma_kernel) with its K loop as
# tl.range(0, K, BLOCK_K, warp_specialize=True), (128, 256, 64, 3, 4), compiled (12 warps) but never
# finished at 8 x 2048 rows (killed by the probe's timeout), so that knob is gone and each config now
# runs in its own time-limited process.
ROUNDS = {3: [("persistent, device descriptors", grouped_ws_devdesc, (128, 256, 64, 3, 8, False)),
              ("persistent, device descriptors, warp-specialized", grouped_ws_devdesc, (128, 256, 64, 3, 4, True)),
              ("persistent, device descriptors, warp-specialized, no offs loads (uniform groups only)",
               grouped_ws_devdesc, (128, 256, 64, 3, 4, True, True)),
              ("persistent, device descriptors, warp-specialized", grouped_ws_devdesc, (256, 128, 64, 3, 4, True))]}
# Round 4 (H200): at 8 x 2048 rows the grid is 2048 tiles of 128 x 256, one CTA per SM (its
# accumulator takes the registers), so each tile's epilogue (128 x 256 masked stores) and pipeline fill
# run with nothing beside them. Two ways to shrink that: a bulk TMA store of the tile, and tiles small
# enough that two CTAs share an SM (128 x 128, 4 warps, 3 stages: 96 KiB of shared memory each); and
# BLOCK_K 128 (half the K iterations, two stages).
ROUNDS[4] = [("TMA", grouped_tma_fixed, (128, 256, 64, 3, 8, False)),
             ("TMA, TMA store", grouped_tma_fixed, (128, 256, 64, 3, 8, True)),
             ("TMA, TMA store", grouped_tma_fixed, (256, 128, 64, 3, 8, True)),
             ("TMA", grouped_tma_fixed, (128, 128, 64, 3, 4, False)),
             ("TMA, TMA store", grouped_tma_fixed, (128, 128, 64, 3, 4, True)),
             ("TMA", grouped_tma_fixed, (128, 128, 64, 3, 8, False)),
             ("TMA", grouped_tma_fixed, (128, 256, 128, 2, 8, False)),
             ("TMA, TMA store", grouped_tma_fixed, (128, 256, 128, 2, 8, True))]
# Answer (grouped_probe_round4.log in the H200 run folder; the loop 676 TFLOP/s at 8 x 2048 rows): none.
# 128 x 256 x 64 with pointer stores 647 TFLOP/s (0.96x), with the TMA store 642 (0.95x); 256 x 128 with
# the TMA store 628 (0.93x); two CTAs per SM of 128 x 128 tiles 583-590 (0.86-0.87x, the smaller tile's
# lower reuse costs more than the overlap gains); BLOCK_K 128 with two stages 508-529 (0.75-0.78x). At
# 8 x 512 and 64 x 128 rows the 128 x 256 tile with either store stays at 1.04x and 3.50-3.53x.
# Round 3a (same H100 lease as the first GEMV round 3) timed out in the non-persistent warp-specialized
# kernel; round 3b (docs/device-runs/20261123-lab05-kernels-h100/grouped_probe_round3b.log) found
# ("persistent TMA, tiles then K", grouped_ws_persistent, (128, 256, 64, 3, 8, False)) at 0.92x the loop
# at 8 x 2048 rows and its warp-specialized (128, 256, 64, 3|4, 4, True) forms without a result in 60 s.
# The flattened persistent kernel above is not warp-specialized by Triton 3.6 on sm_90 (warp_specialize=True
# there, compiled here for sm_90, gave 4 warps and 255 registers); round 2's configs were
# ("persistent TMA", grouped_tma_persistent, (BM, BN, 64, stages, warps)) for 128x256, 128x128, 256x128.
# Round 5 (H200, this session): did round 3 hang, or only compile for longer than its 45-60 s? Each
# warp-specialized config alone, 240 s each, the first call's time (compile + run) printed apart.
ROUNDS[5] = [("persistent, device descriptors, warp-specialized", grouped_ws_devdesc, (128, 256, 64, 3, 4, True)),
             ("persistent TMA, tiles then K, warp-specialized", grouped_ws_persistent, (128, 256, 64, 3, 4, True))]
# Answer (grouped_probe_round5.log in the 2026-11-24 H200 run folder): the device-descriptor form compiles
# in 2 s and runs: 0.94x the loop at 8 x 2048 rows (the shipped kernel 0.96x in the same run), 1.04x at
# 8 x 512, 3.61x at 64 x 128; the host-descriptor form hangs (no result in 240 s). Round 6: its knobs.
_WS = "persistent, device descriptors, warp-specialized"
ROUNDS[6] = [(_WS, grouped_ws_devdesc, (128, 256, 64, 4, 4, True)),
             (_WS + ", no offs loads (uniform groups only)", grouped_ws_devdesc, (128, 256, 64, 3, 4, True, True)),
             (_WS + ", GROUP_M 16", grouped_ws_devdesc, (128, 256, 64, 3, 4, True, False, 16)),
             (_WS, grouped_ws_devdesc, (128, 128, 64, 5, 4, True)),
             (_WS, grouped_ws_devdesc, (256, 128, 64, 3, 4, True)),
             ("persistent, device descriptors", grouped_ws_devdesc, (128, 256, 64, 4, 8, False))]
# Answer (grouped_probe_round6.log): the best is 0.97x at 8 x 2048 rows, warp-specialized with 4 stages
# (654 TFLOP/s) and the same persistent kernel without warp specialization, 8 warps, 4 stages (656),
# against 649 for the shipped kernel and 676 for the loop. No offs loads 0.94x, GROUP_M 16 0.96x,
# 256 x 128 0.94x. 128 x 128 x 64 with 5 stages, warp-specialized, returned NaN at every shape (a wrong
# result, not a slow one: Triton 3.6's sm_90 warp specialization, or its TMA descriptors made in the
# kernel, at that tile; the same kernel is right at the other tiles).
# Round 7: whose NaN? The same 128 x 128 x 64 tile with and without warp specialization, 5 and 3 stages.
# Answer (grouped_probe_round7.log): warp specialization's, at 5 stages only. There 127 of 4096 tiles
# held wrong elements at 8 x 2048 rows (79488 of 67M not finite), none wholly wrong (so every tile was
# stored, and parts of some were computed wrong), and likewise at the other shapes. Without warp
# specialization the 5-stage kernel is right (0.91x the loop), and so is the warp-specialized one at 3
# stages (0.82x).
ROUNDS[7] = [(_WS, grouped_ws_devdesc, (128, 128, 64, 5, 4, True)),
             ("persistent, device descriptors", grouped_ws_devdesc, (128, 128, 64, 5, 4, False)),
             (_WS, grouped_ws_devdesc, (128, 128, 64, 3, 4, True)),
             ("persistent, device descriptors", grouped_ws_devdesc, (128, 128, 64, 3, 4, False))]
SHAPES = [(8, 2048, 4096, 4096), (8, 512, 4096, 4096), (64, 128, 2048, 1408)]


def wrong_tiles(out, ref, tile) -> str:
    """Where a wrong output is wrong: its non-finite elements, and how many of its tiles hold any element
    off by more than 5 % of the output's largest (a tile never stored is all off; a computed NaN is not)."""
    bm, bn = tile
    bad = ~torch.isfinite(out.float()) | ((out.float() - ref.float()).abs() > 0.05 * ref.float().abs().max())
    rows, cols = bad.shape
    per_tile = bad[: rows // bm * bm, : cols // bn * bn].reshape(rows // bm, bm, cols // bn, bn)
    counts = per_tile.sum(dim=(1, 3))
    return (f"{int((~torch.isfinite(out.float())).sum())} non-finite of {out.numel()}; tiles wrong "
            f"{int((counts > 0).sum())} of {counts.numel()} ({int((counts == bm * bn).sum())} wholly)")


def time_config(round_: int, index: int):
    """Time ROUNDS[round_][index] at every shape (one line each); run in a child process, so a hang is
    bounded."""
    name, fn, cfg = ROUNDS[round_][index]
    for G, m, K, N in SHAPES:
        dt = torch.bfloat16
        a, b, offs, sizes, ref = grouped_case(G, m, K, N, dt)
        flop = 2 * G * m * K * N
        t_loop = roofline.time_kernel(lambda: kernels.grouped_matmul_loop(a, b, sizes), "cuda")
        try:
            import time
            t0 = time.time()
            out = fn(a, b, offs, m, *cfg)
            torch.cuda.synchronize()
            print(f"  {name} {cfg} at {G}x{m}: first call (compile + run) {time.time() - t0:.1f} s", flush=True)
            err = metrics.relative_l2(out, ref)
            assert err <= metrics.matmul_error_bound(dt, K), f"rel L2 {err:.3g}; {wrong_tiles(out, ref, cfg[:2])}"
            t = roofline.time_kernel(lambda: fn(a, b, offs, m, *cfg), "cuda")
        except Exception as exc:  # noqa: BLE001 - a config that fails is reported, not fatal
            print(f"  {name} {cfg}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        print(f"| {G}x{m}x{K}x{N} | {name} {cfg} | {flop / t / 1e12:.0f} | {t_loop / t:.2f} |", flush=True)


def main():
    import argparse
    import subprocess
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--round", type=int, choices=sorted(ROUNDS), default=max(ROUNDS), help="which round's configs")
    ap.add_argument("--config", type=int, help=argparse.SUPPRESS)    # the child process: one config
    ap.add_argument("--timeout", type=int, default=45, help="seconds each config may take (its own process)")
    args = ap.parse_args()
    if args.config is not None:
        return time_config(args.round, args.config)
    print(torch.cuda.get_device_name(0), "triton", triton.__version__, flush=True)
    print("| groups | kernel | TFLOP/s | x loop |\n|---|---|---|---|")
    for G, m, K, N in SHAPES:
        dt = torch.bfloat16
        a, b, offs, sizes, ref = grouped_case(G, m, K, N, dt)
        flop = 2 * G * m * K * N
        t_loop = roofline.time_kernel(lambda: kernels.grouped_matmul_loop(a, b, sizes), "cuda")
        t_ship = roofline.time_kernel(lambda: kernels.grouped_matmul(a, b, offs, max_rows=m), "cuda")
        print(f"| {G}x{m}x{K}x{N} | torch.matmul loop | {flop / t_loop / 1e12:.0f} | 1.00 |\n"
              f"| {G}x{m}x{K}x{N} | shipped grouped_matmul (autotuned) | {flop / t_ship / 1e12:.0f} | "
              f"{t_loop / t_ship:.2f} |", flush=True)
    for i, (name, _, cfg) in enumerate(ROUNDS[args.round]):
        try:
            subprocess.run([sys.executable, __file__, "--round", str(args.round), "--config", str(i)],
                           timeout=args.timeout, check=False)
        except subprocess.TimeoutExpired:
            print(f"  {name} {cfg}: no result in {args.timeout} s (a hang?)", flush=True)


if __name__ == "__main__":
    main()

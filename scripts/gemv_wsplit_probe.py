"""Int4 GEMV, round 23 (issue 8; a bench, not a test): split K inside the program instead of across
programs. Round 22 (gemv_tail_probe.py) measured the shipped split-K fix-up at 1.2-1.4 us, and its
group loop with no fix-up at 11.3 / 11.8 us (74 % / 71 % of copy). The fix-up exists because the
shipped tile is one warp: the six (or thirty) programs that share a column block meet only through
global memory. Here a program of W warps takes GT groups per step (a [GT, 8, BLOCK_N] tile of packed
row pairs, spread over its warps) and its split's partial sums meet in the program's own registers and
shared memory (tl.sum at the end): no workspace, no atomics, the same bits every run. SPLIT_K > 1 adds
the cross-program fix-up then shipped (gemv_probe.splitk_fixup) on top, for shapes with too few columns
to fill the GPU (18944 -> 3584: 112 column blocks of 32). The zero points are loaded through PTX: a
tl.load of them gets a layout of its own, and the tile then waits on a shared-memory conversion (and a
barrier) every step. One row per shape (ZMODE 2, timing only) drops the zero points' loads altogether.

Every config is checked against the fp32 reference and run 20 times (bits must not change) before it is
timed cold, beside the shipped kernel at its autotuned tile (32 columns, one warp, split 6 / 30).

    python scripts/gemv_wsplit_probe.py      # GPU; table $OUT/gemv_wsplit_probe.md

Answer (H200, gemv_wsplit_probe.md in the 2026-11-24 run folder): right and deterministic at every
config, slower at every config: 15.5 / 15.7 us at best against 12.7 / 13.2 us for the shipped kernel, and
15.5 / 15.0 us without the zero points' loads.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from gemv_probe import fixup_locks, splitk_fixup, write_table  # noqa: E402
from gemv_tail_probe import keep_checked, probe_shapes, probe_start, shipped_gemv, timed_rows  # noqa: E402
from utils import kernels  # noqa: E402

# (K, N) -> [(BLOCK_N, num_warps, GT groups per step, SPLIT_K)]: warps x programs near the one-wave count
# of the shipped grid (3552 / 3360 one-warp programs). Compiled for sm_90 these take 48-74 registers (64 for
# most: 32 warps an SM, 4224 on the GPU), and keep no layout conversion in the loop but a trivial one
CASES = {(3584, 18944): [(32, 4, 4, 1), (32, 4, 8, 1), (32, 4, 2, 1), (32, 2, 2, 1), (32, 2, 4, 1), (32, 2, 2, 3),
                         (32, 2, 2, 2), (32, 8, 8, 1), (64, 8, 8, 1), (64, 4, 4, 1), (16, 4, 4, 1)],
         (18944, 3584): [(32, 4, 4, 8), (32, 4, 4, 7), (32, 4, 8, 8), (32, 2, 2, 15), (32, 8, 8, 4), (64, 8, 8, 8),
                         (32, 4, 4, 4), (16, 4, 4, 4)]}
TIMING_ONLY = {(3584, 18944): (32, 4, 4, 1), (18944, 3584): (32, 4, 4, 8)}   # ZMODE 2: no zero points
SHIPPED = {(3584, 18944): 6, (18944, 3584): 30}


@triton.jit
def _wsplit_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, y_ptr, part_ptr, lock_ptr, K, N,
                   BLOCK_N: tl.constexpr, GT: tl.constexpr, SPLIT_K: tl.constexpr, ZMODE: tl.constexpr):
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    ng = K // 128
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    gi = tl.arange(0, GT)
    r8 = tl.arange(0, 8)
    x32 = x_ptr.to(tl.pointer_type(tl.int32))
    acc = tl.zeros((GT, 8, BLOCK_N), dtype=tl.float32)
    for g0 in tl.range(pid_k * GT, ng, SPLIT_K * GT, num_stages=1):
        g = g0 + gi                                             # [GT]
        gmask = g < ng
        m2 = gmask[:, None] & nmask[None, :]
        if ZMODE == 0:      # [GT, BLOCK_N] through PTX: a tl.load here gets its own layout, and the
            #                 tile then waits on a shared-memory conversion (and a barrier) every step
            zaddr = qz_ptr + tl.where(gmask, g, 0)[:, None] * (N // 8) + (tl.minimum(rn, N - 1) // 8)[None, :]
            zp = tl.inline_asm_elementwise("ld.global.nc.b32 $0, [$1];", "=r,l", [zaddr.to(tl.int64, bitcast=True)],
                                           dtype=tl.int32, is_pure=True, pack=1)
            z = (((zp >> ((rn % 8) * 4)[None, :]) & 0xF) + 1)[:, None, :]
        elif ZMODE == 1:    # loaded once per row pair, in the tile's own layout (8 x the loads, L1 hits)
            zp = tl.load(qz_ptr + g[:, None, None] * (N // 8) + (rn // 8)[None, None, :] + 0 * r8[None, :, None],
                         mask=gmask[:, None, None] & nmask[None, None, :], other=0)
            z = ((zp >> ((rn % 8) * 4)[None, None, :]) & 0xF) + 1
        else:               # not a GEMV (timing only): every zero point 8, no load
            z = tl.full((GT, 1, BLOCK_N), 8, dtype=tl.int32)
        s = tl.load(s_ptr + g[:, None] * N + rn[None, :], mask=m2, other=0.0).to(tl.float32)
        rows = tl.where(gmask[:, None], g[:, None] * 16 + 2 * r8[None, :], 0)      # [GT, 8] packed row of qa
        m3 = gmask[:, None, None] & nmask[None, None, :]
        qa = tl.load(qw_ptr + rows[:, :, None] * N + rn[None, None, :], mask=m3, other=0,
                     eviction_policy="evict_first")
        qb = tl.load(qw_ptr + (rows + 1)[:, :, None] * N + rn[None, None, :], mask=m3, other=0,
                     eviction_policy="evict_first")
        a0, a1, a2, a3 = kernels._xpairs(x32, rows)             # each [GT, 8, 1]
        b0, b1, b2, b3 = kernels._xpairs(x32, rows + 1)
        zz = ((0x6400 + z) << 16) | (0x6400 + z)
        nz = 0xD400 + (z << 4)
        nzz = (nz << 16) | nz
        part = tl.inline_asm_elementwise(
            kernels._F16X2_DOT16, "=r,r,r,r,r,r,r,r,r,r,r,r,r",
            [qa, qb, zz, nzz, a0, a1, a2, a3, b0, b1, b2, b3],
            dtype=tl.int32, is_pure=True, pack=1).to(tl.float32, bitcast=True)
        acc += part * s[:, None, :]
    y = tl.sum(tl.sum(acc, axis=1), axis=0)
    last = True
    if SPLIT_K > 1:
        y, last = splitk_fixup(y, part_ptr, lock_ptr, pid_n, pid_k, rn, nmask, N, SPLIT_K, BLOCK_N)
    if last:
        tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=nmask)


def wsplit_gemv(x, qw, qz, s, block_n: int, num_warps: int, gt: int, split_k: int, zmode: int = 0):
    """y [1, N] from the round-23 kernel at a fixed tile; fp16 x on an NVIDIA GPU (the f16x2 dequant)."""
    K, N = qw.shape[0] * 8, qw.shape[1]
    nb = triton.cdiv(N, block_n)
    y = torch.empty(N, device=x.device, dtype=x.dtype)
    part = torch.empty((split_k, N), device=x.device, dtype=torch.float32)
    locks = fixup_locks(x.device, nb)
    _wsplit_kernel[(nb, split_k)](x, qw, qz, s, y, part, locks, K, N, BLOCK_N=block_n, GT=gt, SPLIT_K=split_k,
                                  ZMODE=zmode, num_warps=num_warps, num_stages=1)
    return y.reshape(1, N)


def main():
    out, copy = probe_start("gemv_wsplit_probe", "the f16x2 dequant is PTX")
    rows = []
    for K, N, cfgs, ops, ref, qbytes, t_bf in probe_shapes(CASES):
        fns = dict([shipped_gemv(SHIPPED[K, N])])
        for bn, w, gt, sk in cfgs:
            fns[f"{bn} columns, {w} warps, {gt} groups a step, split {sk}"] = (
                lambda *o, c=(bn, w, gt, sk): wsplit_gemv(*o, *c))
        fns = keep_checked(fns, ops, ref, K, N)                 # the timing-only row is added after the checks
        fns["the first's tile, every zero point 8 (not a GEMV: timing only)"] = (
            lambda *o, c=TIMING_ONLY[K, N]: wsplit_gemv(*o, *c, zmode=2))
        rows += timed_rows(fns, ops, K, N, qbytes, t_bf)
    print("\n".join(write_table(rows, copy, out / "gemv_wsplit_probe.md")))


if __name__ == "__main__":
    main()

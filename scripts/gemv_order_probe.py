"""Int4 GEMV, round 25 (issue 8; a bench, not a test): did the shipped group loop wait for its scales
before it asked for its codes? Compiled for sm_90 (Triton 3.6, the device's), the loop of
utils.kernels._gemv_groups (until round 25) loaded a group's zero points and scales first, in a layout of their own
(one column per lane), and the tile's 4-column-per-lane layout got them through shared memory: a
barrier and a store of the scale (STS) that waited on the scale's load. The codes' loads came after that
store in the SASS, so each group made two DRAM round trips one after the other (scales, then codes)
instead of one. ORDER picks where the zero points and scales are loaded:

    0  before the codes (shipped until round 25): two round trips per group
    1  after the codes' loads in the source: all of a group's loads are in flight before the barrier
    2  one group ahead (the next group's, loaded in this iteration; the first before the loop): shipped since

Every config is checked against the fp32 reference and run 20 times (bits must not change) before it is
timed cold, beside utils.kernels.int4_gemv at the same tile.

    python scripts/gemv_order_probe.py      # GPU; table $OUT/gemv_order_probe.md

Answer (H200, gemv_order_probe_run1.md in the 2026-11-24 run folder): ORDER 2 was the fastest at the
shipped tile, 12.4 / 12.9 us against 12.5 / 13.2 us (32 columns, split 6 / 30); ORDER 1 12.9 / 13.3 us.
Every config right, no bits changing in 20 runs. ORDER 2 is now utils.kernels._gemv_groups' loop (so the
"shipped" rows equal it; gemv_order_probe.md: 12.3 / 12.8 us, ORDER 0 12.5 / 13.2 us). Most of the
second round trip was already hidden by the other warps resident on the SM.
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

# (K, N) -> (BLOCK_N, SPLIT_K) tiles, one warp each: the shipped one (32 columns, split 6 / 30) and neighbours
CASES = {(3584, 18944): [(32, 5), (32, 6), (32, 7), (64, 7)], (18944, 3584): [(32, 25), (32, 30), (32, 37), (64, 37)]}


@triton.jit
def _order_groups(x_ptr, qw_ptr, qz_ptr, s_ptr, rn, nmask, N, first, last, step,
                  GROUP: tl.constexpr, BLOCK_N: tl.constexpr, ORDER: tl.constexpr):
    """utils.kernels._gemv_groups (f16x2, one stage, ROW_ACC) with the zero points' and scales' loads at ORDER."""
    R: tl.constexpr = GROUP // 8
    r16 = tl.arange(0, R // 2)
    acc = tl.zeros((R // 2, BLOCK_N), dtype=tl.float32)
    if ORDER == 2:
        zn, sn = kernels._group_zeros_scales(qz_ptr, s_ptr, first, rn, nmask & (rn * 0 + first < last), N)
    for g in tl.range(first, last, step, num_stages=1):
        if ORDER == 0:
            z, s = kernels._group_zeros_scales(qz_ptr, s_ptr, g, rn, nmask, N)
        qa = tl.load(qw_ptr + (g * R + 2 * r16)[:, None] * N + rn[None, :], mask=nmask[None, :], other=0,
                     eviction_policy="evict_first")
        qb = tl.load(qw_ptr + (g * R + 2 * r16 + 1)[:, None] * N + rn[None, :], mask=nmask[None, :], other=0,
                     eviction_policy="evict_first")
        if ORDER == 1:
            z, s = kernels._group_zeros_scales(qz_ptr, s_ptr, g, rn, nmask, N)
        if ORDER == 2:
            z, s = zn, sn
            zn, sn = kernels._group_zeros_scales(qz_ptr, s_ptr, g + step, rn, nmask & (rn * 0 + g + step < last), N)
        acc += kernels._group_dot_f16x2(qa, qb, z, x_ptr, g, r16, GROUP) * s[None, :]
    return tl.sum(acc, axis=0)


@triton.jit
def _order_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, y_ptr, part_ptr, lock_ptr, K, N,
                  BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, ORDER: tl.constexpr):
    """utils.kernels._int4_gemv_kernel (f16x2, group 128) around _order_groups."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    ng = K // 128
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    y = _order_groups(x_ptr, qw_ptr, qz_ptr, s_ptr, rn, nmask, N, pid_k, ng, SPLIT_K, 128, BLOCK_N, ORDER)
    y, last = splitk_fixup(y, part_ptr, lock_ptr, pid_n, pid_k, rn, nmask, N, SPLIT_K, BLOCK_N)
    if last:
        bad = tl.sum(((y - y) != 0).to(tl.int32), axis=0)
        if bad > 0:
            y = kernels._gemv_exact(x_ptr, qw_ptr, qz_ptr, s_ptr, rn, nmask, N, ng, 128, BLOCK_N)
        tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=nmask)


def order_gemv(x, qw, qz, s, block_n: int, split_k: int, order: int):
    """y [1, N] from the round-25 kernel at a fixed one-warp tile; fp16 x on an NVIDIA GPU."""
    K, N = qw.shape[0] * 8, qw.shape[1]
    nb = triton.cdiv(N, block_n)
    y = torch.empty(N, device=x.device, dtype=x.dtype)
    part = torch.empty((split_k, N), device=x.device, dtype=torch.float32)
    locks = fixup_locks(x.device, nb)
    _order_kernel[(nb, split_k)](x, qw, qz, s, y, part, locks, K, N, BLOCK_N=block_n, SPLIT_K=split_k,
                                 ORDER=order, num_warps=1, num_stages=1)
    return y.reshape(1, N)


def main():
    out, copy = probe_start("gemv_order_probe", "the f16x2 dequant is PTX")
    rows = []
    for K, N, tiles, ops, ref, qbytes, t_bf in probe_shapes(CASES):
        fns = {}
        for bn, sk in tiles:
            name, f = shipped_gemv(sk)
            fns[name.replace("32 columns", f"{bn} columns")] = (
                lambda *o, bn=bn, sk=sk: kernels.int4_gemv(*o, 128, block_n=bn, split_k=sk, num_warps=1, num_stages=1))
            for order in (0, 1, 2):
                fns[f"{bn} columns, split {sk}, ORDER {order}"] = (
                    lambda *o, c=(bn, sk, order): order_gemv(*o, *c))
        fns = keep_checked(fns, ops, ref, K, N)
        rows += timed_rows(fns, ops, K, N, qbytes, t_bf)
    print("\n".join(write_table(rows, copy, out / "gemv_order_probe.md")))


if __name__ == "__main__":
    main()

"""Grouped GEMM round 8 (a bench, not a test): Gluon kernels for the 8 x 2048-row case, on the H200.

Rounds 1-7 (scripts/grouped_probe.py) left the Triton kernel at 0.95-0.97x a loop of torch.matmul at
8 x (2048 x 4096 x 4096), where every group fills the GPU alone and the loop is cuBLAS. This round
writes the kernel in Gluon (Triton's lower-level language, 3.6 on the lent GPUs), where the pipeline
and the warps' roles are ours. Two kernels:

1. `_grouped_gluon_kernel` below (rounds 8a-8c), not warp-specialized: persistent, one flat loop over
   this program's (tile, k-step) pairs keeps STAGES - 1 TMA loads in flight across tile boundaries, the
   epilogue is a TMA store left to finish in the background. Its STREAM_K option splits the last full
   wave and the remainder (between P and 2P tiles on P programs) by k-steps into P equal runs
   (stream-K, Osama et al., PPoPP 2023); a tile split between programs is finished by the one that
   arrives last at its counter, which adds the parts in program order (the same bits every run).
2. The warp-specialized kernel (rounds 8d-8e), now `utils/grouped_gluon.py` and grouped_matmul's
   "gluon" kernel: one producer warp issues every TMA load, the compute warps only wait, run the
   wgmma, hand the stage back and store. Why it was tried: scripts/gemm_power_probe.py found the H200
   held at its 700 W power cap under this row, the cuBLAS loop at 1515-1530 MHz and the Triton kernel
   at 1485-1500, and ncu counted 103 M instructions for the Triton kernel against 68 M for the loop in
   the same cycles: every warp of it issues each k-step's loads, barriers and waits.

    python scripts/grouped_gluon_probe.py [--round b|c|d|e|g]   # GPU (sm_90, Gluon); default k:
    source scripts/carried_triton.sh && python3 scripts/grouped_gluon_probe.py --round h|k   # Triton > 3.6
    git checkout 9df6e77 && python scripts/grouped_gluon_probe.py --round f  # round 8f (stream-K, below)
    git checkout 7dd2f38 && python3 scripts/grouped_gluon_probe.py --round i  # 8i; 8j: --round j, as h

Answers (H200; logs grouped_gluon_probe_8*.log in docs/device-runs/20261124-lab05-kernels-h200/; every
config right at the three shapes and on ragged groups with empty ones, the same bits on a second call):
- 8a: kernel 1 in a first form that worked out the tile at every k-step: latency-bound, 0.71x.
- 8b (twice: 8b_run1 before the TMA_STORE switch was added): kernel 1 persistent 0.90-0.91x, with the
  stream-K tail 0.88-0.89x (0.79-0.81x against 0.99-1.00x at 8 x 512 rows: its fix-up costs more than
  the half wave it fills), GROUP_M 4 0.89-0.90x; the Triton kernel 0.95-0.97x in the same runs.
- 8c: kernel 1 persistent 0.91x, one program per tile 0.90x, 4 stages with stores from registers
  0.85x, GROUP_M 16 0.91x; Triton 0.98x. Compiled for sm_90 its loop has the shape of Triton's own
  (four HGMMA.64x256x16 per k-step, one wgmma left in flight, three CTA barriers around the TMA issue).
- 8d: kernel 2 at GROUP_M 16 0.998x, at GROUP_M 8 0.995x (Triton 0.97x); 1.08x at 8 x 512 rows (Triton
  1.04x), 3.67x at 64 x 128 (Triton 3.58x).
- 8e: kernel 2 1.005x; 256 x 128 tiles 0.97x; 4 stages with stores from registers 0.91x; a 24-register
  producer 0.999x; Triton 0.96x. At 8 x 512 rows 1.085x, at 64 x 128 3.62x.
- 8f (commit 9df6e77, where utils/grouped_gluon.py had a stream_k option): kernel 2 with a stream-K
  tail (the remainder tiles, grown by whole waves until a tile has at most three contributors, split by
  k-steps; a program leaves its later k-steps of a tile in its workspace slot, the tile's first program
  waits for them, adds them in program order and stores): right on ragged groups, the same bits twice,
  and slower: 0.981x against 0.995x without at 8 x 2048 rows, 0.95x against 1.09x at 8 x 512, 2.97x
  against 3.61x at 64 x 128 (grouped_gluon_probe_8f.log). Its fp32 parts through L2 and the wait for
  them cost more than the half wave it fills, so the shipped kernel has none. An earlier form had the
  first program start from the parts, loading them into the accumulator: any write to the wgmma
  accumulator other than the wgmma's own made ptxas serialize every wgmma, 0.89x even without a split
  (8f_serialized); one in between (a tile split between two programs only, over the last 1-2 waves)
  0.98x (8f_run1).
- 8h (a Triton 3.9 carried to the H200, scripts/carried_triton.sh): a pair kernel, 2-CTA clusters that
  multicast B's tile to both CTAs, as cuBLAS does: right, and slower, 0.973x against the shipped
  kernel's 0.988x (the note above `_grouped_pair_kernel`). The shipped kernel ran right under 3.9 too.
- 8i (commit 7dd2f38, where grouped_matmul_ws had an epilogue_n knob): 4 stages, made room for by storing
  C as two 128-wide TMA stores through a 32 KB c_smem (224 KB of shared memory in all), as cuBLAS's
  kernel has 4: 0.996x against 1.004x for the shipped config in the same run; the two stores alone
  (3 stages) 1.003x; 4 stages with GROUP_M 8 0.996x. At 8 x 512 rows 1.085x against 1.081x, at 64 x 128
  3.33x against 3.64x (grouped_gluon_probe_8i.log).
- 8j (commit 7dd2f38, an l2_hints knob; a Triton 3.9 carried, whose TMA copies take an L2 eviction hint,
  3.6's none): A evict_last, C evict_first, both, and B evict_first too: 0.985-0.994x against 0.986x
  without hints in the same run, and no gain at 8 x 512 or 64 x 128 (grouped_gluon_probe_8j.log).
- 8k (a Triton 3.9 carried, as 8h): the pair kernel sharing A's tile instead (pair tiles of 128 x 512,
  B's and C's split by columns, A multicast by CTA 0: a more even split of the loads than 8h's): right
  on ragged groups, the same bits twice, and slower: 0.973x (GROUP_M 8 0.953x) against 0.992x for 8h's
  pair and 0.997x for the shipped kernel in the same run; 1.03x against 1.09x at 8 x 512; level at
  64 x 128 (3.73x against 3.76x), where 8h's 256-row pair tiles lose half (grouped_gluon_probe_8k.log).
Why these rounds end level (scripts/gemm_power_probe.py, gemm_power_probe_gluon.log and the ncu files):
under the H200's 700 W cap the shipped kernel does 2-3 % more work per clock than the cuBLAS loop (445-447
against 435-436 TFLOP/s per GHz; at ncu's fixed clock 1.133 M cycles against 1.182 M for the loop's
eight launches) and runs 2-2.5 % slower clocks (1492 against 1522-1530 MHz): the same energy per flop.
What sets the time there is energy, and the two move about the same data (DRAM 650 against 681 MB read,
L2 4.09 against 3.97 GB, 12 % more L2 sectors requested); cutting it with multicast (8h, 8k) or hints
(8j) did not gain, and the pair kernels ran at slower clocks still (1455-1485 MHz,
gemm_power_probe_pair.log): multicast does not lower the energy per flop here.
Below the cap they are level too (gemm_power_probe.py --burst, gemm_power_probe_burst*.log, two runs): in
bursts of 1-16 calls from a rested GPU the loop took 680.6-687.8 us per call and the shipped kernel
678.2-688.6 us (0.996-1.004x), against 810-824 us for both replayed at the cap in the same runs.
(The 8d and 8e logs name kernel 2's knobs as the probe's first copy of it did: GM, BM, BN for
group_m, block_m, block_n.)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: E402
    mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from utils.grouped_gluon import (BLOCK_K, BLOCK_M, BLOCK_N, COMPUTE_WARPS, GL_DTYPES, GROUP_M,  # noqa: E402
                                 PRODUCER_REGS, STAGES, TensorDescriptor, _acc_layout, _shared_buffers,
                                 _store_tile, _tile_count, _tile_origin, _tma_load, descriptors, grouped_matmul_ws)


@gluon.jit
def _item(item, pid, nprog, n_dp, sk_lo, sk_hi, D, k_tiles):
    """This program's work item `item`: (tile, first k-step, end k-step). Its data-parallel tiles pid,
    pid + nprog, ... come first, whole; then its run [sk_lo, sk_hi) of the stream-K k-steps, cut at tile
    boundaries (tile D + j // k_tiles). Called once per item, so its divisions stay out of the k loop."""
    e = item - n_dp
    t = sk_lo // k_tiles + e
    lo = gl.maximum(sk_lo - t * k_tiles, 0)
    hi = gl.minimum(sk_hi - t * k_tiles, k_tiles)
    dp = item < n_dp
    return gl.where(dp, pid + item * nprog, D + t), gl.where(dp, 0, lo), gl.where(dp, k_tiles, hi)


@gluon.jit
def _advance(p_item, p_k, p_hi, a_row, b_row, off_n, pid, nprog, n_dp, sk_lo, sk_hi, D, k_tiles, offs_ptr,
             per_group, num_m, num_n, K, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
    """The producer's next k-step; past its item's last one, the next item's first and where its A rows,
    B rows and columns start."""
    p_k += 1
    if p_k == p_hi:
        p_item += 1
        tile, p_k, p_hi = _item(p_item, pid, nprog, n_dp, sk_lo, sk_hi, D, k_tiles)
        g, start, off_m, off_n = _tile_origin(tile, offs_ptr, per_group, num_m, num_n, BLOCK_M, BLOCK_N, GROUP_M)
        a_row = start + off_m
        b_row = g * K
    return p_item, p_k, p_hi, a_row, b_row, off_n


@gluon.jit
def _issue(p, total, a_row, b_row, off_n, k, a_desc, b_desc, a_bufs, b_bufs, bars, STAGES: gl.constexpr):
    """TMA loads of k-step k (A rows from a_row, B rows from b_row) into ring slot p % STAGES."""
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    slot = p % STAGES
    pred = p < total
    bar = bars.index(slot)
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(a_desc, [a_row, k * BLOCK_K], bar, a_bufs.index(slot), pred)
    tma.async_copy_global_to_shared(b_desc, [b_row + k * BLOCK_K, off_n], bar, b_bufs.index(slot), pred)


@gluon.jit
def _finish_split_tile(acc, tile, pid, nprog, D, S, k_tiles, sk_lo, ws_ptr, cnt_ptr, c_ptr, start, off_m, off_n,
                       Mg, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, num_warps: gl.constexpr):
    """A stream-K tile split between programs p_first..p_last (by k-steps): write this part to the
    workspace (slot 0: the first tile of a program's run, slot 1: its last), count it in; the last to
    arrive adds the parts in program order, 16 rows at a time, and stores the tile."""
    layout: gl.constexpr = acc.type.layout
    j0 = (tile - D) * k_tiles
    p_first = ((j0 + 1) * nprog - 1) // S          # owner of k-step j: ((j + 1) * nprog - 1) // S
    p_last = ((j0 + k_tiles) * nprog - 1) // S
    rm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    rn = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
    slot = pid * 2 + gl.where(tile == D + sk_lo // k_tiles, 0, 1)
    gl.store(ws_ptr + slot * (BLOCK_M * BLOCK_N) + rm[:, None] * BLOCK_N + rn[None, :], acc)
    gl.thread_barrier()
    old = gl.atomic_add(cnt_ptr + (tile - D), 1, sem="acq_rel", scope="gpu")
    if old == p_last - p_first:
        CHUNK: gl.constexpr = 16
        blocked: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
        cm = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, blocked))
        cn = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, blocked))
        for r0 in range(0, BLOCK_M, CHUNK):
            s = gl.zeros([CHUNK, BLOCK_N], gl.float32, layout=blocked)
            for q in range(p_first, p_last + 1):
                q_slot = q * 2 + gl.where(tile == D + (q * S // nprog) // k_tiles, 0, 1)
                s += gl.load(ws_ptr + q_slot * (BLOCK_M * BLOCK_N) + (r0 + cm)[:, None] * BLOCK_N + cn[None, :],
                             cache_modifier=".cg")
            rows = off_m + r0 + cm
            cols = off_n + cn
            mask = (rows < Mg)[:, None] & (cols < N)[None, :]
            gl.store(c_ptr + (start + rows)[:, None] * N + cols[None, :], s.to(c_ptr.dtype.element_ty), mask=mask)
        gl.store(cnt_ptr + (tile - D), 0)          # ready for the next call


@gluon.jit
def _grouped_gluon_kernel(a_desc, b_desc, c_desc, c_ptr, offs_ptr, ws_ptr, cnt_ptr, G, N, K, MAX_ROWS, D,
                          STAGES: gl.constexpr, GROUP_M: gl.constexpr, TMA_STORE: gl.constexpr,
                          num_warps: gl.constexpr):
    """out[group rows] = A[group rows] @ B[g] for every group; A [rows, K], B viewed [G*K, N], C [rows, N]
    through TMA descriptors; tiles D.. are done stream-K (D = all tiles: none)."""
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    a_bufs, b_bufs, c_smem = _shared_buffers(a_desc, b_desc, c_desc, STAGES, TMA_STORE)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(bars.index(s), count=1)

    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    num_m = gl.cdiv(MAX_ROWS, BLOCK_M)
    num_n = gl.cdiv(N, BLOCK_N)
    per_group = num_m * num_n
    k_tiles = K // a_desc.block_type.shape[1]
    n_dp = (D - pid + nprog - 1) // nprog
    S = (G * per_group - D) * k_tiles                  # stream-K k-steps, split evenly over the programs
    sk_lo = pid * S // nprog
    sk_hi = (pid + 1) * S // nprog
    total = n_dp * k_tiles + sk_hi - sk_lo

    # the producer runs STAGES - 1 k-steps ahead of the consumer, across item boundaries; each side keeps
    # its own item and k-step, and works out an item's tile only when it reaches it
    tile, p_k, p_hi = _item(0, pid, nprog, n_dp, sk_lo, sk_hi, D, k_tiles)
    g, start, off_m, off_n = _tile_origin(tile, offs_ptr, per_group, num_m, num_n, BLOCK_M, BLOCK_N, GROUP_M)
    a_row = start + off_m
    b_row = g * K
    p_item = 0
    c_item = 0
    c_lo = p_k
    c_hi = p_hi
    c_k = p_k
    for p in gl.static_range(STAGES - 1):
        _issue(p, total, a_row, b_row, off_n, p_k, a_desc, b_desc, a_bufs, b_bufs, bars, STAGES)
        p_item, p_k, p_hi, a_row, b_row, off_n = _advance(p_item, p_k, p_hi, a_row, b_row, off_n, pid, nprog, n_dp,
                                                          sk_lo, sk_hi, D, k_tiles, offs_ptr, per_group, num_m,
                                                          num_n, K, BLOCK_M, BLOCK_N, GROUP_M)
    acc = gl.zeros((BLOCK_M, BLOCK_N), gl.float32, layout=_acc_layout(BLOCK_M, BLOCK_N, num_warps))
    for i in range(total):
        slot = i % STAGES
        mbarrier.wait(bars.index(slot), (i // STAGES) & 1)
        acc = warpgroup_mma(a_bufs.index(slot), b_bufs.index(slot), acc, use_acc=c_k != c_lo, is_async=True)
        acc = warpgroup_mma_wait(1, deps=[acc])          # iteration i - 1's wgmma is done: its slot is free
        _issue(i + STAGES - 1, total, a_row, b_row, off_n, p_k, a_desc, b_desc, a_bufs, b_bufs, bars, STAGES)
        p_item, p_k, p_hi, a_row, b_row, off_n = _advance(p_item, p_k, p_hi, a_row, b_row, off_n, pid, nprog, n_dp,
                                                          sk_lo, sk_hi, D, k_tiles, offs_ptr, per_group, num_m,
                                                          num_n, K, BLOCK_M, BLOCK_N, GROUP_M)
        c_k += 1
        if c_k == c_hi:                                   # the item's last k-step: its epilogue
            acc = warpgroup_mma_wait(0, deps=[acc])
            e_tile, e_lo, e_hi = _item(c_item, pid, nprog, n_dp, sk_lo, sk_hi, D, k_tiles)
            e_g, e_start, e_off_m, e_off_n = _tile_origin(e_tile, offs_ptr, per_group, num_m, num_n, BLOCK_M,
                                                          BLOCK_N, GROUP_M)
            Mg = gl.load(offs_ptr + e_g) - e_start
            if (e_lo == 0) & (e_hi == k_tiles):
                _store_tile(acc, c_desc, c_ptr, c_smem, e_start, e_off_m, e_off_n, Mg, N, TMA_STORE)
            else:
                _finish_split_tile(acc, e_tile, pid, nprog, D, S, k_tiles, sk_lo, ws_ptr, cnt_ptr, c_ptr, e_start,
                                   e_off_m, e_off_n, Mg, N, BLOCK_M, BLOCK_N, num_warps)
            c_item += 1
            n_tile, c_lo, c_hi = _item(c_item, pid, nprog, n_dp, sk_lo, sk_hi, D, k_tiles)
            c_k = c_lo
    tma.store_wait(0)
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(s))


_STATE: dict = {}


def stream_k_start(tiles: int, programs: int) -> int:
    """The first stream-K tile: none (all tiles) when the tiles fill whole waves, else the last full
    wave and the remainder go stream-K (between `programs` and 2 x `programs` tiles)."""
    if tiles % programs == 0:
        return tiles
    return (tiles // programs - 1) * programs


def grouped_gluon(a, b, offs, max_rows, BM=128, BN=256, BK=64, stages=3, warps=8, stream_k=False, GM=8,
                  tma_store=True, persistent=True):
    """The Gluon grouped GEMM at one config: a [rows, K], b [G, K, N] (K % BK == 0), offs int32 row ends.
    persistent=False: one program per tile (the hardware schedules them), the same kernel otherwise."""
    G, K, N = b.shape
    assert K % BK == 0 and a.is_contiguous() and b.is_contiguous() and a.dtype in GL_DTYPES
    c = torch.empty((a.shape[0], N), device=a.device, dtype=a.dtype)
    a_desc, b_desc, c_desc = descriptors(a, b, c, BM, BN, BK)
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    tiles = G * triton.cdiv(max_rows, BM) * triton.cdiv(N, BN)
    programs = min(sms, tiles) if persistent else tiles
    D = stream_k_start(tiles, programs) if stream_k else tiles
    key = (a.device, programs, BM, BN, tiles - D)
    if key not in _STATE:                       # workspace: 2 partial tiles a program; counters: 1 a tile
        _STATE[key] = (torch.empty(max(programs * 2 * BM * BN, 1), device=a.device, dtype=torch.float32),
                       torch.zeros(max(tiles - D, 1), device=a.device, dtype=torch.int32))
    ws, cnt = _STATE[key]
    _grouped_gluon_kernel[(programs,)](a_desc, b_desc, c_desc, c, offs, ws, cnt, G, N, K, max_rows, D,
                                       STAGES=stages, GROUP_M=GM, TMA_STORE=tma_store, num_warps=warps)
    return c


# --- Round 8h: the pair kernel, two CTAs of a cluster sharing B's tile through TMA multicast -------------
#
# What the cuBLAS loop has that the shipped kernel lacks (scripts/gemm_power_probe.py): 2-CTA clusters in
# which one TMA load of B's tile lands in both CTAs' shared memory, so B crosses L2 once for 256 rows of
# A instead of twice; under the H200's 700 W cap, L2 traffic is energy and energy is clock. Gluon emits
# multicast on Hopper only in Tritons newer than 3.6, the lent GPUs' own (`tma.async_load(...,
# multicast=True)`), so this round runs under a carried Triton 3.9 (scripts/carried_triton.sh).
#
# One program is a cluster of two CTAs and a PAIR tile of 256 x 256: A's [256 x 64] k-step splits by
# rows (CTA 0 the first 128, CTA 1 the next), B's [64 x 256] is broadcast (one multicast load, issued by
# CTA 0, lands in both), C's [256 x 256] splits like A. Hand-offs:
# - `ready[s]` (each CTA its own): its A and the multicast B of stage s landed;
# - `mine[s]` (each CTA its own): its compute warps are done with stage s, so its A may be reloaded;
# - `pair[s]` (one barrier in CTA 0, both CTAs' compute warps arrive): both are done with stage s, so
#   CTA 0 may multicast the next B into both. Only CTA 0 waits on it.
# Answer (H200, Triton 3.9 carried, grouped_gluon_probe_8h.log): right on ragged groups, the same bits
# twice, and slower: 0.973x the loop at 8 x 2048 rows (GROUP_M 4 / 16 pairs: 0.965x / 0.982x) against
# 0.988x for the shipped kernel in the same run, 1.04x against 1.09x at 8 x 512, 2.2x against 3.8x at
# 64 x 128 (half of each 256-row pair tile is past a 128-row group). Halving B's L2 traffic does not
# pay for CTA 1 waiting on CTA 0's loads and both waiting on the slower of the two every k-step.
# Round 8k, share_a (SHARE_A): the pair tile is 128 x 512 instead, A's [128 x 64] broadcast by CTA 0 and
# B's [64 x 512] and C split by columns, so CTA 1 loads its own 32 KB of B and CTA 0 16 KB more than it
# (8h: 32 KB more): 0.973x against 0.992x for 8h's pair and 0.997x as shipped (grouped_gluon_probe_8k.log).

def _has_multicast() -> bool:
    import inspect
    return "multicast" in inspect.signature(tma.async_load).parameters if hasattr(tma, "async_load") else False


HAS_MULTICAST = _has_multicast()
PAIR_GROUP_M = GROUP_M // 2           # pair tiles side by side: the same 16 CTA row-tiles as above


@gluon.constexpr_function
def _pair_acc_layout(pair_n, num_warps, share_a):
    """The pair's wgmma accumulator: each CTA 128 rows (share_a: all 128 rows, half the pair's columns)."""
    if share_a:
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                         instr_shape=[16, pair_n // 2, 16], cga_layout=[[0, 1]])
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, pair_n, 16],
                                     cga_layout=[[1, 0]])


@gluon.jit
def _pair_producer(a_desc, b_desc, a_bufs, b_bufs, ready, mine, pair, offs_ptr, G, N, K, MAX_ROWS,
                   GROUP_M: gl.constexpr, STAGES: gl.constexpr, SHARE_A: gl.constexpr):
    """One warp in each CTA: its own part of the operand the pair splits; CTA 0 also the shared one
    (B's tile, or A's with SHARE_A), multicast to both."""
    PAIR_M: gl.constexpr = a_desc.block_shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_shape[1]
    num_m, num_n, per_group, total = _tile_count(G, MAX_ROWS, N, PAIR_M, BLOCK_N)
    k_tiles = K // BLOCK_K
    p = 0
    for tile in range(gl.program_id(0), total, gl.num_programs(0)):
        g, start, off_m, off_n = _tile_origin(tile, offs_ptr, per_group, num_m, num_n, PAIR_M, BLOCK_N, GROUP_M)
        for k in range(k_tiles):
            slot = p % STAGES
            phase = ((p // STAGES) & 1) ^ 1
            mbarrier.wait(mine.index(slot), phase)      # this CTA's compute warps freed it
            mbarrier.wait(pair.index(slot), phase)      # CTA 0 only: both CTAs' compute warps freed it
            mbarrier.expect(ready.index(slot), a_desc.nbytes_per_cta + b_desc.nbytes_per_cta)
            _tma_load(a_desc, [start + off_m, k * BLOCK_K], ready.index(slot), a_bufs.index(slot),
                      multicast=SHARE_A)
            _tma_load(b_desc, [g * K + k * BLOCK_K, off_n], ready.index(slot), b_bufs.index(slot),
                      multicast=not SHARE_A)
            p += 1


@gluon.jit
def _pair_compute(a_bufs, b_bufs, ready, mine, pair, c_desc, c_ptr, c_smem, offs_ptr, G, N, K, MAX_ROWS,
                  GROUP_M: gl.constexpr, STAGES: gl.constexpr, SHARE_A: gl.constexpr, num_warps: gl.constexpr):
    """Each CTA's compute warps: its 128 x 256 of the pair tile (its rows; with SHARE_A its columns),
    handing each stage back to both barriers."""
    PAIR_M: gl.constexpr = c_desc.block_shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_shape[1]
    BLOCK_K: gl.constexpr = a_bufs.type.shape[2]
    num_m, num_n, per_group, total = _tile_count(G, MAX_ROWS, N, PAIR_M, BLOCK_N)
    k_tiles = K // BLOCK_K
    acc_layout: gl.constexpr = _pair_acc_layout(BLOCK_N, num_warps, SHARE_A)
    acc = gl.zeros((PAIR_M, BLOCK_N), gl.float32, layout=acc_layout)
    c = 0
    for tile in range(gl.program_id(0), total, gl.num_programs(0)):
        for k in range(k_tiles):
            slot = c % STAGES
            mbarrier.wait(ready.index(slot), (c // STAGES) & 1)
            acc = warpgroup_mma(a_bufs.index(slot), b_bufs.index(slot), acc, use_acc=k > 0, is_async=True)
            acc = warpgroup_mma_wait(1, deps=[acc])
            if k > 0:                                   # the step before is done: its stage is free
                mbarrier.arrive(mine.index((c - 1) % STAGES), count=1)
                mbarrier.arrive(pair.index((c - 1) % STAGES), count=1)
            c += 1
        acc = warpgroup_mma_wait(0, deps=[acc])
        mbarrier.arrive(mine.index((c - 1) % STAGES), count=1)
        mbarrier.arrive(pair.index((c - 1) % STAGES), count=1)
        g, start, off_m, off_n = _tile_origin(tile, offs_ptr, per_group, num_m, num_n, PAIR_M, BLOCK_N, GROUP_M)
        Mg = gl.load(offs_ptr + g) - start
        _store_tile(acc, c_desc, c_ptr, c_smem, start, off_m, off_n, Mg, N, True)
    tma.store_wait(0)


@gluon.jit
def _grouped_pair_kernel(a_desc, b_desc, c_desc, c_ptr, offs_ptr, G, N, K, MAX_ROWS, STAGES: gl.constexpr,
                         GROUP_M: gl.constexpr, PRODUCER_REGS: gl.constexpr, SHARE_A: gl.constexpr,
                         num_warps: gl.constexpr):
    """Persistent, warp-specialized, one program a 2-CTA cluster (see the note above)."""
    dtype: gl.constexpr = a_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_shape, b_desc.layout)
    c_smem = gl.allocate_shared_memory(dtype, c_desc.block_shape, c_desc.layout)
    ready = mbarrier.allocate_mbarrier(batch=STAGES)
    mine = mbarrier.allocate_mbarrier(batch=STAGES)
    pair = mbarrier.allocate_mbarrier(batch=STAGES, two_ctas=True)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(mine.index(s), count=1)
        mbarrier.init(pair.index(s), count=1)       # counted per CTA: two arrivals in all
    gl.warp_specialize([
        (_pair_compute, (a_bufs, b_bufs, ready, mine, pair, c_desc, c_ptr, c_smem, offs_ptr, G, N, K, MAX_ROWS,
                         GROUP_M, STAGES, SHARE_A, num_warps)),
        (_pair_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, mine, pair, offs_ptr, G, N, K, MAX_ROWS, GROUP_M,
                          STAGES, SHARE_A)),
    ], [1], [PRODUCER_REGS])


def pair_descriptors(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, block_m: int, block_n: int, block_k: int,
                     share_a: bool = False):
    """The pair kernel's TMA descriptors: A's and C's pair tiles split by rows over the two CTAs
    (cga_layout [[1, 0]]), B's tile broadcast to both ([[0, 0]]); with share_a, B's and C's split by
    columns ([[0, 1]]) and A's broadcast."""
    G, K, N = b.shape
    dt = GL_DTYPES[a.dtype]
    lay = gl.NVMMASharedLayout.get_default_for
    bcast = [[0, 0]]
    split = [[0, 1]] if share_a else [[1, 0]]
    pm, pn = (block_m, 2 * block_n) if share_a else (2 * block_m, block_n)
    return (TensorDescriptor.from_tensor(a, [pm, block_k], lay([pm, block_k], dt,
                                                              cga_layout=bcast if share_a else split)),
            TensorDescriptor.from_tensor(b.reshape(G * K, N), [block_k, pn],
                                         lay([block_k, pn], dt, cga_layout=split if share_a else bcast)),
            TensorDescriptor.from_tensor(c, [pm, pn], lay([pm, pn], dt, cga_layout=split)))


def grouped_matmul_pair(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, max_rows: int,
                        block_m: int = BLOCK_M, block_n: int = BLOCK_N, block_k: int = BLOCK_K,
                        stages: int = STAGES, warps: int = COMPUTE_WARPS, group_m: int = PAIR_GROUP_M,
                        producer_regs: int = PRODUCER_REGS, share_a: bool = False) -> torch.Tensor:
    """`grouped_matmul_ws` with B's tiles (share_a: A's) multicast over 2-CTA clusters (needs HAS_MULTICAST)."""
    if not HAS_MULTICAST:
        raise RuntimeError(f"the pair kernel needs a Triton whose Gluon TMA loads multicast (this is "
                           f"{triton.__version__}); use grouped_matmul_ws")
    G, K, N = b.shape
    c = torch.empty((a.shape[0], N), device=a.device, dtype=a.dtype)
    a_desc, b_desc, c_desc = pair_descriptors(a, b, c, block_m, block_n, block_k, share_a)
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    pm, pn = (block_m, 2 * block_n) if share_a else (2 * block_m, block_n)
    tiles = G * triton.cdiv(max(max_rows, 1), pm) * triton.cdiv(N, pn)
    _grouped_pair_kernel[(min(sms // 2, tiles),)](a_desc, b_desc, c_desc, c, offs, G, N, K, max_rows,
                                                 STAGES=stages, GROUP_M=group_m, PRODUCER_REGS=producer_regs,
                                                 SHARE_A=share_a, num_warps=warps, num_ctas=2)
    return c


# Round 8a (H200, grouped_gluon_probe_8a.log): a first form that worked out the tile (divisions and a
# load of offs) at every k-step ran latency-bound: 0.71x the loop at 8 x 2048 rows. Worked out once per
# item, as now: round 8b, then 8c.
ROUNDS = {"k": [("Gluon warp-specialized", grouped_matmul_ws, dict()),
                ("Gluon pair, B multicast (round h)", grouped_matmul_pair, dict()),
                ("Gluon pair, A multicast (128 x 512 pair tiles)", grouped_matmul_pair, dict(share_a=True, group_m=16)),
                ("Gluon pair, A multicast, GROUP_M 8", grouped_matmul_pair, dict(share_a=True, group_m=8))],
          "h": [("Gluon warp-specialized", grouped_matmul_ws, dict()),
                ("Gluon pair (2-CTA cluster, B multicast)", grouped_matmul_pair, dict()),
                ("Gluon pair, GROUP_M 4 pairs", grouped_matmul_pair, dict(group_m=4)),
                ("Gluon pair, GROUP_M 16 pairs", grouped_matmul_pair, dict(group_m=16))],
          "g": [("Gluon warp-specialized", grouped_matmul_ws, dict()),
                ("Gluon warp-specialized, BLOCK_K 32, 6 stages", grouped_matmul_ws, dict(block_k=32, stages=6)),
                ("Gluon warp-specialized, BLOCK_K 32, 5 stages", grouped_matmul_ws, dict(block_k=32, stages=5))],
          "e": [("Gluon warp-specialized", grouped_matmul_ws, dict()),
                ("Gluon warp-specialized, 256 x 128", grouped_matmul_ws, dict(block_m=256, block_n=128)),
                ("Gluon warp-specialized, 4 stages, stores from registers", grouped_matmul_ws,
                 dict(stages=4, tma_store=False)),
                ("Gluon warp-specialized, producer 24 registers", grouped_matmul_ws, dict(producer_regs=24))],
          "d": [("Gluon warp-specialized, GROUP_M 16", grouped_matmul_ws, dict()),
                ("Gluon warp-specialized, GROUP_M 8", grouped_matmul_ws, dict(group_m=8)),
                ("Gluon persistent, GROUP_M 16", grouped_gluon, dict(stages=3, GM=16))],
          "b": [("Gluon persistent, pipelined across tiles", grouped_gluon, dict(stages=3)),
                ("Gluon persistent + stream-K tail", grouped_gluon, dict(stages=3, stream_k=True)),
                ("Gluon persistent, pipelined across tiles, GROUP_M 4", grouped_gluon, dict(stages=3, GM=4)),
                ("Gluon persistent + stream-K tail, 256 x 128", grouped_gluon, dict(BM=256, BN=128, stages=3, stream_k=True))],
          "c": [("Gluon persistent", grouped_gluon, dict(stages=3)),
                ("Gluon one program per tile", grouped_gluon, dict(stages=3, persistent=False)),
                ("Gluon persistent, 4 stages, stores from registers", grouped_gluon, dict(stages=4, tma_store=False)),
                ("Gluon one program per tile, 4 stages, stores from registers",
                 grouped_gluon, dict(stages=4, tma_store=False, persistent=False)),
                ("Gluon persistent, GROUP_M 16", grouped_gluon, dict(stages=3, GM=16))]}
SHAPES = [(8, 2048, 4096, 4096), (8, 512, 4096, 4096), (64, 128, 2048, 1408)]


def check_tiles(out, ref, K, what):
    """bench_kernels.check (relative L2 against the loop), and no element anywhere off by more than 5 %
    of the output's largest: one wrong tile of 2048 moves the relative L2 only about as much as its bound."""
    from bench_kernels import check
    check(out, ref, torch.bfloat16, K, what)
    bad = int((~torch.isfinite(out.float()) | ((out.float() - ref.float()).abs() > 0.05 * ref.float().abs().max())).sum())
    if bad:
        raise SystemExit(f"{what}: {bad} elements wrong: not timing a wrong kernel")


def check_ragged(configs):
    """Ragged groups (some empty, some not a multiple of BLOCK_M): every config against the loop, twice."""
    from utils import kernels
    sizes = [0, 300, 2048, 1, 777, 0, 1500, 128]
    K, N = 1024, 768
    a = torch.randn(sum(sizes), K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(len(sizes), K, N, device="cuda", dtype=torch.bfloat16)
    ref = kernels.grouped_matmul_loop(a, b, sizes)
    offs = kernels.group_offsets(sizes, "cuda")
    for name, fn, cfg in configs:
        out = fn(a, b, offs, max(sizes), **cfg)
        check_tiles(out, ref, K, f"{name} (ragged groups)")
        again = fn(a, b, offs, max(sizes), **cfg)
        assert torch.equal(out, again), f"{name}: two calls differ"
        print(f"  ragged groups {sizes}: {name} right, the same bits twice", flush=True)


def main():
    from bench_kernels import bench_interleaved, grouped_case, warm_up
    from utils import kernels
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--round", choices=sorted(ROUNDS), default="k", help="which round's configs")
    args = ap.parse_args()
    configs = ROUNDS[args.round]
    print(torch.cuda.get_device_name(0), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    check_ragged(configs)
    warm_up()
    print("| groups | kernel | us | TFLOP/s | x loop |\n|---|---|---|---|---|", flush=True)
    for G, m, K, N in SHAPES:
        a, b, offs, sizes, ref = grouped_case(G, m, K, N)
        fns = {"torch.matmul loop": lambda: kernels.grouped_matmul_loop(a, b, sizes),
               "shipped grouped_matmul": lambda: kernels.grouped_matmul(a, b, offs, max_rows=m)}
        for name, fn, cfg in configs:
            check_tiles(fn(a, b, offs, m, **cfg), ref, K, name)
            fns[f"{name} {cfg}"] = lambda fn=fn, cfg=cfg: fn(a, b, offs, m, **cfg)
        t = bench_interleaved(fns)
        flop = 2 * G * m * K * N
        for name, ms in t.items():
            print(f"| {G}x{m}x{K}x{N} | {name} | {ms * 1e3:.1f} | {flop / (ms * 1e-3) / 1e12:.0f} | "
                  f"{t['torch.matmul loop'] / ms:.3f} |", flush=True)


if __name__ == "__main__":
    main()

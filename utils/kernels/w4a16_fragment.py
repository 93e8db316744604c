"""The W4A16 kernel with the weight read straight into the tensor cores' operand layout: `w4a16_matmul`'s
"fragment" unpacking, written in Gluon. It runs on NVIDIA GPUs from Ampere on (sm_80+) and is the default
on Hopper, where it was measured (docs/device-runs/20261127-w4a16-fragment-h100/).

Why: in the Triton kernel (w4a16_kernels.py) each thread unpacks the words it loaded, but the tile product
wants every thread to hold other elements (its fragment of the mma's A operand: for row n, the K columns
2t, 2t+1, 2t+8, 2t+9 of each 16, t = lane % 4). The compiler moves the unpacked tile through shared
memory to get there: stores, ldmatrix loads and barriers on every K step, more instructions than the
unpacking itself. Marlin avoids the move by repacking the weight offline. This kernel keeps GPTQ's layout
and instead renames K inside each 32-column block: a sum over K does not care in which order its terms
come, so logical column 32b + 16h + 8p + 2t + r is taken to be physical row 32b + 8t + 4r + 2h + p.
Then the eight codes of one packed word (physical rows 32b + 8t .. + 7) are exactly the eight K columns
that lane t needs in block b, and x's B fragment (the same K columns of row m) is one 16-byte load of
x[m, 32b + 8t ..]. Each thread loads its words, unpacks them in PTX (two codes per 32-bit instruction,
the reference's single rounding: s * (q - z)), and the result already *is* the operand: both layout
conversions compile to nothing (asserted in the kernel), and no unpacked weight goes through shared memory.

The layouts are spelled out (Gluon's DistributedLinearLayout): lanes 0-1 pick the word within a 32-row
block (t), lanes 2-4 the row n mod 8 (for x: the row m mod 8), a register n + 8 (m + 8) and, at 128
columns, n + 64, the warps n + 16 and n + 32 (x: the same for every warp), registers the blocks b and a
word's eight rows. The product is mma.sync (m16n8k16) with both operands in registers: Hopper's wgmma
wants x in shared memory, and staging it there lost (the kept run). At one row the next step's words,
zero points and scales are loaded into registers while one step computes. From 2 rows those registers
are what limits how many programs fit an SM, so the packed bytes are streamed instead: cp.async copies
each step into a ring of slots in shared memory two steps ahead, and each thread loads its words back
in the same fragment layout (w4a16_layouts.py; RING_ROWS). Every warp would load the same x there, so x
goes through shared memory too, read once per program and step (X_SHARED, SHARED_X_FROM). The bits are the
same either way. Split-K partials are summed in a fixed order by each column block's last program (LAST_SUM)
or by the Triton kernel's sum kernel: the same bits. Only fp16 scales, one
group per 32 rows (group 32, 64, 128, ...), K a multiple of 128, no act-order: w4a16.py falls back to the
Triton kernel otherwise.
"""
from __future__ import annotations

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier     # renamed after Triton 3.6
    from .w4a16_layouts import (acc_layout, async_load, ring_issue, ring_read, step_loads, unpack_fragment, word_layout,
                                x_fragment, x_global_layout, x_layout, x_rows)
except ImportError:            # a Triton without Gluon or its mma_v2 (< 3.6): the Triton kernel serves
    gluon = None

BLOCK_N, BLOCK_K, WARPS = 128, 128, 4                  # two 16-row slabs of n per warp (BLOCK_N: 64 or 128)
DEPTH = 1                                              # K steps' loads in flight ahead of the one computed
# Programs that fit an SM at once (sm_90, Triton 3.6): the split-K fills one wave of them and no more, so no
# call runs a partial second wave (kept run 20261127-w4a16-waves-h100: gate/up at one row 20.3 us with 592
# programs for 528 places, 17.7 with 444; down at 2 rows 22.5 with 532 for 396, 19.5 with 392). The plain
# kernel: 4 at one row (the register loop's 128 registers a thread), 5 from 2 rows (the ring's 96 registers
# and 39 KB of shared memory); the gated one: 5 from 2 rows, 6 at one row (79 registers, 27 KB).
PROGRAMS_PER_SM, GATED_PROGRAMS_PER_SM = 4, 5
# From 2 rows x is read once per program and step into shared memory for all four warps, not by each warp;
# one row is compiled apart (15 rows' loads dropped). The same bits either way. A setting a benchmark flips.
SHARED_X_FROM = 2
# A tile's num_stages from RING_FROM on: the weight streamed through a ring of that many slots in shared memory
# (cp.async), so bytes stay in flight without holding registers; below it, loaded into registers num_stages
# (1 or 2) steps ahead. At most MAX_STAGES slots.
RING_FROM, MAX_STAGES = 3, 8
# A call gets the ring from RING_ROWS rows, of RING_STAGES slots: with x through shared memory too, 96 registers
# a thread instead of 157-164 with the next step's words in registers, so 5 programs fit an SM instead of 3;
# from 2 to 16 rows faster (kept runs 20261127-w4a16-ring-h100 runs 1-2, 20261127-w4a16-waves-h100). At one
# row the register loop is faster (its step is short; the ring adds a barrier and loads back from shared
# memory). More slots: fewer programs per SM, slower.
RING_ROWS, RING_STAGES = 2, 3
# Split-K partials are summed by each column block's last program to arrive, one launch less than the sum kernel
# and the same order (the same bits), where that program can read the others' partials all at once: at most
# LAST_SUM_REGS registers a thread for them (a one-row call reads one element a thread per partial, 16 rows the
# whole tensor-core tile). Beyond that one program would read what the sum kernel spreads over the GPU.
# LAST_SUM: a setting benchmarks flip.
LAST_SUM, LAST_SUM_REGS = True, 64
# The gated kernel takes the ring at one row too: it holds two weights' next words, so the registers freed
# matter more (124 -> 79 a thread; kept run 20261127-host-split-h100, run5).
GATED_RING_ROWS = (1,)


def uses_ring(M: int, gated: bool = False) -> bool:
    """Whether a call of M rows gets the ring by default (the same bits either way)."""
    return M >= RING_ROWS or (gated and M in GATED_RING_ROWS)


def last_sum(M: int, split_k: int, block_n: int, gated: bool = False) -> bool:
    """Whether a call of M rows sums its split-K partials in its last program (LAST_SUM_REGS) or in the sum kernel."""
    rows = 1 if M == 1 else 16
    per_partial = max(1, block_n * rows // (32 * WARPS))
    return LAST_SUM and split_k > 1 and split_k * (2 if gated else 1) * per_partial <= LAST_SUM_REGS


def other_way(num_stages: int) -> int:
    """The num_stages that moves the weight the other way (the same bits): the register loop's for a ring,
    the default ring's for the register loop. What benchmarks time beside a tile."""
    return DEPTH if num_stages >= RING_FROM else RING_STAGES


def pipeline(M: int, num_stages: int) -> dict:
    """The kernel's constexprs for a call of M rows at a tile's num_stages: DEPTH, STAGES, X_SHARED."""
    ring = num_stages >= RING_FROM
    return dict(DEPTH=1 if ring else num_stages, STAGES=num_stages if ring else 0,
                X_SHARED=M >= SHARED_X_FROM and (ring or num_stages == 1))


if gluon is not None:
    @gluon.jit
    def _ring_loop(x_ptr, qw_ptr, qz_ptr, s_ptr, qw2_ptr, qz2_ptr, s2_ptr, M, N, stride_xm, pid_n, first, last, zshift,
                   GROUP: gl.constexpr, ZP_ADD: gl.constexpr, BLOCK_M: gl.constexpr, BN: gl.constexpr,
                   STAGES: gl.constexpr, GATED: gl.constexpr, X_SHARED: gl.constexpr, LQ: gl.constexpr,
                   LX: gl.constexpr, MMA: gl.constexpr):
        """Steps first..last-1 with the weight streamed through a ring of STAGES slots in shared memory
        (cp.async, STAGES - 1 steps ahead, one barrier a step); x too when X_SHARED, else each warp loads
        its own one step ahead. The products and their order are the register loop's: the same bits."""
        NW: gl.constexpr = gl.num_warps()
        BK: gl.constexpr = 128
        NB: gl.constexpr = BK // 32
        NBG: gl.constexpr = 1 if GROUP >= BK else NB            # group rows a step reads
        A: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
        B: gl.constexpr = gl.DotOperandLayout(1, MMA, 2)
        dtype: gl.constexpr = x_ptr.dtype.element_ty
        plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
        # rows t of a word block at banks 8t apart: the warp's 4 x 8 words of one load are conflict-free
        swizzled: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 4, order=[2, 1, 0])
        ring_w = gl.allocate_shared_memory(gl.int32, [STAGES, NB, 4, BN], swizzled)
        ring_z = gl.allocate_shared_memory(gl.int32, [STAGES, NBG, BN], plain)
        ring_s = gl.allocate_shared_memory(s_ptr.dtype.element_ty, [STAGES, NBG, BN], plain)
        ring_w2 = ring_w
        ring_z2 = ring_z
        ring_s2 = ring_s
        if GATED:
            ring_w2 = gl.allocate_shared_memory(gl.int32, [STAGES, NB, 4, BN], ring_w.layout)
            ring_z2 = gl.allocate_shared_memory(gl.int32, [STAGES, NBG, BN], plain)
            ring_s2 = gl.allocate_shared_memory(s_ptr.dtype.element_ty, [STAGES, NBG, BN], plain)
        if X_SHARED:
            grow, gmask = x_rows(x_ptr, stride_xm, M, x_global_layout(BLOCK_M, NB, NW), BLOCK_M, NB)
            ring_x = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, NB, 4, 8],
                                               gl.SwizzledSharedLayout(1, 1, 1, order=[3, 2, 0, 1]))
        else:
            xrow, xmask = x_rows(x_ptr, stride_xm, M, LX, BLOCK_M, NB)
            xv = gl.load(xrow + gl.minimum(first, last - 1) * BK, mask=xmask, other=0.0)
        for i in gl.static_range(STAGES - 1):
            ok = first + i < last
            ring_issue(ring_w, ring_z, ring_s, i, qw_ptr, qz_ptr, s_ptr, pid_n, first + i, ok, N, GROUP)
            if GATED:
                ring_issue(ring_w2, ring_z2, ring_s2, i, qw2_ptr, qz2_ptr, s2_ptr, pid_n, first + i, ok, N, GROUP)
            if X_SHARED:
                async_load(ring_x.index(i), grow + (first + i) * BK, mask=gmask & ok)
            async_copy.commit_group()
        acc = gl.zeros((BN, BLOCK_M), gl.float32, layout=MMA)
        acc2 = gl.zeros((BN, BLOCK_M), gl.float32, layout=MMA)
        for kb in range(first, last):
            slot = (kb - first) % STAGES
            async_copy.wait_group(STAGES - 2)          # this thread's copies of step kb have landed
            cta_barrier()                              # everyone's, and slot kb - 1 is read by all warps
            kn = kb + STAGES - 1
            fill = (kb - first + STAGES - 1) % STAGES
            ring_issue(ring_w, ring_z, ring_s, fill, qw_ptr, qz_ptr, s_ptr, pid_n, kn, kn < last, N, GROUP)
            if GATED:
                ring_issue(ring_w2, ring_z2, ring_s2, fill, qw2_ptr, qz2_ptr, s2_ptr, pid_n, kn, kn < last, N, GROUP)
            if X_SHARED:
                async_load(ring_x.index(fill), grow + kn * BK, mask=gmask & (kn < last))
                xv = ring_x.index(slot).load(LX)
            else:
                xn = gl.load(xrow + gl.minimum(kb + 1, last - 1) * BK, mask=xmask, other=0.0)
            async_copy.commit_group()
            xf = x_fragment(xv, B)
            q, zw, s = ring_read(ring_w, ring_z, ring_s, slot, LQ)
            acc = mma_v2(unpack_fragment(q, zw, s, zshift, ZP_ADD, A, dtype), xf, acc)
            if GATED:
                q2, zw2, s2 = ring_read(ring_w2, ring_z2, ring_s2, slot, LQ)
                acc2 = mma_v2(unpack_fragment(q2, zw2, s2, zshift, ZP_ADD, A, dtype), xf, acc2)
            if not X_SHARED:
                xv = xn
        async_copy.wait_group(0)                       # no copy outlives the program
        return acc, acc2

    @gluon.jit
    def _silu_mul(g, u, out_dtype: gl.constexpr):
        """As w4a16_kernels._silu_mul: each sum rounded to the output dtype, then silu(g) * u in fp32."""
        g = g.to(out_dtype).to(gl.float32)
        u = u.to(out_dtype).to(gl.float32)
        return (g * (1 / (1 + gl.exp(-g))) * u).to(out_dtype)

    @gluon.jit
    def _register_loop(x_ptr, qw_ptr, qz_ptr, s_ptr, qw2_ptr, qz2_ptr, s2_ptr, M, N, stride_xm, pid_n, first, last,
                       zshift, GROUP: gl.constexpr, ZP_ADD: gl.constexpr, BLOCK_M: gl.constexpr, BN: gl.constexpr,
                       DEPTH: gl.constexpr, GATED: gl.constexpr, X_SHARED: gl.constexpr, LQ: gl.constexpr,
                       LX: gl.constexpr, MMA: gl.constexpr):
        """Steps first..last-1 with each step's words, zero words and scales loaded into registers DEPTH
        steps ahead; x by each warp (DEPTH steps ahead), or when X_SHARED once per program and step into a
        double buffer in shared memory (DEPTH 1)."""
        NW: gl.constexpr = gl.num_warps()
        BK: gl.constexpr = 128
        NB: gl.constexpr = BK // 32
        A: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
        B: gl.constexpr = gl.DotOperandLayout(1, MMA, 2)
        dtype: gl.constexpr = x_ptr.dtype.element_ty
        # this program's words: (n, b, t) -> qweight[kb * 16 + 4b + t, n]
        rn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, gl.SliceLayout(2, LQ)))
        rb = gl.arange(0, NB, layout=gl.SliceLayout(0, gl.SliceLayout(2, LQ)))
        rt = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, LQ)))
        nmask = rn < N
        wmask = nmask[:, None, None]
        words = qw_ptr + rn[:, None, None] + (rb[None, :, None] * 4 + rt[None, None, :]) * N
        words2 = qw2_ptr + rn[:, None, None] + (rb[None, :, None] * 4 + rt[None, None, :]) * N
        k0 = gl.minimum(first, last - 1)        # a program past the last step (split_k > steps) loads in bounds
        q, zw, s = step_loads(words, qz_ptr, s_ptr, k0, rn, rb, wmask, nmask, N, GROUP, BK)
        if X_SHARED:
            # x read once per program and step into shared memory (two buffers, block-major), then by every warp
            grow, gmask = x_rows(x_ptr, stride_xm, M, x_global_layout(BLOCK_M, NB, NW), BLOCK_M, NB)
            xs = gl.allocate_shared_memory(dtype, [2, BLOCK_M, NB, 4, 8],
                                           gl.SwizzledSharedLayout(1, 1, 1, order=[3, 2, 0, 1]))
            xs.index(0).store(gl.load(grow + k0 * BK, mask=gmask, other=0.0))
            xg = gl.load(grow + gl.minimum(first + 1, last - 1) * BK, mask=gmask, other=0.0)
            cta_barrier()
            xv = xs.index(0).load(LX)
        else:
            xrow, xmask = x_rows(x_ptr, stride_xm, M, LX, BLOCK_M, NB)
            xv = gl.load(xrow + k0 * BK, mask=xmask, other=0.0)
        if GATED:
            q2, zw2, s2 = step_loads(words2, qz2_ptr, s2_ptr, k0, rn, rb, wmask, nmask, N, GROUP, BK)
        if DEPTH == 2:
            k1 = gl.minimum(first + 1, last - 1)
            qa, zwa, sa = step_loads(words, qz_ptr, s_ptr, k1, rn, rb, wmask, nmask, N, GROUP, BK)
            xa = gl.load(xrow + k1 * BK, mask=xmask, other=0.0)
            if GATED:
                qa2, zwa2, sa2 = step_loads(words2, qz2_ptr, s2_ptr, k1, rn, rb, wmask, nmask, N, GROUP, BK)
        acc = gl.zeros((BN, BLOCK_M), gl.float32, layout=MMA)
        acc2 = gl.zeros((BN, BLOCK_M), gl.float32, layout=MMA)
        for kb in range(first, last):
            kn = gl.minimum(kb + DEPTH, last - 1)               # the last steps reload the last one
            qn, zwn, sn = step_loads(words, qz_ptr, s_ptr, kn, rn, rb, wmask, nmask, N, GROUP, BK)
            if not X_SHARED:
                xn = gl.load(xrow + kn * BK, mask=xmask, other=0.0)
            xf = x_fragment(xv, B)
            acc = mma_v2(unpack_fragment(q, zw, s, zshift, ZP_ADD, A, dtype), xf, acc)
            if GATED:
                qn2, zwn2, sn2 = step_loads(words2, qz2_ptr, s2_ptr, kn, rn, rb, wmask, nmask, N, GROUP, BK)
                acc2 = mma_v2(unpack_fragment(q2, zw2, s2, zshift, ZP_ADD, A, dtype), xf, acc2)
                if DEPTH == 2:
                    q2, zw2, s2 = qa2, zwa2, sa2
                    qa2, zwa2, sa2 = qn2, zwn2, sn2
                else:
                    q2, zw2, s2 = qn2, zwn2, sn2
            if X_SHARED:                                        # step kb + 1's x to the other buffer
                buf = xs.index((kb - first + 1) % 2)
                buf.store(xg)
                xg = gl.load(grow + gl.minimum(kb + 2, last - 1) * BK, mask=gmask, other=0.0)
                cta_barrier()
                xv = buf.load(LX)
                q, zw, s = qn, zwn, sn
            elif DEPTH == 2:
                q, zw, s, xv = qa, zwa, sa, xa
                qa, zwa, sa, xa = qn, zwn, sn, xn
            else:
                q, zw, s, xv = qn, zwn, sn, xn
        return acc, acc2

    @gluon.jit
    def w4a16_fragment_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, g_ptr, b_ptr, y_ptr, part_ptr, qw2_ptr, qz2_ptr, s2_ptr,
                              b2_ptr, M, K, N, stride_xm, count_ptr, GROUP: gl.constexpr, ZP_ADD: gl.constexpr,
                              HAS_BIAS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                              SPLIT_K: gl.constexpr, DEPTH: gl.constexpr, GATED: gl.constexpr,
                              X_SHARED: gl.constexpr = False, STAGES: gl.constexpr = 0, LAST_SUM: gl.constexpr = False,
                              SUM_ROWS: gl.constexpr = 16):
        """The arguments of w4a16_kernel (g_ptr unused: no act-order). Program (column block, one of
        SPLIT_K ranges of K steps of 128): y, or its fp32 partial [SPLIT_K (x2 GATED), M, N]. BLOCK_N: a
        multiple of 16 * num_warps (each warp takes 16-row slabs of n). STAGES: 0, the weight loaded into
        registers DEPTH (1 or 2) steps ahead; >= 2, streamed through a ring of STAGES slots in shared memory.
        X_SHARED: x read once per program and step into shared memory for all warps, not by each warp.
        LAST_SUM: the partials summed by each column block's last program (count_ptr: one int32 per column
        block, zero between calls), reading SUM_ROWS rows (1 or BLOCK_M); else by the sum kernel."""
        gl.static_assert(DEPTH == 1 or not X_SHARED, "x in shared memory: loads one step ahead (DEPTH 1)")
        gl.static_assert(STAGES == 0 or STAGES >= 2, "a ring of at least two slots")
        NW: gl.constexpr = gl.num_warps()
        BN: gl.constexpr = BLOCK_N
        BK: gl.constexpr = 128
        NB: gl.constexpr = BK // 32
        MMA: gl.constexpr = acc_layout(NW)
        LQ: gl.constexpr = word_layout(BN, NB, NW)
        LX: gl.constexpr = x_layout(BLOCK_M, NB, NW)
        pid_n = gl.program_id(0)
        nkb = K // BK
        per = gl.cdiv(nkb, SPLIT_K)
        first = gl.program_id(1) * per
        last = gl.minimum(first + per, nkb)
        rn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, gl.SliceLayout(2, LQ)))
        zshift = (rn % 8) * 4
        if STAGES == 0:
            acc, acc2 = _register_loop(x_ptr, qw_ptr, qz_ptr, s_ptr, qw2_ptr, qz2_ptr, s2_ptr, M, N, stride_xm, pid_n,
                                       first, last, zshift, GROUP, ZP_ADD, BLOCK_M, BN, DEPTH, GATED, X_SHARED,
                                       LQ, LX, MMA)
        else:
            acc, acc2 = _ring_loop(x_ptr, qw_ptr, qz_ptr, s_ptr, qw2_ptr, qz2_ptr, s2_ptr, M, N, stride_xm, pid_n,
                                   first, last, zshift, GROUP, ZP_ADD, BLOCK_M, BN, STAGES, GATED, X_SHARED,
                                   LQ, LX, MMA)
        rno = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, MMA))
        rmo = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, MMA))
        omask = (rmo < M)[None, :] & (rno < N)[:, None]
        if SPLIT_K == 1:
            _finish(acc, acc2, b_ptr, b2_ptr, y_ptr, rno, rmo, omask, N, HAS_BIAS, GATED)
        else:
            pid_k = gl.program_id(1)
            gl.store(part_ptr + (pid_k * M + rmo[None, :]) * N + rno[:, None], acc, mask=omask)
            if GATED:
                gl.store(part_ptr + ((SPLIT_K + pid_k) * M + rmo[None, :]) * N + rno[:, None], acc2, mask=omask)
            if LAST_SUM:
                _last_sum(acc, acc2, part_ptr, count_ptr, b_ptr, b2_ptr, y_ptr, M, N, pid_n, pid_k, rmo, SPLIT_K,
                          SUM_ROWS, HAS_BIAS, GATED, BN, MMA)

    @gluon.jit
    def _last_sum(acc, acc2, part_ptr, count_ptr, b_ptr, b2_ptr, y_ptr, M, N, pid_n, pid_k, rmo, SPLIT_K: gl.constexpr,
                  SUM_ROWS: gl.constexpr, HAS_BIAS: gl.constexpr, GATED: gl.constexpr, BN: gl.constexpr,
                  MMA: gl.constexpr):
        """The column block's last program to arrive sums all its partials in order 0, 1, ... (its own from
        registers), as the sum kernel does: the same bits. Every warp's partial is stored before the count goes
        up (a barrier, then the release) and read after it (the acquire), from L2; the last program then sets
        the count back to 0. SUM_ROWS 1: a one-row call's partials, read one element a thread; else 16 rows."""
        NW: gl.constexpr = gl.num_warps()
        cta_barrier()
        seen = gl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if seen == SPLIT_K - 1:
            if SUM_ROWS == 1:
                L: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [NW, 1], [1, 0])
                own = gl.convert_layout(gl.sum(gl.where(rmo[None, :] == 0, acc, 0.0), axis=1),
                                        gl.SliceLayout(1, L))[:, None]
                own2 = gl.convert_layout(gl.sum(gl.where(rmo[None, :] == 0, acc2, 0.0), axis=1),
                                         gl.SliceLayout(1, L))[:, None]
            else:                                          # n contiguous in a thread: vector loads, few addresses
                L: gl.constexpr = gl.BlockedLayout([BN // 32, 1], [32, 1], [1, NW], [0, 1])
                own = gl.convert_layout(acc, L)
                own2 = gl.convert_layout(acc2, L)
            rn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, L))
            rm = gl.arange(0, SUM_ROWS, layout=gl.SliceLayout(0, L))
            mask = (rm < M)[None, :] & (rn < N)[:, None]
            at = rm[None, :] * N + rn[:, None]
            total = gl.zeros((BN, SUM_ROWS), gl.float32, layout=L)
            total2 = gl.zeros((BN, SUM_ROWS), gl.float32, layout=L)
            for k in gl.static_range(SPLIT_K):             # unrolled: the loads go out together
                theirs = mask & (pid_k != k)
                total += gl.where(pid_k == k, own,
                                  gl.load(part_ptr + k * M * N + at, mask=theirs, other=0.0, cache_modifier=".cg"))
                if GATED:
                    total2 += gl.where(pid_k == k, own2, gl.load(part_ptr + (SPLIT_K + k) * M * N + at, mask=theirs,
                                                                 other=0.0, cache_modifier=".cg"))
            _finish(total, total2, b_ptr, b2_ptr, y_ptr, rn, rm, mask, N, HAS_BIAS, GATED)
            gl.atomic_xchg(count_ptr + pid_n, 0, sem="relaxed", scope="gpu")

    @gluon.jit
    def _finish(acc, acc2, b_ptr, b2_ptr, y_ptr, rn, rm, mask, N, HAS_BIAS: gl.constexpr, GATED: gl.constexpr):
        """y from the whole sums: + bias, silu(gate) * up when GATED, in y's dtype."""
        if HAS_BIAS:
            acc += gl.load(b_ptr + rn, mask=rn < N, other=0.0).to(gl.float32)[:, None]
            if GATED:
                acc2 += gl.load(b2_ptr + rn, mask=rn < N, other=0.0).to(gl.float32)[:, None]
        if GATED:
            out = _silu_mul(acc, acc2, y_ptr.dtype.element_ty)
        else:
            out = acc.to(y_ptr.dtype.element_ty)
        gl.store(y_ptr + rm[None, :] * N + rn[:, None], out, mask=mask)
else:
    w4a16_fragment_kernel = None

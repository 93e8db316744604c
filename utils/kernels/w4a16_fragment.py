"""The W4A16 kernel on Hopper (sm_90) with the weight read straight into the tensor cores' operand layout:
`w4a16_matmul`'s "fragment" unpacking, written in Gluon.

Why: in the Triton kernel (w4a16_kernels.py) each thread unpacks the words it loaded, but the tile product
wants every thread to hold other elements (its fragment of wgmma's A operand: for row n, the K columns
2t, 2t+1, 2t+8, 2t+9 of each 16, t = lane % 4). The compiler moves the unpacked tile through shared
memory to get there: stores, ldmatrix loads and barriers on every K step, more instructions than the
unpacking itself. Marlin avoids the move by repacking the weight offline. This kernel keeps GPTQ's layout
and instead renames K inside each 32-column block: a sum over K does not care in which order its terms
come, so logical column 32b + 16h + 8p + 2t + r is taken to be physical row 32b + 8t + 4r + 2h + p.
Then the eight codes of one packed word (physical rows 32b + 8t .. + 7) are exactly the eight K columns
that lane t needs in block b, and x is read in the same renamed order. Each thread loads its words, unpacks
them in PTX (two codes per 32-bit instruction, the reference's single rounding: s * (q - z)), and the
result already *is* the operand: the layout conversion compiles to nothing (asserted in the kernel).

The layouts are spelled out (Gluon's DistributedLinearLayout): lanes 0-1 pick the word within a 32-row
block (t), lanes 2-4 the row n mod 8, a register n + 8, the warps n + 16 and n + 32, registers the blocks b.
x (M <= 16 rows) is the B operand in shared memory, this program's whole K range loaded once up front;
the next step's words, zeros and scales are loaded while this step computes. Split-K partials go to the
same sum kernel as the Triton kernel's. Only fp16 scales, one group per 32 rows (group 32, 64, 128, ...),
K a multiple of 128, no act-order: w4a16.py falls back to the Triton kernel otherwise.
"""
from __future__ import annotations

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma
except ImportError:                                   # a Triton without Gluon (< 3.5): the Triton kernel serves
    gluon = None

from .w4a16_kernels import UNPACK_PTX

BLOCK_N, BLOCK_K, WARPS = 64, 128, 4                   # one warpgroup, 16 rows of n per warp
MAX_STEPS = 8                                          # K steps per program: x's tile in shared memory <= 32 KiB
DEPTH = 2                                              # K steps' loads in flight ahead of the one computed

if gluon is not None:
    @gluon.constexpr_function
    def word_layout(nb, num_warps):
        """[BLOCK_N, nb, 4] words (n, block b, word t within the block) as the wgmma A fragment needs them."""
        reg = [[8, 0, 0]] + [[0, 1 << i, 0] for i in range(nb.bit_length() - 1)]
        lane = [[0, 0, 1], [0, 0, 2], [1, 0, 0], [2, 0, 0], [4, 0, 0]]
        warp = [[16 << i, 0, 0] for i in range(num_warps.bit_length() - 1)]
        return gl.DistributedLinearLayout(reg, lane, warp, [], [16 * num_warps, nb, 4])

    @gluon.constexpr_function
    def acc_layout(num_warps, block_m):
        """The wgmma accumulator [BLOCK_N, BLOCK_M]: warps stacked along n, one m64 x n<block_m> x k16 shape."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, block_m, 16])

    @gluon.jit
    def _groups(qz_ptr, s_ptr, kb, rn, rb, nmask, N, GROUP: gl.constexpr, BK: gl.constexpr):
        """The zero words and scales of K step kb: [BLOCK_N, 1] for one group per step, [BLOCK_N, NB] for
        one per 32-row block (groups of 32 or 64)."""
        if GROUP >= BK:
            g = kb * BK // GROUP
            zw = gl.load(qz_ptr + g * (N // 8) + rn // 8, mask=nmask, other=0)[:, None]
            s = gl.load(s_ptr + g * N + rn, mask=nmask, other=0.0)[:, None]
        else:
            g = ((kb * BK + rb * 32) // GROUP)[None, :]
            zw = gl.load(qz_ptr + g * (N // 8) + (rn // 8)[:, None], mask=nmask[:, None], other=0)
            s = gl.load(s_ptr + g * N + rn[:, None], mask=nmask[:, None], other=0.0)
        return zw, s

    @gluon.jit
    def _fragment(q, zw, s, zshift, ZP_ADD: gl.constexpr, layout: gl.constexpr, dtype: gl.constexpr):
        """The words q [BLOCK_N, NB, 4] dequantized into the A operand [BLOCK_N, BLOCK_K] (renamed K)."""
        z = (((zw + ZP_ADD) >> zshift[:, None]) & 0xF) | 0x6400       # 1024 + z as fp16 bits
        zz = (z | (z << 16))[:, :, None]
        sb = s.to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
        ss = (sb | (sb << 16))[:, :, None]
        w0, w1, w2, w3, w4, w5, w6, w7 = gl.inline_asm_elementwise(
            UNPACK_PTX, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r", [q, zz, ss], dtype=(gl.float16,) * 8, is_pure=True, pack=1)
        # code j = 4r + 2h + p of word (b, t) -> logical column 32b + 16h + 8p + 2t + r: joins add r, p, h
        w = gl.join(gl.join(gl.join(w0, w4), gl.join(w1, w5)), gl.join(gl.join(w2, w6), gl.join(w3, w7)))
        w = gl.reshape(gl.permute(w, (0, 1, 5, 4, 2, 3)), (q.shape[0], q.shape[1] * 32))
        return gl.convert_layout(w.to(dtype), layout, assert_trivial=True)

    @gluon.jit
    def _silu_mul(g, u, out_dtype: gl.constexpr):
        """As w4a16_kernels._silu_mul: each sum rounded to the output dtype, then silu(g) * u in fp32."""
        g = g.to(out_dtype).to(gl.float32)
        u = u.to(out_dtype).to(gl.float32)
        return (g * (1 / (1 + gl.exp(-g))) * u).to(out_dtype)

    @gluon.jit
    def _loads(words, qz_ptr, s_ptr, kb, rn, rb, wmask, nmask, N, GROUP: gl.constexpr, BK: gl.constexpr):
        """K step kb's words, zero words and scales."""
        q = gl.load(words + kb * (BK // 8) * N, mask=wmask, other=0)
        zw, s = _groups(qz_ptr, s_ptr, kb, rn, rb, nmask, N, GROUP, BK)
        return q, zw, s

    @gluon.jit
    def _x_renamed(x_ptr, kb, last, M, stride_xm, BLOCK_M: gl.constexpr, NB: gl.constexpr, XV: gl.constexpr):
        """x^T [NB * 32, BLOCK_M] of K step kb in the renamed order: read as 16-byte vectors (the eight rows
        32b + 8t + 4r + 2h + p of one word), then logical row 32b + 16h + 8p + 2t + r."""
        rm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, XV))))
        rb = gl.arange(0, NB, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, XV))))
        rt = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, XV))))
        re = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, XV))))
        offs = (rm[:, None, None, None] * stride_xm + kb * (NB * 32) + rb[None, :, None, None] * 32
                + rt[None, None, :, None] * 8 + re[None, None, None, :])
        v = gl.load(x_ptr + offs, mask=(rm < M)[:, None, None, None] & (kb < last), other=0.0)
        v = gl.permute(gl.reshape(v, (BLOCK_M, NB, 4, 2, 2, 2)), (0, 1, 4, 5, 2, 3))   # [m, b, h, p, t, r]
        return gl.permute(gl.reshape(v, (BLOCK_M, NB * 32)), (1, 0))

    @gluon.jit
    def w4a16_fragment_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, g_ptr, b_ptr, y_ptr, part_ptr, qw2_ptr, qz2_ptr, s2_ptr,
                              b2_ptr, M, K, N, stride_xm, GROUP: gl.constexpr, ZP_ADD: gl.constexpr,
                              HAS_BIAS: gl.constexpr, BLOCK_M: gl.constexpr, SPLIT_K: gl.constexpr,
                              STEPS: gl.constexpr, DEPTH: gl.constexpr, GATED: gl.constexpr):
        """The arguments of w4a16_kernel (g_ptr unused: no act-order). Program (column block, K range of
        STEPS blocks of 128): y, or its fp32 partial [SPLIT_K (x2 GATED), M, N]. DEPTH: K steps whose
        loads are in flight ahead of the one computed (1 or 2)."""
        NW: gl.constexpr = gl.num_warps()
        BN: gl.constexpr = 16 * NW
        BK: gl.constexpr = 128
        NB: gl.constexpr = BK // 32
        LQ: gl.constexpr = word_layout(NB, NW)
        MMA: gl.constexpr = acc_layout(NW, BLOCK_M)
        A: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
        XV: gl.constexpr = gl.BlockedLayout([1, 1, 1, 8], [2, NB, 32 // (2 * NB), 1], [NW, 1, 1, 1], [3, 2, 1, 0])
        dtype: gl.constexpr = x_ptr.dtype.element_ty
        XS: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BK, BLOCK_M], dtype)
        pid_n = gl.program_id(0)
        first = gl.program_id(1) * STEPS
        last = gl.minimum(first + STEPS, K // BK)
        # this program's words: (n, b, t) -> qweight[kb * 16 + 4b + t, n]; the first steps' loads go out first
        rn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, gl.SliceLayout(2, LQ)))
        rb = gl.arange(0, NB, layout=gl.SliceLayout(0, gl.SliceLayout(2, LQ)))
        rt = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, LQ)))
        nmask = rn < N
        wmask = nmask[:, None, None]
        zshift = (rn % 8) * 4
        words = qw_ptr + rn[:, None, None] + (rb[None, :, None] * 4 + rt[None, None, :]) * N
        words2 = qw2_ptr + rn[:, None, None] + (rb[None, :, None] * 4 + rt[None, None, :]) * N
        q, zw, s = _loads(words, qz_ptr, s_ptr, first, rn, rb, wmask, nmask, N, GROUP, BK)
        if GATED:
            q2, zw2, s2 = _loads(words2, qz2_ptr, s2_ptr, first, rn, rb, wmask, nmask, N, GROUP, BK)
        if DEPTH == 2:
            k1 = gl.minimum(first + 1, last - 1)
            qa, zwa, sa = _loads(words, qz_ptr, s_ptr, k1, rn, rb, wmask, nmask, N, GROUP, BK)
            if GATED:
                qa2, zwa2, sa2 = _loads(words2, qz2_ptr, s2_ptr, k1, rn, rb, wmask, nmask, N, GROUP, BK)
        xs = gl.allocate_shared_memory(dtype, [STEPS, BK, BLOCK_M], XS)
        for i in gl.static_range(STEPS):
            xs.index(i).store(_x_renamed(x_ptr, first + i, last, M, stride_xm, BLOCK_M, NB, XV))
        fence_async_shared()
        acc = gl.zeros((BN, BLOCK_M), gl.float32, layout=MMA)
        acc2 = gl.zeros((BN, BLOCK_M), gl.float32, layout=MMA)
        for i in range(0, last - first):
            kn = gl.minimum(first + i + DEPTH, last - 1)       # the last steps reload the last one
            qn, zwn, sn = _loads(words, qz_ptr, s_ptr, kn, rn, rb, wmask, nmask, N, GROUP, BK)
            acc = warpgroup_mma(_fragment(q, zw, s, zshift, ZP_ADD, A, dtype), xs.index(i), acc)
            if DEPTH == 2:
                q, zw, s = qa, zwa, sa
                qa, zwa, sa = qn, zwn, sn
            else:
                q, zw, s = qn, zwn, sn
            if GATED:
                qn2, zwn2, sn2 = _loads(words2, qz2_ptr, s2_ptr, kn, rn, rb, wmask, nmask, N, GROUP, BK)
                acc2 = warpgroup_mma(_fragment(q2, zw2, s2, zshift, ZP_ADD, A, dtype), xs.index(i), acc2)
                if DEPTH == 2:
                    q2, zw2, s2 = qa2, zwa2, sa2
                    qa2, zwa2, sa2 = qn2, zwn2, sn2
                else:
                    q2, zw2, s2 = qn2, zwn2, sn2
        rno = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, MMA))
        rmo = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, MMA))
        omask = (rmo < M)[None, :] & (rno < N)[:, None]
        if SPLIT_K == 1:
            if HAS_BIAS:
                acc += gl.load(b_ptr + rno, mask=rno < N, other=0.0).to(gl.float32)[:, None]
                if GATED:
                    acc2 += gl.load(b2_ptr + rno, mask=rno < N, other=0.0).to(gl.float32)[:, None]
            if GATED:
                out = _silu_mul(acc, acc2, y_ptr.dtype.element_ty)
            else:
                out = acc.to(y_ptr.dtype.element_ty)
            gl.store(y_ptr + rmo[None, :] * N + rno[:, None], out, mask=omask)
        else:
            pid_k = gl.program_id(1)
            gl.store(part_ptr + (pid_k * M + rmo[None, :]) * N + rno[:, None], acc, mask=omask)
            if GATED:
                gl.store(part_ptr + ((SPLIT_K + pid_k) * M + rmo[None, :]) * N + rno[:, None], acc2, mask=omask)
else:
    w4a16_fragment_kernel = None

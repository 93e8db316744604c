"""The Gluon W4A16 kernel's layouts and its loads (w4a16_fragment.py says why they are so): which thread
holds which packed word, x element and accumulator; how a K step's words, zero points and scales reach
registers, straight from global memory or through a ring of cp.async slots in shared memory; and the
unpacking that turns the words into the tensor cores' operand."""
from __future__ import annotations

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared   # renamed after 3.6
except ImportError:            # a Triton without Gluon (< 3.6): the Triton kernel serves
    gluon = None

from .w4a16_kernels import UNPACK_PTX

if gluon is not None:
    @gluon.constexpr_function
    def word_layout(block_n, nb, num_warps):
        """[block_n, nb, 4] words (n, block b, word t within the block) as the mma's A fragment needs them."""
        reg = [[8, 0, 0]] + [[0, 1 << i, 0] for i in range(nb.bit_length() - 1)]
        reg += [[16 * num_warps << i, 0, 0] for i in range((block_n // (16 * num_warps)).bit_length() - 1)]
        lane = [[0, 0, 1], [0, 0, 2], [1, 0, 0], [2, 0, 0], [4, 0, 0]]
        warp = [[16 << i, 0, 0] for i in range(num_warps.bit_length() - 1)]
        return gl.DistributedLinearLayout(reg, lane, warp, [], [block_n, nb, 4])

    @gluon.constexpr_function
    def x_layout(block_m, nb, num_warps):
        """[block_m, nb, 4, 8] of x (row m, block b, word t, row e of the word) as the mma's B fragment
        needs them: e in registers (one 16-byte load), every warp the same."""
        reg = [[0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 4]] + [[0, 1 << i, 0, 0] for i in range(nb.bit_length() - 1)]
        reg += [[8 << i, 0, 0, 0] for i in range((block_m // 8).bit_length() - 1)]
        lane = [[0, 0, 1, 0], [0, 0, 2, 0], [1, 0, 0, 0], [2, 0, 0, 0], [4, 0, 0, 0]]
        warp = [[0, 0, 0, 0] for _ in range(num_warps.bit_length() - 1)]
        return gl.DistributedLinearLayout(reg, lane, warp, [], [block_m, nb, 4, 8])

    @gluon.constexpr_function
    def x_global_layout(block_m, nb, num_warps):
        """[block_m, nb, 4, 8] of x read once per program: each thread 16 bytes (a word's eight rows e) per
        row m, m + 8; lanes t and m mod 8, warps the block b. Stored so, block-major, for every warp to read."""
        reg = [[0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 4]] + [[8 << i, 0, 0, 0] for i in range((block_m // 8).bit_length() - 1)]
        lane = [[0, 0, 1, 0], [0, 0, 2, 0], [1, 0, 0, 0], [2, 0, 0, 0], [4, 0, 0, 0]]
        warp = [[0, 1 << i, 0, 0] for i in range(num_warps.bit_length() - 1)]
        return gl.DistributedLinearLayout(reg, lane, warp, [], [block_m, nb, 4, 8])

    @gluon.constexpr_function
    def word_copy_layout(block_n, num_warps):
        """[NB, 4, block_n] words (block b, word t, column n) as cp.async copies them: 16 bytes (four
        columns) a thread, lanes along n."""
        tn = min(32, block_n // 4)
        wt = 4 // (32 // tn)
        return gl.BlockedLayout([1, 1, 4], [1, 32 // tn, tn], [num_warps // wt, wt, 1], [2, 1, 0])

    @gluon.constexpr_function
    def row_copy_layout(cols, vec, num_warps):
        """[rows, cols] copied `vec` elements a thread along the row (zero words, scales)."""
        tn = min(32, cols // vec)
        return gl.BlockedLayout([1, vec], [32 // tn, tn], [num_warps, 1], [1, 0])

    @gluon.constexpr_function
    def acc_layout(num_warps):
        """The accumulator [BLOCK_N, BLOCK_M]: warps stacked along n, mma.sync m16n8k16."""
        return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, 8])

    @gluon.jit
    def step_groups(qz_ptr, s_ptr, kb, rn, rb, nmask, N, GROUP: gl.constexpr, BK: gl.constexpr):
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
    def step_loads(words, qz_ptr, s_ptr, kb, rn, rb, wmask, nmask, N, GROUP: gl.constexpr, BK: gl.constexpr):
        """K step kb's words, zero words and scales."""
        q = gl.load(words + kb * (BK // 8) * N, mask=wmask, other=0)
        zw, s = step_groups(qz_ptr, s_ptr, kb, rn, rb, nmask, N, GROUP, BK)
        return q, zw, s

    @gluon.jit
    def x_rows(x_ptr, stride_xm, M, layout: gl.constexpr, BLOCK_M: gl.constexpr, NB: gl.constexpr):
        """x's addresses for K step 0 in `layout`, (m, b, t, e) -> x[m, 32b + 8t + e], and the rows' mask."""
        xm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, layout))))
        xb = gl.arange(0, NB, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, layout))))
        xt = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, layout))))
        xe = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, layout))))
        rows = (x_ptr + xm[:, None, None, None] * stride_xm + xb[None, :, None, None] * 32
                + xt[None, None, :, None] * 8 + xe[None, None, None, :])
        return rows, (xm < M)[:, None, None, None]

    @gluon.jit
    def unpack_fragment(q, zw, s, zshift, ZP_ADD: gl.constexpr, layout: gl.constexpr, dtype: gl.constexpr):
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
    def x_fragment(xv, layout: gl.constexpr):
        """x [BLOCK_M, NB, 4, 8] (word t's eight physical rows e = 4r + 2h + p) as the B operand
        [BLOCK_K, BLOCK_M] in the renamed order, logical row 32b + 16h + 8p + 2t + r."""
        BM: gl.constexpr = xv.shape[0]
        NB: gl.constexpr = xv.shape[1]
        v = gl.permute(gl.reshape(xv, (BM, NB, 4, 2, 2, 2)), (0, 1, 4, 5, 2, 3))      # [m, b, h, p, t, r]
        return gl.convert_layout(gl.permute(gl.reshape(v, (BM, NB * 32)), (1, 0)), layout, assert_trivial=True)

    @gluon.jit
    def ring_issue(ring_w, ring_z, ring_s, slot, qw_ptr, qz_ptr, s_ptr, pid_n, kb, ok, N, GROUP: gl.constexpr):
        """cp.async K step kb's words, zero words (each column's, per group row) and scales into ring slot
        `slot`: the bytes are in flight without registers. ok: the step is this program's (else zeros)."""
        NB: gl.constexpr = ring_w.shape[1]
        BN: gl.constexpr = ring_w.shape[3]
        NBG: gl.constexpr = ring_s.shape[1]
        BK: gl.constexpr = 32 * NB
        NW: gl.constexpr = gl.num_warps()
        CW: gl.constexpr = word_copy_layout(BN, NW)
        wb = gl.arange(0, NB, layout=gl.SliceLayout(1, gl.SliceLayout(2, CW)))
        wt = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, CW)))
        wn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, gl.SliceLayout(1, CW)))
        N8 = N // 8                       # N as N8 * 8: the compiler then knows each row starts on a 16-byte run
        rows = kb * (BK // 8) + wb[:, None, None] * 4 + wt[None, :, None]
        async_load(ring_w.index(slot), qw_ptr + rows * N8 * 8 + wn[None, None, :],
                   mask=(wn < N8 * 8)[None, None, :] & ok)
        CS: gl.constexpr = row_copy_layout(BN, 8, NW)
        sn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, CS))
        sg = (kb * BK + gl.arange(0, NBG, layout=gl.SliceLayout(1, CS)) * (BK // NBG)) // GROUP
        async_load(ring_s.index(slot), s_ptr + sg[:, None] * N8 * 8 + sn[None, :], mask=(sn < N8 * 8)[None, :] & ok)
        CZ: gl.constexpr = row_copy_layout(BN, 1, NW)
        zn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, CZ))
        zg = (kb * BK + gl.arange(0, NBG, layout=gl.SliceLayout(1, CZ)) * (BK // NBG)) // GROUP
        async_load(ring_z.index(slot), qz_ptr + zg[:, None] * N8 + (zn // 8)[None, :],
                   mask=(zn < N)[None, :] & ok)

    @gluon.jit
    def ring_read(ring_w, ring_z, ring_s, slot, LQ: gl.constexpr):
        """Ring slot `slot` as step_loads gives a step: words [BN, NB, 4] in LQ, zero words and scales [BN, NBG]."""
        q = ring_w.index(slot).permute((2, 0, 1)).load(LQ)
        zw = ring_z.index(slot).permute((1, 0)).load(gl.SliceLayout(2, LQ))
        s = ring_s.index(slot).permute((1, 0)).load(gl.SliceLayout(2, LQ))
        return q, zw, s

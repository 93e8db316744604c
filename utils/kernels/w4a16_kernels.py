"""The W4A16 kernel's Triton code: y [M, N] = x [M, K] @ W for M = 1..16, W dequantized in the kernel.

It reads GPTQ tensors as GPTQModel holds them after a load: qweight int32 [K/8, N] (8 codes along K,
code j of a word at bits 4j), qzeros int32 [groups, N/8] (the zero points packed along N; in the v1
layout every word is stored minus 0x11111111, in v2 as is: ZP_ADD adds it back to the whole word, as
utils.gptq.zero_points does, so a borrow across codes comes back right), scales [groups, N], and for
act-order a g_idx [K] naming each row's group. The weight tile is dequantized exactly as the course's
reference does (s * (q - z), one rounding in the scales' dtype), then multiplied on the tensor cores
(tl.dot, fp32 accumulation): a 16-row tile, of which a decode step at batch M uses M rows. A program
sums a column block over a range of K blocks (split-K); the partials are added in a fixed order by a
second kernel (the same bits every run). GATED: gate and up of an MLP in one program, silu(gate) * up
written (w4a16_gated_silu). How a launch is planned is in w4a16.py.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .gemv_kernels import gdc_launch_dependents, gdc_wait


# One packed word ($8) dequantized, two codes per 32-bit instruction: lop3 makes the fp16x2 numbers 1024 + q, then
# (1024 + q) - (1024 + z) = q - z exactly and one multiply by s, the reference's single rounding. $9 and $10 hold
# 1024 + z and s in both halves; code j comes out in $j. Shared by the Triton and the Gluon (w4a16_fragment.py) kernels.
UNPACK_PTX = tl.constexpr("""{
.reg .b32 a, b, c, d, t;
lop3.b32 a, $8, 0x000F000F, 0x64006400, 0xEA;
shr.u32 t, $8, 4;
lop3.b32 b, t, 0x000F000F, 0x64006400, 0xEA;
shr.u32 t, $8, 8;
lop3.b32 c, t, 0x000F000F, 0x64006400, 0xEA;
shr.u32 t, $8, 12;
lop3.b32 d, t, 0x000F000F, 0x64006400, 0xEA;
sub.rn.f16x2 a, a, $9;
sub.rn.f16x2 b, b, $9;
sub.rn.f16x2 c, c, $9;
sub.rn.f16x2 d, d, $9;
mul.rn.f16x2 a, a, $10;
mul.rn.f16x2 b, b, $10;
mul.rn.f16x2 c, c, $10;
mul.rn.f16x2 d, d, $10;
mov.b32 {$0, $4}, a;
mov.b32 {$1, $5}, b;
mov.b32 {$2, $6}, c;
mov.b32 {$3, $7}, d;
}""")


@triton.jit
def _dequant_tile(qw_ptr, qz_ptr, s_ptr, g_ptr, kb, rn, nmask, N, GROUP: tl.constexpr, BLOCK_K: tl.constexpr,
                  ZP_ADD: tl.constexpr, ACT_ORDER: tl.constexpr, ROWS: tl.constexpr = False):
    """W[kb BLOCK_K : (kb + 1) BLOCK_K, rn] dequantized, [BLOCK_K, BLOCK_N] in the scales' dtype. ROWS: load
    each packed word once per row it feeds (L1 serves the repeats) instead of once, unpacked by a reshape."""
    # code n as the fp16 number 1024 + n (bits 0x6400 | n), no int-to-float conversion; then
    # (1024 + n) - (1024 + z) = n - z exactly, and one multiply by s: the reference's single rounding.
    if ROWS:
        rk = kb * BLOCK_K + tl.arange(0, BLOCK_K)
        q = tl.load(qw_ptr + (rk // 8)[:, None] * N + rn[None, :], mask=nmask[None, :], other=0,
                    eviction_policy="evict_first")
        magic = ((q >> ((rk % 8) * 4)[:, None]) & 0xF) | 0x6400
    else:
        rw = kb * (BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
        q = tl.load(qw_ptr + rw[:, None] * N + rn[None, :], mask=nmask[None, :], other=0,
                    eviction_policy="evict_first")                   # read once per call: keep L2 for the rest
        shifts = tl.arange(0, 8) * 4
        magic = tl.reshape(((q[:, None, :] >> shifts[None, :, None]) & 0xF) | 0x6400, (BLOCK_K, q.shape[1]))
    codes = magic.to(tl.int16).to(tl.float16, bitcast=True)
    zshift = (rn % 8) * 4
    if ACT_ORDER:                                     # each row its own group: scales and zeros per element
        g = tl.load(g_ptr + kb * BLOCK_K + tl.arange(0, BLOCK_K))
        zw = tl.load(qz_ptr + g[:, None] * (N // 8) + (rn // 8)[None, :], mask=nmask[None, :], other=0)
        z = ((((zw + ZP_ADD) >> zshift[None, :]) & 0xF) | 0x6400).to(tl.int16).to(tl.float16, bitcast=True)
        s = tl.load(s_ptr + g[:, None] * N + rn[None, :], mask=nmask[None, :], other=0.0)
        w = (codes - z).to(s.dtype) * s
    else:                                             # BLOCK_K divides GROUP: one group per tile
        g = (kb * BLOCK_K) // GROUP
        zw = tl.load(qz_ptr + g * (N // 8) + rn // 8, mask=nmask, other=0)
        z = ((((zw + ZP_ADD) >> zshift) & 0xF) | 0x6400).to(tl.int16).to(tl.float16, bitcast=True)
        s = tl.load(s_ptr + g * N + rn, mask=nmask, other=0.0)
        w = (codes - z[None, :]).to(s.dtype) * s[None, :]
    return w


@triton.jit
def _code(q, shift: tl.constexpr, zf, s):
    """Code (q >> shift) & 0xF of each word, dequantized: (1024 + n) - (1024 + z), exact, times s."""
    return ((((q >> shift) & 0xF) | 0x6400).to(tl.int16).to(tl.float16, bitcast=True) - zf).to(s.dtype) * s


@triton.jit
def _dequant_tile_t(qw_ptr, qz_ptr, s_ptr, kb, rn, nmask, N, GROUP: tl.constexpr, BLOCK_K: tl.constexpr,
                    ZP_ADD: tl.constexpr, ASM: tl.constexpr):
    """The same tile transposed, [BLOCK_N, BLOCK_K], for one group per tile (no act-order). Each thread
    unpacks whole words: code j of a word becomes element 8w + j through joins, which keep the eight codes
    in the thread that loaded the word (no shuffle through shared memory). ASM (fp16 scales): two codes per
    32-bit instruction (lop3 into fp16x2 magic numbers, then sub.f16x2 and mul.f16x2: the same single rounding)."""
    rw = kb * (BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
    q = tl.load(qw_ptr + rn[:, None] + rw[None, :] * N, mask=nmask[:, None], other=0, eviction_policy="evict_first")
    g = (kb * BLOCK_K) // GROUP
    zw = tl.load(qz_ptr + g * (N // 8) + rn // 8, mask=nmask, other=0)
    z = (((zw + ZP_ADD) >> ((rn % 8) * 4)) & 0xF) | 0x6400                   # 1024 + z as fp16 bits
    s = tl.load(s_ptr + g * N + rn, mask=nmask, other=0.0)
    if ASM:
        zz = (z | (z << 16))[:, None]
        sb = s.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        ss = (sb | (sb << 16))[:, None]
        w0, w1, w2, w3, w4, w5, w6, w7 = tl.inline_asm_elementwise(
            UNPACK_PTX,
            "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r", [q, zz, ss], dtype=(tl.float16,) * 8, is_pure=True, pack=1)
    else:
        zf, sc = z.to(tl.int16).to(tl.float16, bitcast=True)[:, None], s[:, None]
        w0, w1 = _code(q, 0, zf, sc), _code(q, 4, zf, sc)
        w2, w3 = _code(q, 8, zf, sc), _code(q, 12, zf, sc)
        w4, w5 = _code(q, 16, zf, sc), _code(q, 20, zf, sc)
        w6, w7 = _code(q, 24, zf, sc), _code(q, 28, zf, sc)
    # a join appends a trailing axis of 2; nested three deep, flat index 4a + 2b + c reads the innermost pair's
    # a-th, the middle's b-th, the outer's c-th: so code j sits at bit-reversed nesting
    w = tl.join(tl.join(tl.join(w0, w4), tl.join(w2, w6)), tl.join(tl.join(w1, w5), tl.join(w3, w7)))
    return tl.reshape(w, (q.shape[0], BLOCK_K))


@triton.jit
def _silu_mul(g, u, out_dtype: tl.constexpr):
    """silu(gate) * up from their fp32 sums, each first rounded to the output dtype as two separate layers
    would hand it over, then one product in fp32 (as torch.compile fuses the activation): one rounding."""
    g = g.to(out_dtype).to(tl.float32)
    u = u.to(out_dtype).to(tl.float32)
    return (g * tl.sigmoid(g) * u).to(out_dtype)


@triton.jit
def w4a16_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, g_ptr, b_ptr, y_ptr, part_ptr, qw2_ptr, qz2_ptr, s2_ptr, b2_ptr,
                  M, K, N, stride_xm,
                  GROUP: tl.constexpr, ZP_ADD: tl.constexpr, ACT_ORDER: tl.constexpr, HAS_BIAS: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                  PRECISION: tl.constexpr, UNPACK: tl.constexpr, GATED: tl.constexpr, PDL: tl.constexpr):
    """One column block (program_id 0) over one range of K blocks (program_id 1). SPLIT_K == 1: y written
    here (bias added, in y's dtype); otherwise the fp32 partial goes to part_ptr [SPLIT_K, M, N].
    UNPACK 0 / 1: x [M, K] @ W tile (the weight the second operand; 1 loads each word once per row it feeds);
    2 / 3: (W tile)^T @ x^T, the weight the first operand, unpacked by _dequant_tile_t (3: through PTX).
    GATED (UNPACK 2 / 3): a second weight (qw2, qz2, s2, b2: an MLP's up projection beside its gate) on the
    same x tile, and y = silu(x @ W + b) * (x @ W2 + b2); split, its partials follow the first's
    [2 * SPLIT_K, M, N]. PDL: the sum kernel, launched as a programmatic dependent, may start now."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    if PDL:
        gdc_launch_dependents()
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    rm = tl.arange(0, BLOCK_M)
    mmask = rm < M
    nkb = K // BLOCK_K
    per = tl.cdiv(nkb, SPLIT_K)
    first = pid_k * per
    last = tl.minimum(first + per, nkb)
    rk = tl.arange(0, BLOCK_K)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if UNPACK >= 2:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        accu = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for kb in range(first, last):
            xt = tl.load(x_ptr + rm[None, :] * stride_xm + (kb * BLOCK_K + rk)[:, None], mask=mmask[None, :],
                         other=0.0)
            w = _dequant_tile_t(qw_ptr, qz_ptr, s_ptr, kb, rn, nmask, N, GROUP, BLOCK_K, ZP_ADD, UNPACK == 3)
            acc = tl.dot(w.to(xt.dtype), xt, acc, input_precision=PRECISION)
            if GATED:
                w2 = _dequant_tile_t(qw2_ptr, qz2_ptr, s2_ptr, kb, rn, nmask, N, GROUP, BLOCK_K, ZP_ADD, UNPACK == 3)
                accu = tl.dot(w2.to(xt.dtype), xt, accu, input_precision=PRECISION)
        acc = tl.trans(acc)
        acc2 = tl.trans(accu)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(first, last):
            w = _dequant_tile(qw_ptr, qz_ptr, s_ptr, g_ptr, kb, rn, nmask, N, GROUP, BLOCK_K, ZP_ADD, ACT_ORDER,
                              UNPACK == 1)
            xt = tl.load(x_ptr + rm[:, None] * stride_xm + (kb * BLOCK_K + rk)[None, :], mask=mmask[:, None],
                         other=0.0)
            acc = tl.dot(xt, w.to(xt.dtype), acc, input_precision=PRECISION)
    omask = mmask[:, None] & nmask[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
            if GATED:
                acc2 += tl.load(b2_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
        if GATED:
            out = _silu_mul(acc, acc2, y_ptr.dtype.element_ty)
        else:
            out = acc.to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + rm[:, None] * N + rn[None, :], out, mask=omask)
    else:
        tl.store(part_ptr + (pid_k * M + rm[:, None]) * N + rn[None, :], acc, mask=omask)
        if GATED:
            tl.store(part_ptr + ((SPLIT_K + pid_k) * M + rm[:, None]) * N + rn[None, :], acc2, mask=omask)


@triton.jit
def w4a16_sum_kernel(part_ptr, b_ptr, b2_ptr, y_ptr, MN, N, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
                      BLOCK: tl.constexpr, GATED: tl.constexpr, PDL: tl.constexpr):
    """y = sum of the SPLIT_K partials [SPLIT_K, M, N], in order 0, 1, ... (+ bias), in y's dtype; GATED:
    silu(that) * (the same over the next SPLIT_K partials + b2). PDL: launched while the GEMM still runs,
    it waits here for the GEMM's grid to finish and its stores to be visible (griddepcontrol.wait)."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = r < MN
    if PDL:
        gdc_wait()
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for k in tl.static_range(SPLIT_K):
        acc += tl.load(part_ptr + k * MN + r, mask=mask, other=0.0, cache_modifier=".cg")
    if HAS_BIAS:
        acc += tl.load(b_ptr + r % N, mask=mask, other=0.0).to(tl.float32)
    if GATED:
        acc2 = tl.zeros((BLOCK,), dtype=tl.float32)
        for k in tl.static_range(SPLIT_K):
            acc2 += tl.load(part_ptr + (SPLIT_K + k) * MN + r, mask=mask, other=0.0, cache_modifier=".cg")
        if HAS_BIAS:
            acc2 += tl.load(b2_ptr + r % N, mask=mask, other=0.0).to(tl.float32)
        out = _silu_mul(acc, acc2, y_ptr.dtype.element_ty)
    else:
        out = acc.to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + r, out, mask=mask)


@triton.jit
def w4a16_dequant_kernel(qw_ptr, qz_ptr, s_ptr, g_ptr, w_ptr, K, N, GROUP: tl.constexpr, ZP_ADD: tl.constexpr,
                          ACT_ORDER: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """W [K, N] in w's dtype, the tile at (program_id 0 = K block, program_id 1 = column block): the
    fallback for more than 16 rows, which then multiplies through cuBLAS."""
    kb, pid_n = tl.program_id(0), tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    w = _dequant_tile(qw_ptr, qz_ptr, s_ptr, g_ptr, kb, rn, nmask, N, GROUP, BLOCK_K, ZP_ADD, ACT_ORDER)
    rk = kb * BLOCK_K + tl.arange(0, BLOCK_K)
    tl.store(w_ptr + rk[:, None] * N + rn[None, :], w.to(w_ptr.dtype.element_ty), mask=nmask[None, :])

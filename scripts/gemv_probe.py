"""Int4 GEMV experiments for issue 8 (a bench, not a test): which change moves the kernel toward the
memory floor. Every variant is checked against the fp32 dequant reference before it is timed.

    python scripts/gemv_probe.py [--round 1]      # table of a round's variants at Qwen2.5-7B's MLP shapes (GPU)
    python scripts/gemv_probe.py --round 3        # the shipped kernel's tiles x splits x NUM_STAGES (GPU)
    python scripts/gemv_probe.py --check-only     # CPU: TRITON_INTERPRET=1, small shape, no asm variant
    ncu -k regex:gemv python scripts/gemv_probe.py --ncu $OUT/gemv_best.json   # one launch of each best config

Knobs of the one experimental kernel below (utils.kernels keeps what wins):
  ZFOLD   the zero point goes into the magic-number subtraction (w = (2^23 + n 2^4j) - (2^23 + z 2^4j)),
          so no sum of x and no cross-thread reduction per group
  PREFETCH the next group's codes, zeros and scales are loaded before this group is computed
  FIXUP   split-K partials go to a workspace and the last program of a column block sums them in a
          fixed order (one kernel, deterministic) instead of fp32 atomics + zero-fill + cast
  F16X2   dequantize two nibbles per instruction with the fp16 magic number 0x6400 (1024 + n) in
          inline PTX, products and 4-term sums in fp16x2, then fp32
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from utils import kernels, metrics  # noqa: E402

# Rounds 1-2's inline PTX (utils.kernels now has _F16X2_DOT16: two int32 per call, shift-free high
# nibbles). fp16x2 dot of one packed int32 (8 nibbles) with 8 activations, in Marlin's manner:
# (q >> 4j) & 0x000F000F | 0x64006400 is two fp16 numbers 1024 + n (nibbles j and j+4), minus 1024 + z
# gives n - z exactly; two weights per instruction, products and 4-term sums in fp16, then one fp32 sum. $1 = q, $2 = 1024 + z as
# fp16x2, $3..$6 = (x[j], x[j+4]) as fp16x2 for j = 0..3; $0 = the fp32 result's bits.
_F16X2_DOT8 = tl.constexpr("""
{
.reg .b32 t, h, a;
.reg .b16 lo, hi;
.reg .f32 flo, fhi, fs;
lop3.b32 t, $1, 0x000F000F, 0x64006400, 0xEA;
sub.f16x2 h, t, $2;
mul.rn.f16x2 a, h, $3;
shr.u32 t, $1, 4;
lop3.b32 t, t, 0x000F000F, 0x64006400, 0xEA;
sub.f16x2 h, t, $2;
fma.rn.f16x2 a, h, $4, a;
shr.u32 t, $1, 8;
lop3.b32 t, t, 0x000F000F, 0x64006400, 0xEA;
sub.f16x2 h, t, $2;
fma.rn.f16x2 a, h, $5, a;
shr.u32 t, $1, 12;
lop3.b32 t, t, 0x000F000F, 0x64006400, 0xEA;
sub.f16x2 h, t, $2;
fma.rn.f16x2 a, h, $6, a;
mov.b32 {lo, hi}, a;
cvt.f32.f16 flo, lo;
cvt.f32.f16 fhi, hi;
add.f32 fs, flo, fhi;
mov.b32 $0, fs;
}
""")


_FIXUP_LOCKS: dict = {}


@triton.jit
def splitk_fixup(y, part_ptr, lock_ptr, pid_n, pid_k, rn, mask, N, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """The split-K fix-up utils.kernels.int4_gemv shipped until round 25, kept here as the probes' own:
    partials to a workspace, a fence, an arrival counter; the last program of this column block sums
    them in a fixed order (the same bits every run, unlike fp32 atomics). Three round trips one after
    another at the kernel's end: 1.7-2.0 us on the H200 (gemv_tail_probe_round25.md), where
    utils.kernels._splitk_fixup_tagged takes 0.8-1.2. Returns (y, last): the column block's sum, and
    whether this program is the one that holds it."""
    tl.store(part_ptr + pid_k * N + rn, y, mask=mask)
    tl.debug_barrier()                            # every thread's partial is written ...
    arrived = tl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel")          # ... before this release
    last = arrived == SPLIT_K - 1
    if last:
        # SPLIT_K is a constant, so these loads are unrolled and in flight together: this sum is the
        # kernel's tail, and a loop of dependent L2 round trips here cost 2-7 us on the H100
        y = tl.zeros((BLOCK,), dtype=tl.float32)
        for k in range(0, SPLIT_K):
            y += tl.load(part_ptr + k * N + rn, mask=mask, other=0.0, cache_modifier=".cg")
        tl.atomic_xchg(lock_ptr + pid_n, 0)       # ready for the next call
    return y, last


def fixup_locks(device, n: int) -> torch.Tensor:
    """Zeroed int32 counters for splitk_fixup, made once per device; each call leaves them at 0. Shared
    by every stream of the device: the probes' kernels must not run concurrently on two streams."""
    device = torch.device(device)
    key = str(device)
    if key not in _FIXUP_LOCKS or _FIXUP_LOCKS[key].numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("fixup_locks: make the counters (one call) before capturing a CUDA graph")
        _FIXUP_LOCKS[key] = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
    return _FIXUP_LOCKS[key]

@triton.jit
def _load_group(qw_ptr, qz_ptr, s_ptr, g, rn, r8, N, NG, nmask, R: tl.constexpr):
    m = nmask & ((rn * 0 + g) < NG)
    q = tl.load(qw_ptr + (g * R + r8)[:, None] * N + rn[None, :], mask=m[None, :], other=0,
                eviction_policy="evict_first")
    zp = tl.load(qz_ptr + g * (N // 8) + rn // 8, mask=m, other=0)
    s = tl.load(s_ptr + g * N + rn, mask=m, other=0.0)
    return q, zp, s


@triton.jit
def _probe_gemv_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, y_ptr, part_ptr, lock_ptr, K, N,
                       GROUP: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr,
                       ZFOLD: tl.constexpr, PREFETCH: tl.constexpr, FIXUP: tl.constexpr,
                       F16X2: tl.constexpr, FIX_UNROLL: tl.constexpr = False):
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    R: tl.constexpr = GROUP // 8
    NG = K // GROUP
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    r8 = tl.arange(0, R)
    zshift = (rn % 8) * 4
    x32 = x_ptr.to(tl.pointer_type(tl.int32))
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if PREFETCH:
        q, zp, s16 = _load_group(qw_ptr, qz_ptr, s_ptr, pid_k, rn, r8, N, NG, nmask, R)
    for g in range(pid_k, NG, SPLIT_K):
        if PREFETCH:
            qn, zpn, sn = _load_group(qw_ptr, qz_ptr, s_ptr, g + SPLIT_K, rn, r8, N, NG, nmask, R)
        else:
            q, zp, s16 = _load_group(qw_ptr, qz_ptr, s_ptr, g, rn, r8, N, NG, nmask, R)
        z = ((zp >> zshift) & 0xF) + 1
        s = s16.to(tl.float32)
        if F16X2:
            zz = ((0x6400 + z) << 16) | (0x6400 + z)
            p0, p1, p2, p3 = kernels._xpairs(x32 + g * (GROUP // 2), r8)      # each [R, 1]
            part = tl.inline_asm_elementwise(
                _F16X2_DOT8, "=r,r,r,r,r,r,r",
                [q, zz[None, :], p0, p1, p2, p3],
                dtype=tl.int32, is_pure=True, pack=1).to(tl.float32, bitcast=True)
        else:
            xg = x_ptr + g * GROUP + r8 * 8
            qh = q >> 16
            part = tl.zeros((R, BLOCK_N), dtype=tl.float32)
            for j in tl.static_range(4):
                m = 0xF << (4 * j)
                x0 = tl.load(xg + j).to(tl.float32) * (1.0 / (1 << (4 * j)))
                x1 = tl.load(xg + j + 4).to(tl.float32) * (1.0 / (1 << (4 * j)))
                if ZFOLD:
                    zj = ((z << (4 * j)) | 0x4B000000).to(tl.float32, bitcast=True)[None, :]
                else:
                    zj = 8388608.0
                w0 = ((q & m) | 0x4B000000).to(tl.float32, bitcast=True) - zj
                w1 = ((qh & m) | 0x4B000000).to(tl.float32, bitcast=True) - zj
                part += w0 * x0[:, None]                 # two statements: two FFMAs, no FMUL + FADD
                part += w1 * x1[:, None]
            if not ZFOLD:
                xs = tl.sum(tl.load(x_ptr + g * GROUP + tl.arange(0, GROUP)).to(tl.float32), axis=0)
                part -= (z.to(tl.float32) * xs)[None, :] / R
        acc += tl.sum(part, axis=0) * s
        if PREFETCH:
            q, zp, s16 = qn, zpn, sn
    y = acc
    if SPLIT_K == 1:
        tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=nmask)
    elif FIXUP:
        tl.store(part_ptr + pid_k * N + rn, y, mask=nmask)
        tl.debug_barrier()                                  # every thread's partial is written ...
        arrived = tl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel")   # ... before this release
        if arrived == SPLIT_K - 1:                          # the last program of this column block
            tot = tl.zeros((BLOCK_N,), dtype=tl.float32)
            if FIX_UNROLL:                                  # independent loads, issued together
                for k in tl.static_range(SPLIT_K):
                    tot += tl.load(part_ptr + k * N + rn, mask=nmask, other=0.0, cache_modifier=".cg")
            else:
                for k in range(SPLIT_K):                    # fixed order: the same bits every run
                    tot += tl.load(part_ptr + k * N + rn, mask=nmask, other=0.0, cache_modifier=".cg")
            tl.store(y_ptr + rn, tot.to(y_ptr.dtype.element_ty), mask=nmask)
            tl.atomic_xchg(lock_ptr + pid_n, 0)              # ready for the next call
    else:
        tl.atomic_add(y_ptr + rn, y, mask=nmask, sem="relaxed")


# Round 9's kernel (not kept, see ROUNDS[9]): an Int4 GEMV on the tensor cores ("mma").
# The shipped f16x2 dot (utils.kernels._F16X2_DOT16) spends about two instructions per weight (dequant, fp16 products, fp32 sums); the
# GEMV is issue- and latency-bound, not DRAM-bound (docs/lab05-kernels-gpu.md). Here
# the products and sums go to mma.sync (m16n8k16, fp16 in, fp32 out): a tensor-core instruction does
# what 16 FMAs per lane did. A batch-1 GEMV fills one of the mma's eight B columns with real work, so
# the mma is 1/8 useful; tensor cores have far more than 8x the throughput the GEMV needs.
#
# Layout: the mma wants lane (g, t) = (lane / 4, lane % 4) to hold A's rows g and g + 8 at k = 2t, 2t+1,
# 2t+8, 2t+9. Triton's load gives lane L the 16 bytes at positions 4L..4L+3 of a row. So position p
# is mapped to column 4 (p // 16) + p % 4 and packed row (p // 4) % 4: the four lanes t of a group g
# hold the SAME four columns at four consecutive packed rows (32 values of K) -- exactly the k split
# the mma wants, K reordered within those 32 (the dot does not care; x is loaded in the same order).
# One call (pack = 4 reps words) does 2 mma per pair of columns: A = the nibbles as fp16 1024 + n
# (nibbles 0, 4, 2, 6; Marlin's lop3 with the magic number 0x6400) or 1024 + 16 n (nibbles 1, 5, 3, 7,
# not shifted), B = (x_k, x_k+4) pairs, those for the 16 n terms divided by 16 in fp16. No subtraction
# per weight: sum (1024 + n) x = 1024 sum x + sum n x, so per group and column the kernel subtracts
# 1024 S_even + 64 S_odd + z (S_even + S_odd) once (S: sums of x over the group's even / odd k). The
# products are exact in fp32 (fp16 x fp16), the sums fp32; the big 1024 x terms cost ~2^-13 relative
# per group, against fp16x2's 2^-11 per product.
# Why it was not kept, besides speed: it is right only if Triton hands the asm lane L positions
# 4L..4L+3, and nothing in Triton promises that layout. At GROUP 256 with block_n 64 (the x load of
# [GROUP] fp16 and the [4 block_n] tile had one shape) it chose 8 positions per thread and the GEMV was
# wrong (relative L2 0.77). Doing this properly takes explicit layouts (Gluon), not a guess.


def _mma_dot_asm(rows: int) -> str:
    """PTX for one call over `rows` x 4 packed rows: $0..$3 = fp32 sums (bits) over their K for this lane
    group's 4 columns; $4.. = the int32 codes, 4 per row (a lane's 4 columns); then x's address at
    the first packed row (4 copies, pack=4). The mma accumulates across the rows."""
    lines = ["{", ".reg .b32 x01, x23, x45, x67, X0, X1, X2, X3, r16, l, q8;", ".reg .f32 z;", ".reg .b64 xa;",
             ".reg .b32 " + ", ".join(f"p{i}_{j}" for i in range(4) for j in range(4)) + ";",
             ".reg .f32 " + ", ".join(f"d{c}_{j}" for c in range(2) for j in range(4)) + ";",
             "mov.u32 l, %laneid;", "and.b32 l, l, 3;", f"mad.wide.u32 xa, l, 16, ${4 + 4 * rows};",
             "mov.b32 r16, 0x2C002C00;", "mov.f32 z, 0f00000000;"]
    mma = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
    for r in range(rows):
        lines += [f"ld.global.nc.v4.b32 {{x01, x23, x45, x67}}, [xa+{64 * r}];",   # x[8 row .. 8 row + 7]
                  "prmt.b32 X0, x01, x45, 0x5410;", "prmt.b32 X1, x01, x45, 0x7632;",
                  "prmt.b32 X2, x23, x67, 0x5410;", "prmt.b32 X3, x23, x67, 0x7632;",
                  "mul.rn.f16x2 X1, X1, r16;", "mul.rn.f16x2 X3, X3, r16;"]       # x / 16 for the 16 n terms
        for i in range(4):
            q = f"${4 + 4 * r + i}"
            lines += [f"lop3.b32 p{i}_0, {q}, 0x000F000F, 0x64006400, 0xEA;",     # nibbles 0, 4: 1024 + n
                      f"lop3.b32 p{i}_1, {q}, 0x00F000F0, 0x64006400, 0xEA;",     # 1, 5: 1024 + 16 n
                      f"shr.u32 q8, {q}, 8;",
                      f"lop3.b32 p{i}_2, q8, 0x000F000F, 0x64006400, 0xEA;",     # 2, 6
                      f"lop3.b32 p{i}_3, q8, 0x00F000F0, 0x64006400, 0xEA;"]     # 3, 7
        for c in range(2):       # columns (2c, 2c + 1) of the lane's four are A's rows g and g + 8
            a, b, d = 2 * c, 2 * c + 1, ", ".join(f"d{c}_{j}" for j in range(4))
            acc = "z, z, z, z" if r == 0 else d
            lines += [f"{mma} {{{d}}}, {{p{a}_0, p{b}_0, p{a}_1, p{b}_1}}, {{X0, X1}}, {{{acc}}};",
                      f"{mma} {{{d}}}, {{p{a}_2, p{b}_2, p{a}_3, p{b}_3}}, {{X2, X3}}, {{{d}}};"]
    lines += ["mov.b32 $0, d0_0;", "mov.b32 $1, d0_2;", "mov.b32 $2, d1_0;", "mov.b32 $3, d1_2;", "}"]
    return "\n".join(lines)


_MMA_DOT1, _MMA_DOT2, _MMA_DOT4 = (tl.constexpr(_mma_dot_asm(r)) for r in (1, 2, 4))
_MMA_ARGS1, _MMA_ARGS2, _MMA_ARGS4 = (tl.constexpr(",".join(["=r"] * 4 + ["r"] * (4 * r) + ["l"] * 4)) for r in (1, 2, 4))


@triton.jit
def _mma_dot(qw_ptr, x32, g, r0, t, rn, nmask, N, GROUP: tl.constexpr, ROWS: tl.constexpr):
    """fp32 [positions]: per position, the sum over packed rows 4 r0 .. 4 (r0 + ROWS) - 1 of group g of
    (1024 + n or 1024 + 16 n) x for its column (see above)."""
    q_ptr = qw_ptr + (g * (GROUP // 8) + 4 * r0 + t) * N + rn
    xa = (x32 + g * (GROUP // 2) + 16 * r0).to(tl.int64, bitcast=True) + tl.zeros_like(rn).to(tl.int64)
    q0 = tl.load(q_ptr, mask=nmask, other=0, eviction_policy="evict_first")
    if ROWS == 1:
        d = tl.inline_asm_elementwise(_MMA_DOT1, _MMA_ARGS1, [q0, xa], dtype=tl.int32, is_pure=True, pack=4)
    else:
        q1 = tl.load(q_ptr + 4 * N, mask=nmask, other=0, eviction_policy="evict_first")
        if ROWS == 2:
            d = tl.inline_asm_elementwise(_MMA_DOT2, _MMA_ARGS2, [q0, q1, xa], dtype=tl.int32, is_pure=True,
                                          pack=4)
        else:
            q2 = tl.load(q_ptr + 8 * N, mask=nmask, other=0, eviction_policy="evict_first")
            q3 = tl.load(q_ptr + 12 * N, mask=nmask, other=0, eviction_policy="evict_first")
            d = tl.inline_asm_elementwise(_MMA_DOT4, _MMA_ARGS4, [q0, q1, q2, q3, xa], dtype=tl.int32,
                                          is_pure=True, pack=4)
    return d.to(tl.float32, bitcast=True)


@triton.jit
def _probe_int4_gemv_mma_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, y_ptr, part_ptr, lock_ptr, K, N,
                                GROUP: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr,
                                NUM_STAGES: tl.constexpr):
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    P: tl.constexpr = 4 * BLOCK_N                 # positions: 4 packed rows x BLOCK_N columns
    R4: tl.constexpr = GROUP // 32                # 4 packed rows (32 K) per mma k step
    ROWS: tl.constexpr = R4 if R4 < 4 else 4      # of them per asm call (GPTQ's 32, 64, 128: one call)
    tl.static_assert(P >= 128, "BLOCK_N >= 32: a warp's 32 lanes x 4 positions must span the tile")
    p = tl.arange(0, P)
    rn = pid_n * BLOCK_N + 4 * (p // 16) + p % 4  # the column at position p
    t = (p // 4) % 4                              # its packed row within four (the lane's mma k slot)
    nmask = rn < N
    kk = tl.arange(0, GROUP)
    odd = (kk % 2) == 1
    x32 = x_ptr.to(tl.pointer_type(tl.int32))
    acc = tl.zeros((P,), dtype=tl.float32)
    for g in tl.range(pid_k, K // GROUP, SPLIT_K, num_stages=NUM_STAGES):
        d = _mma_dot(qw_ptr, x32, g, 0, t, rn, nmask, N, GROUP, ROWS)
        for r0 in tl.static_range(ROWS, R4, ROWS):
            d += _mma_dot(qw_ptr, x32, g, r0, t, rn, nmask, N, GROUP, ROWS)
        # this group's sums of x, the odd k as the mma saw them (x / 16 rounded to fp16, times 16)
        xg = tl.load(x_ptr + g * GROUP + kk).to(tl.float32)
        s_even = tl.sum(tl.where(odd, 0.0, xg), axis=0)
        s_odd = tl.sum(tl.where(odd, (xg * 0.0625).to(tl.float16).to(tl.float32) * 16.0, 0.0), axis=0)
        s_x = s_even + s_odd
        zp = tl.load(qz_ptr + g * (N // 8) + rn // 8, mask=nmask, other=0)
        z1 = ((zp >> ((rn % 8) * 4)) & 0xF).to(tl.float32)          # GPTQ v1 stores zero - 1
        s = tl.load(s_ptr + g * N + rn, mask=nmask, other=0.0).to(tl.float32)
        # sum (n - z) x = d - 1024 S_even - 64 S_odd - z S, z = z1 + 1
        acc += (d - (z1 * s_x + (1024.0 * s_even + 64.0 * s_odd + s_x))) * s
    smask = nmask & (t == 0)                      # four lanes hold each column: one stores it
    last = True
    if SPLIT_K > 1:
        acc, last = splitk_fixup(acc, part_ptr, lock_ptr, pid_n, pid_k, rn, smask, N, SPLIT_K, P)
    if last:
        tl.store(y_ptr + rn, acc.to(y_ptr.dtype.element_ty), mask=smask)


def probe_mma_gemv(x, qw, qz, s, block_n=64, split_k=7, num_warps=1, num_stages=1, group_size=128):
    """Round 9's tensor-core GEMV at a fixed tile (fp16 x, NVIDIA only); utils.kernels' locks and checks."""
    K, N = qw.shape[0] * 8, qw.shape[1]
    assert x.dtype == torch.float16 and x.data_ptr() % 16 == 0 and block_n >= 32 and group_size >= 32
    y = torch.empty((N,), device=x.device, dtype=x.dtype)
    locks = fixup_locks(x.device, triton.cdiv(N, block_n))
    work = torch.empty((K // group_size, N), device=x.device, dtype=torch.float32)
    _probe_int4_gemv_mma_kernel[(triton.cdiv(N, block_n), split_k)](
        x, qw, qz, s, y, work, locks, K, N, GROUP=group_size, BLOCK_N=block_n, SPLIT_K=split_k,
        NUM_STAGES=num_stages, num_warps=num_warps, num_stages=1)
    return y.reshape(1, N)


def launch_fixed(x, qw, qz, s, block_n, num_warps, split_k, maxnreg=None, num_stages=1):
    """utils.kernels.int4_gemv's fixed-tile launch (f16x2), with a register cap; returns (y, the compiled
    kernel: n_regs, n_spills, metadata.shared)."""
    K, N = qw.shape[0] * 8, qw.shape[1]
    y = torch.empty((N,), device=x.device, dtype=x.dtype)
    work, locks = kernels._gemv_state(x.device, ("probe", N, block_n, split_k),
                                      lambda: kernels._gemv_state_words(block_n, split_k, N))
    ck = kernels._int4_gemv_kernel[(triton.cdiv(N, block_n), split_k)](
        x, qw, qz, s, y, work, locks, K, N, GROUP=128, BLOCK_N=block_n, SPLIT_K=split_k, F16X2=True,
        NUM_STAGES=num_stages, ROW_ACC=kernels._gemv_row_acc(block_n, num_warps), num_warps=num_warps, num_stages=1,
        **kernels._gemv_fixup_args(block_n, num_warps, split_k, N), **({"maxnreg": maxnreg} if maxnreg else {}))
    return y.reshape(1, N), ck


def probe_gemv(x, qw, qz, s, block_n=256, split_k=8, zfold=True, prefetch=True, fixup=True, f16x2=False,
               num_warps=4, num_stages=1, group_size=128, fix_unroll=False):
    K, N = qw.shape[0] * 8, qw.shape[1]
    nb = triton.cdiv(N, block_n)
    locks = fixup_locks(x.device, nb)      # the shipped GEMV's counters: this fix-up also leaves them at 0
    atomics = split_k > 1 and not fixup
    y = torch.zeros(N, device=x.device, dtype=torch.float32) if atomics else torch.empty(N, device=x.device, dtype=x.dtype)
    part = torch.empty((split_k, N) if fixup and split_k > 1 else (1,), device=x.device, dtype=torch.float32)
    _probe_gemv_kernel[(nb, split_k)](x, qw, qz, s, y, part, locks, K, N, GROUP=group_size, BLOCK_N=block_n,
                                      SPLIT_K=split_k, ZFOLD=zfold, PREFETCH=prefetch, FIXUP=fixup, F16X2=f16x2,
                                      FIX_UNROLL=fix_unroll,
                                      num_warps=num_warps, num_stages=num_stages)
    return y.to(x.dtype).reshape(1, N)


# Round 1 (H100): f16x2 without prefetch won; prefetch, atomics and the f32 dequant lost. Round 2 asked
# whether the fix-up's serial loads of the partials cost time at large split_k, over more tiles and splits.
ROUNDS = {
    1: dict(variants={"f32 atomics": dict(zfold=False, prefetch=False, fixup=False),
                      "f32 zfold fixup": dict(zfold=True, prefetch=False, fixup=True),
                      "f32 zfold fixup prefetch": dict(zfold=True, prefetch=True, fixup=True),
                      "f16x2 fixup": dict(f16x2=True, prefetch=False, fixup=True),
                      "f16x2 fixup prefetch": dict(f16x2=True, prefetch=True, fixup=True)},
            layouts=((128, 1), (256, 2), (512, 4), (256, 4)),            # (block_n, num_warps)
            programs=(264, 528, 1056)),                                  # 2 to 8 per H100 SM
    2: dict(variants={"f16x2 fixup": dict(f16x2=True, prefetch=False, fixup=True),
                      "f16x2 fixup unrolled": dict(f16x2=True, prefetch=False, fixup=True, fix_unroll=True)},
            layouts=((128, 1), (256, 2), (512, 4), (256, 1), (512, 2), (1024, 4)),
            programs=(528, 792, 1056, 1584, 2112)),                      # 4 to 16 per H100 SM
    # Round 3: every program of the shipped kernel loads a group, computes it, loads the next; all
    # programs fit in one wave, so loads and math alternate in lock-step. Does Triton's pipeliner
    # (cp.async of the next groups' codes into shared memory, NUM_STAGES) overlap them, and does it let
    # a program take more groups (a smaller split-K, a shorter fix-up)?
    3: dict(shipped=True, layouts=((128, 1), (256, 2), (512, 4)), groups_per_program=(2, 3, 4, 6, 8),
            stages=(1, 2, 3)),
    # Round 4 (H200): the same GEMV takes about the same time on the H100 and on the H200, which has 42 %
    # more bandwidth: the kernel is held by latency or issue, not by DRAM. More bytes in flight (deeper
    # stages, more programs: split-K past the shipped cap of 64) is the question; ncu says which.
    # Answer (round 4a): neither. 3-4 stages lost; split-K 74 took 26 us and 148 took 42 us (the fix-up's
    # sum is no longer unrolled). ncu (ncu_round4.txt): elapsed cycles, not microseconds, stay put when
    # the SM clock drops; issue slots 34-43 % busy, 8-14 warps of 64 resident: latency and instruction
    # bound. Round 4b: x read 16 bytes per row and paired by prmt (_XPAIRS_V4): 80 registers, not 96;
    # 18944 -> 3584 went from 13.7 to 12.6 us. Threads with 8 columns (block_n = 256 x num_warps) lost.
    4: dict(shipped=True, layouts=((128, 1), (256, 2), (512, 4), (256, 1), (512, 2), (1024, 4)),
            groups_per_program=(1, 2, 3, 4), stages=(1, 2, 3), uncapped=True),
    # Round 5 (H200, not kept): two knobs of the shipped kernel, timed off and on at the best round-4b
    # configs. HALFSUM (the asm's two fp16 halves added in fp16, one conversion: 0.5 instruction per
    # packed int32 less) was slower at every config (12.0 -> 12.5 us, 12.4 -> 15.3 us at the best);
    # PDL (programmatic dependent launch: the next call launches early and prefetches its first group
    # to L2) was 3-7 us slower. Its log: docs/device-runs/20261123-lab05-kernels-h200/gemv_probe_round5.log.
    # Round 6 (H200): block_n < 128 x num_warps spreads each group's rows over the warps (ROW_ACC), so
    # a program has more warps, and more loads in flight, without more split-K partials to fix up.
    # Answer: a little, at K=18944 only (12.2 against 12.5 us: two warps, split 37); both kept as configs.
    6: dict(shipped=True, layouts=((128, 1), (128, 2), (128, 4), (256, 2), (256, 4)),
            groups_per_program=(1, 2, 3, 4, 6), stages=(1, 2, 3)),
    # Round 7 (H200, not kept): the group loop unrolled twice (tl.range's loop_unroll_factor=2, as a
    # constexpr UNROLL: two groups' loads and math interleaved, 128 registers) at the best configs of
    # rounds 4b and 6. With one stage it helped (14.4 -> 12.6 us, 13.1 -> 12.6 us), with two it lost
    # (12.0 -> 15.6 us); the best of all, 11.9 us at 18944 -> 3584 (128 columns, 2 warps, split 37, one
    # stage), was 0.3 us off the same config unrolled once: not worth a fifth autotune knob.
    # gemv_probe_round7.log in the H200 run folder.
    # Round 8 (H200, not kept): x's loads are plain ld.global (the pipeliner copies only the codes, zeros
    # and scales ahead), so a group's first x load may wait an L2 round trip before its math: the
    # long-scoreboard stalls? A constexpr PREFETCH_X asked L1 for every group's x at the program's start
    # (prefetch.global.L1, three lines per group; CCTL.E.PF1 in the SASS), timed off and on at 3 tiles x
    # 2-3 splits x 1-2 stages at both shapes. No direction: of 30 pairs, 10 faster (by 0.2-0.6 us), 16
    # slower (0.3-1.6 us), 4 within 0.1 us; best 11.8 us at 18944 -> 3584 (128 columns, 2 warps, split
    # 37, one stage) against 12.4 us without, but its two-stage twin 12.8 against 12.4. The shipped
    # default, timed twice in the run, moved 0.2 us: about the size of the remaining gap to the targets.
    # gemv_probe_round8.log and .md in the H200 run folder.
    # Round 9 (H200): a different kernel, not a knob: _probe_int4_gemv_mma_kernel above hands products
    # and sums to mma.sync. Compiled for sm_90, its loop is 705 instructions per group of 128 columns x
    # 128 K per warp, against 1199 for the f16x2 kernel's. Its tiles x splits x stages, timed hot like
    # rounds 1-8: best 13.6 us at 3584 -> 18944 and 14.5 us at 18944 -> 3584, against 12.0 / 12.4 us
    # for the shipped kernel; two stages much slower (shared-memory traffic: ncu's MIO throttle). ncu
    # (ncu_round9.txt, which flushes caches) disagreed: 23.1k cycles against the shipped 27.1k, 27 %
    # fewer instructions executed, longer stalls (8.9 cycles per issue against 7.0). Round 10 asks why.
    9: dict(shipped=True, mma=True, layouts=((32, 1), (64, 1), (128, 1), (64, 2), (128, 2), (256, 2), (128, 4)),
            groups_per_program=(1, 2, 4), stages=(1, 2)),
    # Round 10 (H200): rounds 1-9 replayed ONE set of operands, so part of the 34 MB of codes could stay
    # in the 50 MB L2 between calls (bf16's 136 MB could not): scripts/bench_kernels.py, timing with
    # copies past 3x L2, found the shipped default at 15.4 / 15.7 us cold against 12.0 / 12.4 us hot.
    # And ncu (which flushes caches) had round 9's mma kernel at fewer cycles than the shipped one. So:
    # both kernels, cold, same tiles x splits x stages. Answer (gemv_probe_round10.md): cold, one stage
    # wins for the shipped kernel too (128 columns over two warps: 14.1 us at both shapes, against 15.5
    # / 15.8 us for its hot-tuned default, which made the autotuner time with L2 flushes); mma 13.6 us at
    # 3584 -> 18944 (4 % better) and 16.3 us at 18944 -> 3584 (16 % worse). Not kept: no clear gain,
    # and its correctness rests on a layout Triton does not promise (see the kernel's comment).
    10: dict(shipped=True, layouts=((128, 1), (128, 2), (256, 2), (512, 4)),
             mma_layouts=((32, 1), (64, 1), (128, 1), (64, 2), (128, 2), (128, 4)),
             groups_per_program=(1, 2, 4), stages=(1, 2)),
    # Round 11 (H200, cold; scripts/gemv_tma_probe.py asked why first): 64 columns on one warp, 4 groups
    # per program, was the fastest tile there (13.1-13.3 / 13.4-13.8 us). Narrower still, and the
    # groups per program around 4?
    # Answer (gemv_probe_round11.md): 32 columns, split 6 / 30: 12.5 / 13.1 us, against 13.2 / 13.4 us
    # for the 64-column default; neighbouring splits of the same tile up to 15.6 us.
    11: dict(shipped=True, layouts=((32, 1), (64, 1), (64, 2)), groups_per_program=(2, 3, 4, 5, 6), stages=(1,)),
    # Round 12: narrower yet (16 columns: 4 lanes a row, 8 packed-row pairs side by side), and how
    # repeatable the split's effect is (each config timed twice).
    # Answer (gemv_probe_round12.md): the repeats agree within 0.1 us, so a split's effect is real, not
    # noise (32 columns: split 6 12.5 us, split 7 15.4 us); 16 columns and two warps lose.
    12: dict(shipped=True, layouts=((16, 1), (32, 1), (32, 2), (16, 1), (32, 1)), groups_per_program=(3, 4, 5, 6, 8),
             stages=(1,)),
    # Round 13: the one-warp 32- and 64-column tiles over more splits, beside the benchmark.
    13: dict(shipped=True, layouts=((32, 1), (64, 1)), groups_per_program=(3, 5, 6, 7, 8, 9, 10, 12), stages=(1,)),
    # Round 14 (commit 4c33639, not kept): the access pattern alone costs 11.3 us and more (round 11), with
    # one group's loads in flight per warp. An AT_ONCE constexpr loaded all of a program's groups (2, 4 or
    # 8) with one set of loads, then computed them: slower at every tile (15.5 us at best against
    # 13.2-13.3 us), gemv_probe_round14.md. Every warp then waits for all of its bytes before any math.
    # Round 15: rounds 11-13's fast configs are the ones whose programs just fit in one wave of resident
    # warps (32 columns: split 6 = 3552 programs, split 7 = 4144 and 3 us slower). Registers decide how
    # many warps are resident: the sweep prints them and the one-wave capacity, and caps them (maxnreg).
    15: dict(shipped=True, occupancy=True, layouts=((32, 1), (64, 1), (32, 2)), maxnreg=(None, 64, 80),
             splits={28: (4, 5, 6, 7, 8, 10, 14), 148: (19, 22, 25, 30, 34, 37, 42, 50)}),
    # Answer (gemv_probe_round15.md): yes, one full wave is what the fast configs share (32 columns split 7
    # with registers capped at 64: 12.9 us, against 15.4 us uncapped, whose 4144 programs need a second
    # wave), but a fuller wave is not faster: 12.6 / 13.2 us at best, as before.
    # Round 16 (commit 68cdfe9, not kept): why then did loading the next group before this one's math
    # (round 11's PREFETCH) not help? It had been timed at splits tuned without it, and its extra registers
    # take warps out of the wave. Timed at splits that fill one wave at its own register count (80-128
    # registers), and with registers capped: 13.4 / 13.4 us at best, no better (gemv_probe_round16.md).
    # Round 17 (commit a06e190, not kept): the codes' cache policy at the one-wave configs. The shipped
    # evict_first is fastest; no hint, .cg or evict_last cost 1.0-1.5 us; .cg with evict_first does not
    # assemble (gemv_probe_round17.md).
    # Round 18 is scripts/gemv_persistent_probe.py. Round 19: Triton's cp.async stages were last timed
    # (round 10, cold) on 128-column tiles, before the one-wave tiles of rounds 11-15 (all one stage).
    # Stages keep the next group's bytes in flight in shared memory, not in registers, so they need not
    # take warps out of the wave (the printed capacity counts shared memory too).
    19: dict(shipped=True, occupancy=True, layouts=((32, 1), (64, 1)), maxnreg=(None,), stages=(1, 2, 3),
             splits={28: (4, 5, 6, 7, 8), 148: (25, 30, 37, 42, 50)}),
    # Answer (gemv_probe_round19.md, 2026-11-24 H200 run folder): no. At every tile and split, 2 or 3
    # stages were slower than one: 15.4 / 15.6 us at best against 12.5 / 13.2 us (32 columns, split 6
    # / 30, one stage, as before), though the shared memory they take left the one-wave capacity as it
    # was at the fast splits. Also from this run: 32 columns beat 64 at both shapes again, so the
    # 64-column tile left the autotuner's candidates (utils/kernels.py says why).
}


def variants(round_: int, gpu: bool) -> dict:
    """name -> kwargs of one round; without a GPU only the f32 dequant (no inline PTX in the interpreter)."""
    return {k: v for k, v in ROUNDS[round_].get("variants", {}).items() if gpu or not v.get("f16x2")}


def shape_setup(K, N, device):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(K, N, generator=gen) * 0.02
    qw, qz, s = (t.to(device) for t in kernels.pack_gptq_int4(w, 128))
    wd = kernels.dequant_gptq_int4(qw, qz, s, 128)
    return qw, qz, s, wd


def gpu_copy_gbps() -> float:
    """The device's copy bandwidth (read + write, GB/s), the probes' yardstick; prints the device line."""
    from utils.ceilings import copy_bandwidth
    copy = copy_bandwidth(2 * 2**30, "cuda", repeats=20)["gbps"]
    print(f"{torch.cuda.get_device_name(0)} triton {triton.__version__} copy {copy:.0f} GB/s", flush=True)
    return copy


def shape_case(K, N, device):
    """One GEMV shape for a sweep: operands (x, qw, qz, s), the fp32 dequantized weights, the bytes a
    GEMV moves, and the bf16 F.linear baseline's time on the same weights (timed as time_ops times)."""
    qw, qz, s, wd = shape_setup(K, N, device)
    x = torch.randn(1, K, device=device, dtype=torch.float16)
    qbytes = qw.numel() * 4 + qz.numel() * 4 + s.numel() * 2 + K * 2 + N * 2
    w_bf16 = wd.t().contiguous().to(torch.bfloat16)
    t_bf = time_ops(torch.nn.functional.linear, (x.to(torch.bfloat16), w_bf16))
    return (x, qw, qz, s), wd, qbytes, t_bf


def check(fn, qw, qz, s, wd, K, device, what):
    """fn(x, qw, qz, s) against the fp32 reference, twice."""
    for seed in (1, 2):   # fresh x each time; a second call also checks the locks were reset
        x = torch.randn(1, K, generator=torch.Generator().manual_seed(seed)).half().to(device)
        err = metrics.relative_l2(fn(x, qw, qz, s), x.float() @ wd)
        bound = metrics.matmul_error_bound(torch.float16, K)
        if not err <= bound:
            raise AssertionError(f"{what}: relative L2 {err:.3g} > {bound:.3g}")
    return err


HOT = {"on": False}     # --hot: rounds 1-9's timing


def time_ops(fn, ops) -> float:
    """Seconds per call of fn(*ops), ops = (x, qw, qz, s): cold (roofline.time_cold: replays rotate over
    copies past 3x L2, as a decode step reads each layer's weights; the default since round 10), or
    with --hot one set replayed, as rounds 1-9 timed (part of 34 MB of codes then stays in a 50 MB L2)."""
    from utils import roofline
    if HOT["on"]:
        return roofline.time_kernel(lambda: fn(*ops), "cuda")
    return roofline.time_cold(fn, ops, "cuda")


def write_table(rows, copy_gbps: float, path) -> list[str]:
    """The probes' markdown table, fastest first per shape, written to path; rows start (K, N, variant,
    seconds, bytes moved, bf16 seconds). Returns its lines."""
    lines = ["| shape | variant | us | GB/s | % copy | x bf16 |", "|---|---|---|---|---|---|"]
    for K, N, what, t, qb, tb, *_ in sorted(rows, key=lambda r: (r[0], r[3])):
        lines.append(f"| {K}->{N} | {what} | {t * 1e6:.1f} | {qb / t / 1e9:.0f} | {qb / t / 1e9 / copy_gbps:.0%} "
                     f"| {tb / t:.2f} |")
    Path(path).write_text("\n".join(lines) + "\n")
    return lines


def time_variant(fn, what, cfg, K, N, ops, wd, qbytes, t_bf, rows, device, best):
    """Check fn (x, qw, qz, s -> y) against the reference, time it, append its row; returns the new best (t, cfg)."""
    x, qw, qz, s = ops
    try:
        check(fn, qw, qz, s, wd, K, device, what)
        t = time_ops(fn, ops)
    except Exception as exc:  # noqa: BLE001 - a failing variant is reported, not fatal
        print(f"  {what}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        return best
    rows.append((K, N, what, t, qbytes, t_bf, cfg))
    print(f"  {what}: {t * 1e6:.1f} us  {qbytes / t / 1e9:.0f} GB/s  {t_bf / t:.2f}x bf16", flush=True)
    return (t, cfg) if best is None or t < best[0] else best


def sweep_shipped(sweep, K, N, ops, wd, qbytes, t_bf, rows, device):
    """Round 3: utils.kernels.int4_gemv at fixed (block_n, num_warps, split_k, num_stages); rows appended.
    With sweep["mma"] (round 9) the tensor-core probe kernel instead; sweep["mma_layouts"] (round 10)
    both, the probe at those layouts."""
    ng, best = K // 128, None
    split = (lambda gpp: triton.cdiv(ng, gpp)) if sweep.get("uncapped") else (lambda gpp: kernels._gemv_split(ng, gpp))
    kinds = [("mma", sweep["layouts"])] if sweep.get("mma") else [("shipped", sweep["layouts"])]
    if sweep.get("mma_layouts"):
        kinds.append(("mma", sweep["mma_layouts"]))
    if sweep.get("occupancy"):
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for bn, nw in sweep["layouts"]:
            for mr, st in [(m, st) for m in sweep["maxnreg"] for st in sweep.get("stages", (1,))]:
                for sk in sweep["splits"][ng]:
                    cfg = dict(block_n=bn, num_warps=nw, split_k=sk, maxnreg=mr, num_stages=st)
                    try:
                        ck = launch_fixed(*ops, **cfg)[1]
                    except Exception as exc:  # noqa: BLE001
                        print(f"  {cfg}: FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                        continue
                    cap = kernels.resident_programs(ck.n_regs, nw, sms, ck.metadata.shared)
                    progs = triton.cdiv(N, bn) * sk
                    what = (f"bn={bn} w={nw} sk={sk} maxnreg={mr}" + (f" stages={st}" if st > 1 else "")
                            + f": regs {ck.n_regs} spills {ck.n_spills}, {progs} programs, one wave holds {cap}")
                    best = time_variant(lambda *o, c=cfg: launch_fixed(*o, **c)[0], what, cfg, K, N, ops, wd,
                                        qbytes, t_bf, rows, device, best)
        return best
    for kind, layouts in kinds:
        gemv = probe_mma_gemv if kind == "mma" else functools.partial(kernels.int4_gemv, group_size=128)
        for bn, nw in layouts:
            for sk in sorted({split(gpp) for gpp in sweep["groups_per_program"]}):
                for ns in sweep["stages"]:
                    cfg = dict(block_n=bn, num_warps=nw, split_k=sk, num_stages=ns)
                    what = f"{kind} bn={bn} w={nw} sk={sk} stages={ns}"
                    best = time_variant(lambda *o, c=cfg, f=gemv: f(*o, **c), what, dict(cfg, mma=kind == "mma"),
                                        K, N, ops, wd, qbytes, t_bf, rows, device, best)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check-only", action="store_true", help="check every variant of every round, then stop")
    ap.add_argument("--round", type=int, choices=sorted(ROUNDS), default=3, help="which round's sweep to time")
    ap.add_argument("--hot", action="store_true", help="time one operand set replayed (rounds 1-9's way; "
                    "part of it stays in L2) instead of copies past 3x L2")
    ap.add_argument("--ncu", default=None, help="gemv_best.json of a sweep: launch the shipped kernel and each "
                    "shape's best config once (run under ncu)")
    args = ap.parse_args()
    HOT["on"] = args.hot
    gpu = torch.cuda.is_available() and not kernels.interpreted()
    device = "cuda" if gpu else "cpu"
    if args.check_only or not gpu:
        K, N = 512, 256
        qw, qz, s, wd = shape_setup(K, N, device)
        for name, kw in {f"round {r} {n}": kw for r in ROUNDS for n, kw in variants(r, gpu).items()}.items():
            for sk in (1, 3):
                err = check(lambda *o: probe_gemv(*o, block_n=64, split_k=sk, **kw), qw, qz, s, wd, K,
                            device, name)
                print(f"ok {name} split_k={sk}: rel L2 {err:.2e}")
        return
    import json
    out = Path(os.environ.get("OUT", "/tmp"))
    shapes = ((3584, 18944), (18944, 3584))
    if args.ncu:
        for (K, N), cfgs in zip(shapes, json.loads(Path(args.ncu).read_text())):
            qw, qz, s, wd = shape_setup(K, N, device)
            x = torch.randn(1, K, device=device, dtype=torch.float16)
            for cfg in cfgs if isinstance(cfgs, list) else [cfgs]:   # a config, or a list of them per shape
                if not cfg:                               # {}: the shipped kernel as autotuned
                    kernels.int4_gemv(x, qw, qz, s, 128)
                elif "f16x2" in cfg:                      # rounds 1-2: the probe kernel
                    probe_gemv(x, qw, qz, s, **cfg)
                elif cfg.get("mma"):                      # round 9: the tensor-core probe kernel
                    probe_mma_gemv(x, qw, qz, s, **{k: v for k, v in cfg.items() if k != "mma"})
                else:                                     # rounds 3-4: the shipped kernel, fixed config
                    kernels.int4_gemv(x, qw, qz, s, 128, **{k: v for k, v in cfg.items() if k != "mma"})
        torch.cuda.synchronize()
        return
    copy = gpu_copy_gbps()
    rows, best_cfgs = [], []
    for K, N in shapes:
        ops, wd, qbytes, t_bf = shape_case(K, N, device)
        shipped = lambda *o: kernels.int4_gemv(*o, 128)  # noqa: E731
        t_ship = time_ops(shipped, ops)
        rows.append((K, N, "shipped int4_gemv (default)", t_ship, qbytes, t_bf, None))
        print(f"{K}->{N} ({'hot' if args.hot else 'cold'}): bf16 {t_bf * 1e6:.1f} us, "
              f"shipped {t_ship * 1e6:.1f} us", flush=True)
        best = None
        sweep = ROUNDS[args.round]
        if sweep.get("shipped"):
            best = sweep_shipped(sweep, K, N, ops, wd, qbytes, t_bf, rows, device)
            rows.append((K, N, "shipped int4_gemv (default), again", time_ops(shipped, ops), qbytes, t_bf,
                         None))   # drift check
        for name, kw in variants(args.round, gpu).items():
            for bn, nw in sweep.get("layouts", ()):
                nb = triton.cdiv(N, bn)
                for sk in sorted({max(1, min(K // 128, round(p / nb))) for p in sweep["programs"]}):
                    cfg = dict(kw, block_n=bn, split_k=sk, num_warps=nw)
                    what = f"{name} bn={bn} w={nw} sk={sk}"
                    best = time_variant(lambda *o, c=cfg: probe_gemv(*o, **c), what, cfg,
                                        K, N, ops, wd, qbytes, t_bf, rows, device, best)
        best_cfgs.append(best[1])
    (out / "gemv_best.json").write_text(json.dumps(best_cfgs))
    lines = write_table(rows, copy, out / "gemv_probe.md")
    for K, N in shapes:   # the shipped kernel and the six fastest variants of each shape
        mine = [ln for ln in lines[2:] if ln.startswith(f"| {K}->{N} ")]
        print("\n".join(lines[:2] + [ln for ln in mine if "shipped" in ln] + mine[:6]))


if __name__ == "__main__":
    main()

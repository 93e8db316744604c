"""The Int4 (GPTQ) GEMV's Triton code: y [1, N] = x [1, K] @ dequant(W), weights dequantized in the kernel.

It reads the GPTQ checkpoint layout (v1): qweight int32 [K/8, N] (8 nibbles along K), qzeros int32
[K/g, N/8] stored minus one, scales fp16 [K/g, N]; w = (q - (z + 1)) * s. A program sums a column
block over a range of groups (split-K); the partials are added in a fixed order by one of two fix-ups
(the same bits every run). How a launch is planned is in gemv_plan.py, the call in gemv.py.
"""
from __future__ import annotations

import triton
import triton.language as tl

try:    # griddepcontrol (sm_90+): programmatic dependent launch of the sum kernel
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:     # a Triton without them: the sum kernel is then launched plainly (PDL off)
    gdc_launch_dependents = gdc_wait = None

# fp16x2 dot of two packed int32 (16 nibbles, K rows 8r..8r+15) with 16 activations, in Marlin's manner:
# q & 0x000F000F | 0x64006400 is two fp16 numbers 1024 + n (nibbles j and j+4), minus 1024 + z is n - z
# exactly; q & 0x00F000F0 | 0x64006400 is 1024 + 16n (the next nibbles, unshifted), and times 1/16 minus
# 64 + z (one fma) is n - z exactly; then q >> 8 for the other four. Two weights per instruction, products
# and 8-term sums in fp16 (one per half), then one fp32 sum. $1, $2 = the two int32; $3 = 1024 + z and
# $4 = -(64 + z) as fp16x2; $5..$8 (first int32) and $9..$12 (second) = (x[j], x[j+4]) as fp16x2 for
# j = 0..3; $0 = the fp32 result's bits.
_F16X2_DOT16_INT32 = """
lop3.b32 t, {q}, 0x000F000F, 0x64006400, 0xEA;
sub.f16x2 h, t, $3;
{first} a, h, {x0}{acc};
lop3.b32 t, {q}, 0x00F000F0, 0x64006400, 0xEA;
fma.rn.f16x2 h, t, r16, $4;
fma.rn.f16x2 a, h, {x1}, a;
shr.u32 q8, {q}, 8;
lop3.b32 t, q8, 0x000F000F, 0x64006400, 0xEA;
sub.f16x2 h, t, $3;
fma.rn.f16x2 a, h, {x2}, a;
lop3.b32 t, q8, 0x00F000F0, 0x64006400, 0xEA;
fma.rn.f16x2 h, t, r16, $4;
fma.rn.f16x2 a, h, {x3}, a;"""
_F16X2_DOT16 = tl.constexpr(
    "{\n.reg .b32 q8, t, h, a, r16;\n.reg .b16 lo, hi;\n.reg .f32 flo, fhi, fs;\nmov.b32 r16, 0x2C002C00;"
    + _F16X2_DOT16_INT32.format(q="$1", first="mul.rn.f16x2", acc="", x0="$5", x1="$6", x2="$7", x3="$8")
    + _F16X2_DOT16_INT32.format(q="$2", first="fma.rn.f16x2", acc=", a", x0="$9", x1="$10", x2="$11", x3="$12")
    + "\nmov.b32 {lo, hi}, a;\ncvt.f32.f16 flo, lo;\ncvt.f32.f16 fhi, hi;\nadd.f32 fs, flo, fhi;\nmov.b32 $0, fs;\n}")


@triton.jit
def _group_dot_f32(q, z, x_ptr, g, r8, GROUP: tl.constexpr):
    """sum over one group's rows of (q - z) * x, per column, exactly dequantized in fp32: nibble j kept in
    place, (q & 0xF<<4j) | bits of 2^23 read as fp32 is 2^23 + n 2^4j, and minus 2^23 + z 2^4j it is
    (n - z) 2^4j exactly (no shift, no int->float); the 2^4j goes into x instead. Returns [GROUP/8, BLOCK_N]."""
    xg = x_ptr + g * GROUP + r8 * 8
    qh = q >> 16                                  # nibbles 4..7 moved to bits 0..15
    part = tl.zeros(q.shape, dtype=tl.float32)
    for j in tl.static_range(4):
        m = 0xF << (4 * j)
        zj = ((z << (4 * j)) | 0x4B000000).to(tl.float32, bitcast=True)[None, :]
        x0 = tl.load(xg + j).to(tl.float32) * (1.0 / (1 << (4 * j)))
        x1 = tl.load(xg + j + 4).to(tl.float32) * (1.0 / (1 << (4 * j)))
        part += (((q & m) | 0x4B000000).to(tl.float32, bitcast=True) - zj) * x0[:, None]
        part += (((qh & m) | 0x4B000000).to(tl.float32, bitcast=True) - zj) * x1[:, None]
    return part


# One 16-byte load of x[8 row .. 8 row + 7] (four int32: (x0, x1), (x2, x3), (x4, x5), (x6, x7)) and four
# byte permutes into the pairs the dequant multiplies: (x0, x4), (x1, x5), (x2, x6), (x3, x7). Every thread
# needs every pair of its rows. Written with tl.load and bit operations instead, it became four 4-byte
# loads through shared memory, with more instructions and registers per group (docs/kernels.md).
_XPAIRS_V4 = tl.constexpr("""{
.reg .b32 x01, x23, x45, x67;
ld.global.nc.v4.b32 {x01, x23, x45, x67}, [$4];
prmt.b32 $0, x01, x45, 0x5410;
prmt.b32 $1, x01, x45, 0x7632;
prmt.b32 $2, x23, x67, 0x5410;
prmt.b32 $3, x23, x67, 0x7632;
}""")


@triton.jit
def _xpairs(x32, row):
    """fp16x2 registers (x[8 row + j], x[8 row + j + 4]) for j = 0..3, each shaped like row with a trailing
    axis of 1 (row [R] gives [R, 1]), to broadcast over a tile's columns; x32 must be 16-byte aligned
    (int4_gemv copies x if it is not)."""
    p0, p1, p2, p3 = tl.inline_asm_elementwise(
        _XPAIRS_V4, "=r,=r,=r,=r,l", [(x32 + row * 4).to(tl.int64, bitcast=True)],
        dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)
    return tl.expand_dims(p0, -1), tl.expand_dims(p1, -1), tl.expand_dims(p2, -1), tl.expand_dims(p3, -1)


@triton.jit
def _group_dot_f16x2(qa, qb, z, x_ptr, g, r16, GROUP: tl.constexpr):
    """The same sum with two weights per instruction (_F16X2_DOT16) over packed rows 2 r16 (qa) and
    2 r16 + 1 (qb); x must be fp16. Returns [GROUP/16, BLOCK_N]."""
    x32 = x_ptr.to(tl.pointer_type(tl.int32)) + g * (GROUP // 2)    # x as pairs of halves
    a0, a1, a2, a3 = _xpairs(x32, 2 * r16)
    b0, b1, b2, b3 = _xpairs(x32, 2 * r16 + 1)
    zz = ((0x6400 + z) << 16) | (0x6400 + z)      # 1024 + z in both halves
    nz = 0xD400 + (z << 4)                        # -(64 + z) in fp16
    nzz = (nz << 16) | nz
    return tl.inline_asm_elementwise(
        _F16X2_DOT16, "=r,r,r,r,r,r,r,r,r,r,r,r,r",
        [qa, qb, zz[None, :], nzz[None, :], a0, a1, a2, a3, b0, b1, b2, b3],
        dtype=tl.int32, is_pure=True, pack=1).to(tl.float32, bitcast=True)


@triton.jit
def _group_zeros_scales(qz_ptr, s_ptr, g, rn, nmask, N):
    """Group g's zero points z (GPTQ v1 stores z - 1, eight 4-bit values per int32) and fp32 scales,
    per column rn."""
    zp = tl.load(qz_ptr + g * (N // 8) + rn // 8, mask=nmask, other=0)
    z = ((zp >> ((rn % 8) * 4)) & 0xF) + 1
    s = tl.load(s_ptr + g * N + rn, mask=nmask, other=0.0).to(tl.float32)
    return z, s


@triton.jit
def _gemv_groups(x_ptr, qw_ptr, qz_ptr, s_ptr, rn, nmask, N, first, last, step,
                 GROUP: tl.constexpr, BLOCK_N: tl.constexpr, F16X2: tl.constexpr, NUM_STAGES: tl.constexpr,
                 ROW_ACC: tl.constexpr, qrow):
    """fp32 [BLOCK_N] partial of y over groups first, first + step, ... < last. NUM_STAGES > 1 lets
    Triton's pipeliner copy the next groups' codes into shared memory (cp.async) while this one is
    computed; 1 loads each group when it is needed. ROW_ACC (when the tile's rows are spread over warps
    or threads, BLOCK_N < 128 num_warps) keeps one sum per row and reduces across them once, at the end,
    not once per group. qrow: the codes' row stride (N in the GPTQ layout)."""
    R: tl.constexpr = GROUP // 8
    r8 = tl.arange(0, R)
    if ROW_ACC:
        acc = tl.zeros((R // 2 if F16X2 else R, BLOCK_N), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    # The zero points and scales are loaded one group ahead, after the codes. Their layout (a column per
    # thread) is not the tile's, and the conversion through shared memory waits on their load: loaded
    # first in the same group, they held the codes' loads back by a round trip.
    zn, sn = _group_zeros_scales(qz_ptr, s_ptr, first, rn, nmask & (rn * 0 + first < last), N)
    for g in tl.range(first, last, step, num_stages=NUM_STAGES):
        z, s = zn, sn
        if F16X2:   # even and odd packed rows apart: one asm call takes one of each (16 weights)
            r16 = tl.arange(0, R // 2)                # needs GROUP >= 16 (int4_gemv checks)
            qa = tl.load(qw_ptr + (g * R + 2 * r16)[:, None] * qrow + rn[None, :], mask=nmask[None, :], other=0,
                         eviction_policy="evict_first")       # read once: keep x and the partials in L2
            qb = tl.load(qw_ptr + (g * R + 2 * r16 + 1)[:, None] * qrow + rn[None, :], mask=nmask[None, :],
                         other=0, eviction_policy="evict_first")
            zn, sn = _group_zeros_scales(qz_ptr, s_ptr, g + step, rn, nmask & (rn * 0 + g + step < last), N)
            part = _group_dot_f16x2(qa, qb, z, x_ptr, g, r16, GROUP)
        else:
            q = tl.load(qw_ptr + (g * R + r8)[:, None] * qrow + rn[None, :], mask=nmask[None, :], other=0,
                        eviction_policy="evict_first")
            zn, sn = _group_zeros_scales(qz_ptr, s_ptr, g + step, rn, nmask & (rn * 0 + g + step < last), N)
            part = _group_dot_f32(q, z, x_ptr, g, r8, GROUP)
        if ROW_ACC:
            acc += part * s[None, :]
        else:
            acc += tl.sum(part, axis=0) * s
    if ROW_ACC:
        out = tl.sum(acc, axis=0)
    else:
        out = acc
    return out


@triton.jit
def _gemv_exact(x_ptr, qw_ptr, qz_ptr, s_ptr, rn, nmask, N, ng, GROUP: tl.constexpr, BLOCK_N: tl.constexpr):
    """Slow, exact and light on registers: one weight at a time (the f16x2 path's fallback, which only
    runs when that path overflowed or its split-K state was misused). Nothing is unrolled: unrolled, this
    code, though never run, changed how ptxas allocated the whole kernel's registers and slowed its
    group loop (docs/kernels.md)."""
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for g in range(0, ng):
        zp = tl.load(qz_ptr + g * (N // 8) + rn // 8, mask=nmask, other=0)
        z = (((zp >> ((rn % 8) * 4)) & 0xF) + 1).to(tl.float32)
        part = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for k in range(0, GROUP):
            q = tl.load(qw_ptr + (g * (GROUP // 8) + k // 8) * N + rn, mask=nmask, other=0)
            xk = tl.load(x_ptr + g * GROUP + k).to(tl.float32)
            part += (((q >> (4 * (k % 8))) & 0xF).to(tl.float32) - z) * xk
        acc += part * tl.load(s_ptr + g * N + rn, mask=nmask, other=0.0).to(tl.float32)
    return acc


@triton.jit
def _gemv_ticket(lock_ptr, THREADS: tl.constexpr):
    """This program's arrival ticket for its column block's counter: the counter's low 16 bits count
    arrivals, the bits above count calls. Taken first, so that its round trip overlaps the group loop
    (a scalar tl.atomic_add would hand its result to every thread at once, and wait for it there).
    One relaxed atomic add by thread 0 of a tensor with one element per thread: a tile's own tensors may
    be replicated over warps (32 columns on 4 warps), and then every copy would take a ticket."""
    t = tl.arange(0, THREADS)
    return tl.atomic_add(lock_ptr + t * 0, tl.where(t == 0, 1, 0), mask=t == 0, sem="relaxed"), t == 0


@triton.jit
def _splitk_fixup_tagged(y, ticket, lane0, part_ptr, lock_ptr, pid_n, pid_k, mask, SPLIT_K: tl.constexpr,
                         POLL_ROWS: tl.constexpr, MAX_POLLS: tl.constexpr):
    """The default split-K fix-up: deterministic, with no fence and one round trip at the end. Each
    program publishes its partial with the lowest mantissa bit replaced by the call's parity (from the
    ticket: bit 16 counts calls) and leaves. The program with the last ticket (the last to start, so
    every other has started and none waits on it: no deadlock) reads the partials until every parity
    is this call's, and sums them with that bit cleared, POLL_ROWS at a time in a fixed order (the same
    bits every run). A partial loses its lowest bit, at most 1 ulp of fp32. The workspace and counters
    must belong to this tile and split alone, so that a slot is never more than one call stale
    (gemv_plan.gemv_state). A partial still missing after MAX_POLLS reads (a misuse, such as two streams sharing
    the state) is not waited for forever: late counts such words, and the kernel then computes the
    column block alone. Returns (y, last, late)."""
    old = tl.sum(tl.where(lane0, ticket, 0), axis=0)                 # thread 0's ticket, to every thread
    par = (old >> 16) & 1
    # the column block's SPLIT_K x BLOCK_N partials lie together, so every address below is one base
    # plus a constant (no 64-bit address per value: at 32 partials those took 56 more registers)
    BLOCK: tl.constexpr = y.shape[0]
    cols = tl.arange(0, BLOCK)
    words = part_ptr.to(tl.pointer_type(tl.int32)) + pid_n * (SPLIT_K * BLOCK)
    tl.atomic_xchg(words + pid_k * BLOCK + cols, (y.to(tl.int32, bitcast=True) & -2) | par, mask=mask, sem="relaxed")
    last = (old & 0xFFFF) == SPLIT_K - 1
    late = 0
    if last:
        y = tl.zeros(y.shape, dtype=tl.float32)
        for k0 in tl.static_range(0, SPLIT_K, POLL_ROWS):
            rk = k0 + tl.arange(0, POLL_ROWS)
            ptrs = words + rk[:, None] * BLOCK + cols[None, :]
            kmask = (rk < SPLIT_K)[:, None] & mask[None, :]
            v = tl.load(ptrs, mask=kmask, other=0, volatile=True)
            pending = tl.sum((((v & 1) != par) & kmask).to(tl.int32))     # over the whole tile
            polls = 0
            while (pending > 0) & (polls < MAX_POLLS):
                v = tl.load(ptrs, mask=kmask, other=0, volatile=True)
                pending = tl.sum((((v & 1) != par) & kmask).to(tl.int32))
                polls += 1
            late += pending
            y += tl.sum(tl.where(kmask, (v & -2).to(tl.float32, bitcast=True), 0.0), axis=0)
        tl.atomic_add(lock_ptr, (1 << 16) - SPLIT_K, sem="relaxed")     # arrivals to 0, one more call
    return y, last, late


@triton.jit
def int4_gemv_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, y_ptr, part_ptr, lock_ptr, K, N,
                      GROUP: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr,
                      F16X2: tl.constexpr, NUM_STAGES: tl.constexpr, ROW_ACC: tl.constexpr,
                      WS_OFF: tl.constexpr, LOCK_OFF: tl.constexpr, POLL_ROWS: tl.constexpr,
                      THREADS: tl.constexpr, SUM_KERNEL: tl.constexpr, PDL: tl.constexpr):
    """WS_OFF / LOCK_OFF: where this tile's own workspace and counters start in part_ptr / lock_ptr;
    THREADS: 32 x num_warps (gemv_plan.fixup_args). SUM_KERNEL (with SPLIT_K > 1): no fix-up here, the
    partials go to the workspace as [SPLIT_K, N] and gemv_sum_kernel adds them up; PDL lets it launch
    now, to wait on this grid resident beside it instead of after a launch gap."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    ng = K // GROUP
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    if SUM_KERNEL:                                  # (only with SPLIT_K > 1: gemv_plan)
        if PDL:
            gdc_launch_dependents()
    elif SPLIT_K > 1:
        ticket, lane0 = _gemv_ticket(lock_ptr + LOCK_OFF + pid_n, THREADS)
    y = _gemv_groups(x_ptr, qw_ptr, qz_ptr, s_ptr, rn, nmask, N, pid_k, ng, SPLIT_K, GROUP, BLOCK_N, F16X2,
                     NUM_STAGES, ROW_ACC, N)
    if SUM_KERNEL:
        tl.store((part_ptr + WS_OFF).to(tl.pointer_type(tl.float32)) + pid_k * N + rn, y, mask=nmask)
    else:
        last = True
        if SPLIT_K > 1:
            y, last, late = _splitk_fixup_tagged(y, ticket, lane0, part_ptr + WS_OFF, lock_ptr + LOCK_OFF + pid_n,
                                                 pid_n, pid_k, nmask, SPLIT_K, POLL_ROWS, 4096)
        else:
            late = 0
        if last:
            if F16X2:
                # fp16 sums overflow when |x| passes ~500 (8 x 16 x |x| > 65504 at worst): the sum is then
                # inf or NaN. Never hand that back: redo this column block with the exact fp32 dequant.
                late += tl.sum(((y - y) != 0).to(tl.int32), axis=0)         # inf - inf and NaN - NaN are NaN
            if late > 0:
                y = _gemv_exact(x_ptr, qw_ptr, qz_ptr, s_ptr, rn, nmask, N, ng, GROUP, BLOCK_N)
            tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=nmask)


@triton.jit
def gemv_sum_kernel(part_ptr, y_ptr, x_ptr, qw_ptr, qz_ptr, s_ptr, K, N, GROUP: tl.constexpr,
                     SPLIT_K: tl.constexpr, SPLIT_P2: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """The other split-K fix-up: a kernel of its own sums the GEMV kernel's partials [SPLIT_K, N] in a
    fixed order (the same bits every run; no counters, no tags) and redoes a column block exactly where
    fp16 overflowed. Launched with PDL it is resident before the GEMV ends and waits for it here
    (griddepcontrol.wait: the GEMV grid complete, its stores visible). The redo's code lives here, not
    in the GEMV kernel, where even never run it slowed the group loop (_gemv_exact)."""
    rn = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    nmask = rn < N
    if PDL:
        gdc_wait()
    rk = tl.arange(0, SPLIT_P2)
    v = tl.load(part_ptr + rk[:, None] * N + rn[None, :], mask=(rk < SPLIT_K)[:, None] & nmask[None, :],
                other=0.0, cache_modifier=".cg")        # from L2: an L1 may hold the last call's partials
    y = tl.sum(v, axis=0)
    if tl.sum(((y - y) != 0).to(tl.int32), axis=0) > 0:  # inf or NaN: fp16 overflowed (or x holds inf / NaN)
        y = _gemv_exact(x_ptr, qw_ptr, qz_ptr, s_ptr, rn, nmask, N, K // GROUP, GROUP, BLOCK)
    tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=nmask)


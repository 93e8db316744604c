"""Int4 GEMV rounds 20-21 (a bench, not a test): Gluon kernels, their layouts stated, on the H200.

Needs a Triton with Gluon (3.6, as on the lent H200). Round 18 (scripts/gemv_persistent_probe.py) found
the shipped GEMV issuing an instruction on 63 % of the schedulers' cycles (ncu), which made issue the
suspect. Of the 363 SASS instructions its loop spends per group, 238 are the dequant and the dot. The
rest are address math, the zeros' and scales' layout conversions through shared memory, and the wait on
each group's loads, which every warp issues and then waits for itself. Round 20: one producer warp
issues each group's codes as two TMA bulk copies (even and odd packed rows) into a ring of STAGES
shared-memory buffers, signalled by mbarriers, and the compute warps only read the ring, with a register
layout given once (Gluon's BlockedLayout: each thread 2 packed rows x 4 columns of each tile), so there
are no per-element addresses and no layout conversions. The math is the shipped kernel's inline PTX
(utils.kernels' _F16X2_DOT16, two packed int32 per call). Each CTA takes one column block and a
contiguous run of groups; the split-K fix-up is the shipped one (partials, a counter, the last CTA adds
them in order).

Answer (H200, gemv_gluon_probe.md in docs/device-runs/20261124-lab05-kernels-h200/): right at every
config (checked against the fp32 reference before timing), and slower: 17.3 / 17.2 us at best (256
columns, 8 compute warps, 2 CTAs per SM) against 12.6 / 13.2 us for the shipped kernel in the same run;
deeper rings lost. Compiled for sm_90 by Triton 3.6, its loop is 320 SASS instructions per tile of 16
packed int32 per thread against the shipped loop's 363: 12 % fewer, with 16 compute warps per SM where
the shipped kernel keeps 28 resident. Fewer warps hide less latency, and that costs more than the
instructions and the waits saved. The one-wave, one-warp-per-program grid stays.

Round 21 (the tensor-core kernel below, _mma_gemv_kernel) keeps the shipped grid and takes the math to
mma.sync, in a lane layout stated bit by bit. Answer (gemv_gluon_mma.md, .log): right at every config,
and its loop is 265 SASS instructions per group (Triton 3.6, sm_90) against 363, 27 % fewer. But it is
slower: 14.2 / 15.4 us at best (one warp, split 5 / 22, 76 registers) against 12.5 / 13.2 us in the same
run. So the shipped GEMV is not bound by issue alone; its 28 resident warps, each with one group's loads
in flight, are what a kernel has to match.

    python scripts/gemv_gluon_probe.py                 # GPU (sm_90): round 21's sweep; $OUT/gemv_gluon_probe.md
    python scripts/gemv_gluon_probe.py --part ws       # round 20's warp-specialized sweep
    python scripts/gemv_gluon_probe.py --quick         # GPU: one config per shape
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma  # noqa: E402
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

from utils import kernels  # noqa: E402
import gemv_probe as gp  # noqa: E402
import gemv_tma_probe as tp  # noqa: E402


@gluon.jit
def _xpairs(x32, row):
    """fp16x2 (x[8 row + j], x[8 row + j + 4]) for j = 0..3 (utils.kernels._xpairs, in any layout)."""
    return gl.inline_asm_elementwise(kernels._XPAIRS_V4, "=r,=r,=r,=r,l", [(x32 + row * 4).to(gl.int64, bitcast=True)],
                                     dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True, pack=1)


@gluon.jit
def _group_terms(x32, qz_ptr, s_ptr, g, rows, cols, N, GROUP: gl.constexpr):
    """What group g's f16x2 dot needs besides its codes, per column cols and packed-row pair rows: the
    zero points as fp16x2 1024 + z and -(64 + z), the fp32 scales, and the x pairs of the even (a) and
    odd (b) packed rows (utils.kernels._group_dot_f16x2's operands). Loaded before the codes are waited for."""
    zp = gl.load(qz_ptr + g * (N // 8) + cols // 8)
    z = ((zp >> ((cols % 8) * 4)) & 0xF) + 1
    zz = ((0x6400 + z) << 16) | (0x6400 + z)
    nz = 0xD400 + (z << 4)
    nzz = (nz << 16) | nz
    s = gl.load(s_ptr + g * N + cols).to(gl.float32)
    xg = x32 + g * (GROUP // 2)
    a0, a1, a2, a3 = _xpairs(xg, 2 * rows)
    b0, b1, b2, b3 = _xpairs(xg, 2 * rows + 1)
    return zz, nzz, s, a0, a1, a2, a3, b0, b1, b2, b3


@gluon.jit
def _scaled_dot(qa, qb, terms):
    """fp32 [rows, columns]: the shipped f16x2 PTX over even (qa) and odd (qb) packed rows, times the scale."""
    zz, nzz, s, a0, a1, a2, a3, b0, b1, b2, b3 = terms
    part = gl.inline_asm_elementwise(
        kernels._F16X2_DOT16, "=r,r,r,r,r,r,r,r,r,r,r,r,r",
        [qa, qb, gl.expand_dims(zz, 0), gl.expand_dims(nzz, 0),
         gl.expand_dims(a0, 1), gl.expand_dims(a1, 1), gl.expand_dims(a2, 1), gl.expand_dims(a3, 1),
         gl.expand_dims(b0, 1), gl.expand_dims(b1, 1), gl.expand_dims(b2, 1), gl.expand_dims(b3, 1)],
        dtype=gl.int32, is_pure=True, pack=1).to(gl.float32, bitcast=True)
    return part * gl.expand_dims(s, 0)


@gluon.jit
def _store_splitk(y, part_ptr, lock_ptr, y_ptr, pid_n, pid_k, cols, N, SPLIT_K: gl.constexpr):
    """Store this CTA's sums y of columns cols, through gemv_probe.splitk_fixup's fix-up (here in Gluon):
    partials to part_ptr, a counter, and the last CTA of the column block adds them in order."""
    if SPLIT_K > 1:
        gl.store(part_ptr + pid_k * N + cols, y)
        gl.thread_barrier()
        arrived = gl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            total = gl.zeros_like(y)
            for k in gl.static_range(SPLIT_K):
                total += gl.load(part_ptr + k * N + cols, cache_modifier=".cg")
            gl.atomic_xchg(lock_ptr + pid_n, 0)
            gl.store(y_ptr + cols, total.to(y_ptr.dtype.element_ty))
    else:
        gl.store(y_ptr + cols, y.to(y_ptr.dtype.element_ty))


@gluon.jit
def _load_partition(qa_desc, qb_desc, ready, empty, qa_bufs, qb_bufs, n0, g0, g1, STAGES: gl.constexpr):
    """The producer warp: group g's even and odd packed rows of this column block, STAGES groups ahead."""
    R2: gl.constexpr = qa_desc.block_type.shape[0]
    for i in range(g1 - g0):
        idx = i % STAGES
        mbarrier.wait(empty.index(idx), ((i // STAGES) & 1) ^ 1)     # the compute warps freed this buffer
        mbarrier.expect(ready.index(idx), qa_desc.block_type.nbytes + qb_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(qa_desc, [(g0 + i) * R2, n0], ready.index(idx), qa_bufs.index(idx))
        tma.async_copy_global_to_shared(qb_desc, [(g0 + i) * R2, n0], ready.index(idx), qb_bufs.index(idx))


@gluon.jit
def _compute_partition(x_ptr, qz_ptr, s_ptr, ready, empty, qa_bufs, qb_bufs, n0, g0, g1, N,
                       GROUP: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, L: gl.constexpr):
    R2: gl.constexpr = GROUP // 16
    rows = gl.arange(0, R2, layout=gl.SliceLayout(1, L))
    cols = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, L))
    x32 = x_ptr.to(gl.pointer_type(gl.int32))
    acc = gl.zeros([R2, BLOCK_N], gl.float32, L)
    for i in range(g1 - g0):
        g = g0 + i
        terms = _group_terms(x32, qz_ptr, s_ptr, g, rows, cols, N, GROUP)
        idx = i % STAGES
        mbarrier.wait(ready.index(idx), (i // STAGES) & 1)
        qa = qa_bufs.index(idx).load(L)
        qb = qb_bufs.index(idx).load(L)
        fence_async_shared()
        mbarrier.arrive(empty.index(idx), count=1)
        acc += _scaled_dot(qa, qb, terms)
    return (gl.sum(acc, axis=0),)                # the default partition's results are a tuple


@gluon.jit
def _ws_gemv_kernel(x_ptr, qa_desc, qb_desc, qz_ptr, s_ptr, y_ptr, part_ptr, lock_ptr, K, N,
                    GROUP: gl.constexpr, BLOCK_N: gl.constexpr, SPLIT_K: gl.constexpr, STAGES: gl.constexpr,
                    num_warps: gl.constexpr):
    L: gl.constexpr = gl.BlockedLayout([GROUP // 64, 4], [4, 8], [1, num_warps], [1, 0])
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    ng = K // GROUP
    g0 = pid_k * ng // SPLIT_K
    g1 = (pid_k + 1) * ng // SPLIT_K
    n0 = pid_n * BLOCK_N
    qa_bufs = gl.allocate_shared_memory(gl.int32, [STAGES] + qa_desc.block_type.shape, qa_desc.layout)
    qb_bufs = gl.allocate_shared_memory(gl.int32, [STAGES] + qb_desc.block_type.shape, qb_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    (y,) = gl.warp_specialize([
        (_compute_partition, (x_ptr, qz_ptr, s_ptr, ready, empty, qa_bufs, qb_bufs, n0, g0, g1, N, GROUP, BLOCK_N,
                              STAGES, L)),
        (_load_partition, (qa_desc, qb_desc, ready, empty, qa_bufs, qb_bufs, n0, g0, g1, STAGES)),
    ], [1], [24])
    cols = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, L))
    _store_splitk(y, part_ptr, lock_ptr, y_ptr, pid_n, pid_k, cols, N, SPLIT_K)


# Round 21: the tensor cores, at the shipped grid (one warp per program, 32 columns, one wave). Each lane
# holds 4 packed rows (t, t+4, t+8, t+12; t = lane % 4) x 4 consecutive columns (4 (lane // 4) + 0..3):
# a layout stated bit by bit, so the mma.sync fragments below are right by construction, not by luck
# (round 9's Triton probe assumed the lane order and was wrong at one tile). One packed row x 4 columns
# is one asm call (pack=4): nibbles (0, 4) and (2, 6) become fp16 1024 + n by one lop3 each, (1, 5) and
# (3, 7) 1024 + 16 n (the x they meet is pre-divided by 16), and the products and sums over 32 k run
# on mma.sync m16n8k16 with fp32 accumulation. The M rows are the lane's columns (2 blocks of 16), the
# K order is the lanes' packed rows (any order works when B is x in the same order), and B is x in all
# 8 columns, so every D column holds the same sums. Per group: y += s (D - 1024 S_even - 64 S_odd
# - z (S_even + S_odd)), S the group's sums of x as the mma saw them.
def _mma_gemv_asm() -> str:
    lines = ["{", ".reg .b32 q8, a<4>, c<4>, bx1, bx3, r16;", ".reg .f32 d<4>, e<4>;", "mov.b32 r16, 0x2C002C00;",
             "mul.rn.f16x2 bx1, $12, r16;",                # (x1, x5) / 16
             "mul.rn.f16x2 bx3, $20, r16;"]                # (x3, x7) / 16
    for blk, (q0, q1) in enumerate((("$4", "$5"), ("$6", "$7"))):
        d = "d" if blk == 0 else "e"
        lines += [f"lop3.b32 a0, {q0}, 0x000F000F, 0x64006400, 0xEA;",
                  f"lop3.b32 a1, {q1}, 0x000F000F, 0x64006400, 0xEA;",
                  f"lop3.b32 a2, {q0}, 0x00F000F0, 0x64006400, 0xEA;",
                  f"lop3.b32 a3, {q1}, 0x00F000F0, 0x64006400, 0xEA;",
                  "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                  f"{{{d}0, {d}1, {d}2, {d}3}}, {{a0, a1, a2, a3}}, {{$8, bx1}}, "
                  "{0f00000000, 0f00000000, 0f00000000, 0f00000000};",
                  f"shr.u32 q8, {q0}, 8;", "lop3.b32 c0, q8, 0x000F000F, 0x64006400, 0xEA;",
                  "lop3.b32 c2, q8, 0x00F000F0, 0x64006400, 0xEA;",
                  f"shr.u32 q8, {q1}, 8;", "lop3.b32 c1, q8, 0x000F000F, 0x64006400, 0xEA;",
                  "lop3.b32 c3, q8, 0x00F000F0, 0x64006400, 0xEA;",
                  "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                  f"{{{d}0, {d}1, {d}2, {d}3}}, {{c0, c1, c2, c3}}, {{$16, bx3}}, {{{d}0, {d}1, {d}2, {d}3}};"]
    lines += ["mov.b32 $0, d0;", "mov.b32 $1, d2;", "mov.b32 $2, e0;", "mov.b32 $3, e2;", "}"]
    return "\n".join(lines)


_MMA_GEMV = gl.constexpr(_mma_gemv_asm())
# 4 outputs (the pack's 4 columns), 4 codes ($4-$7), then the 4 x-pair tensors, 4 operands each (the
# pack's copies of one row's pair): (x0, x4) $8, (x1, x5) $12, (x2, x6) $16, (x3, x7) $20
_MMA_GEMV_ARGS = gl.constexpr(",".join(["=r"] * 4 + ["r"] * 4 + ["r"] * 16))


def _mma_layout(num_warps: int):
    """[16 packed rows, 32 num_warps columns]: registers 4 columns x rows t + 4 m, lanes t and column quads."""
    warps = [[0, 32 << i] for i in range(num_warps.bit_length() - 1)]
    return gl.DistributedLinearLayout(reg_bases=[[0, 1], [0, 2], [4, 0], [8, 0]],
                                      lane_bases=[[1, 0], [2, 0], [0, 4], [0, 8], [0, 16]],
                                      warp_bases=warps, block_bases=[], shape=[16, 32 * num_warps])


@gluon.jit
def _mma_gemv_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, y_ptr, part_ptr, lock_ptr, K, N,
                     BLOCK_N: gl.constexpr, SPLIT_K: gl.constexpr, L: gl.constexpr, X1: gl.constexpr):
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    ng = K // 128
    rows = gl.arange(0, 16, layout=gl.SliceLayout(1, L))
    cols = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, L))
    kk = gl.arange(0, 128, layout=X1)
    odd = (kk % 2) == 1
    x32 = x_ptr.to(gl.pointer_type(gl.int32))
    y = gl.zeros([BLOCK_N], gl.float32, gl.SliceLayout(0, L))
    q_ptrs = qw_ptr + gl.expand_dims(rows, 1) * N + gl.expand_dims(cols, 0)    # group 0's tile; + g 16 N
    for g in range(pid_k, ng, SPLIT_K):
        q = gl.load(q_ptrs + g * 16 * N, eviction_policy="evict_first")
        p0, p1, p2, p3 = _xpairs(x32 + g * 64, rows)
        d = gl.inline_asm_elementwise(
            _MMA_GEMV, _MMA_GEMV_ARGS,
            [q, gl.expand_dims(p0, 1), gl.expand_dims(p1, 1), gl.expand_dims(p2, 1), gl.expand_dims(p3, 1)],
            dtype=gl.float32, is_pure=True, pack=4)
        dsum = gl.sum(d, axis=0) * 0.25           # the 4 lanes of a quad hold the same sums
        xg = gl.load(x_ptr + g * 128 + kk).to(gl.float32)
        s_even = gl.sum(gl.where(odd, 0.0, xg), axis=0)
        s_odd = gl.sum(gl.where(odd, (xg * 0.0625).to(gl.float16).to(gl.float32) * 16.0, 0.0), axis=0)
        zp = gl.load(qz_ptr + g * (N // 8) + cols // 8)
        z = (((zp >> ((cols % 8) * 4)) & 0xF) + 1).to(gl.float32)
        sc = gl.load(s_ptr + g * N + cols).to(gl.float32)
        y += sc * (dsum - (1024.0 * s_even + 64.0 * s_odd) - z * (s_even + s_odd))
    _store_splitk(y, part_ptr, lock_ptr, y_ptr, pid_n, pid_k, cols, N, SPLIT_K)


def mma_gemv(x, qw, qz, s, num_warps=1, split_k=6, group_size=128):
    """y [1, N] from round 21's tensor-core kernel (fp16 x, sm_80+, group 128, N % (32 num_warps) == 0)."""
    K, N = qw.shape[0] * 8, qw.shape[1]
    block_n = 32 * num_warps
    assert x.dtype == torch.float16 and x.data_ptr() % 16 == 0 and N % block_n == 0 and group_size == 128
    y = torch.empty((N,), device=x.device, dtype=x.dtype)
    locks = gp.fixup_locks(x.device, N // block_n)
    work = torch.empty((split_k, N), device=x.device, dtype=torch.float32)
    ck = _mma_gemv_kernel[(N // block_n, split_k)](x, qw, qz, s, y, work, locks, K, N, BLOCK_N=block_n,
                                                   SPLIT_K=split_k, L=_mma_layout(num_warps),
                                                   X1=gl.BlockedLayout([4], [32], [num_warps], [0]),
                                                   num_warps=num_warps)
    _REGS[(num_warps, split_k)] = getattr(ck, "n_regs", None)
    return y.reshape(1, N)


_REGS: dict = {}


def _nvmma_descriptor(base, shape, strides, box):
    """A Gluon host descriptor with the unswizzled shared layout the compute warps read (round 20)."""
    return TensorDescriptor(base, shape, strides, box, gl.NVMMASharedLayout(swizzle_byte_width=0,
                                                                            element_bitwidth=32, rank=2))


def ws_gemv(x, qw, qz, s, block_n=256, num_warps=8, split_k=3, stages=4, maxnreg=80, group_size=128):
    """y [1, N] from the warp-specialized kernel at a fixed config (fp16 x, sm_90, N % block_n == 0)."""
    K, N = qw.shape[0] * 8, qw.shape[1]
    assert x.dtype == torch.float16 and x.data_ptr() % 16 == 0 and N % block_n == 0 and block_n == 32 * num_warps
    qa, qb = tp.row_pair_descriptors(qw, block_n, group_size, make=_nvmma_descriptor)
    y = torch.empty((N,), device=x.device, dtype=x.dtype)
    locks = gp.fixup_locks(x.device, N // block_n)
    work = torch.empty((split_k, N), device=x.device, dtype=torch.float32)
    _ws_gemv_kernel[(N // block_n, split_k)](x, qa, qb, qz, s, y, work, locks, K, N, GROUP=group_size,
                                             BLOCK_N=block_n, SPLIT_K=split_k, STAGES=stages, num_warps=num_warps,
                                             maxnreg=maxnreg)
    return y.reshape(1, N)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--part", choices=("ws", "mma"), default="mma",
                    help="ws: round 20's warp-specialized kernel; mma: round 21's tensor-core kernel")
    args = ap.parse_args()
    out = Path(os.environ.get("OUT", "/tmp"))
    device = "cuda"
    copy = gp.gpu_copy_gbps()
    rows = []
    for K, N in ((3584, 18944), (18944, 3584)):
        ops, wd, qbytes, t_bf = gp.shape_case(K, N, device)
        t = gp.time_ops(lambda *o: kernels.int4_gemv(*o, 128), ops)
        rows.append((K, N, "shipped int4_gemv (default)", t, qbytes, t_bf))
        print(f"{K}->{N}: bf16 {t_bf * 1e6:.1f} us, shipped {t * 1e6:.1f} us", flush=True)
        ng = K // 128
        if args.part == "mma":
            splits = {28: (4, 5, 6, 7, 8), 148: (22, 25, 30, 37, 42)}[ng]
            for nw in (1,) if args.quick else (1, 2):
                for sk in splits[2:3] if args.quick else splits:
                    cfg = dict(num_warps=nw, split_k=max(1, sk // nw))
                    what = "gluon mma " + " ".join(f"{k}={v}" for k, v in cfg.items())
                    n = len(rows)
                    gp.time_variant(lambda *o, c=cfg: mma_gemv(*o, **c), what, cfg, K, N, ops, wd, qbytes, t_bf, rows,
                                    device, None)
                    if len(rows) > n:
                        rows[-1] = (*rows[-1][:2], f"{what} (regs {_REGS.get((nw, cfg['split_k']))})", *rows[-1][3:])
            continue
        if args.quick:
            configs = [dict(block_n=256, num_warps=8, split_k=max(1, 264 // (N // 256)), stages=4, maxnreg=80)]
        else:
            configs = [dict(block_n=bn, num_warps=bn // 32, split_k=sk, stages=st, maxnreg=mr)
                       for bn, mr in ((256, 80), (128, 96), (128, 128))
                       for sk in sorted({max(1, min(ng, round(c * 132 / (N // bn)))) for c in (1, 2, 3, 4)})
                       for st in (3, 4, 6)]
        best = None
        for cfg in configs:
            what = "gluon ws " + " ".join(f"{k}={v}" for k, v in cfg.items())
            best = gp.time_variant(lambda *o, c=cfg: ws_gemv(*o, **c), what, cfg, K, N, ops, wd, qbytes, t_bf, rows,
                                   device, best)
        tp._DESCS.clear()
    print("\n".join(gp.write_table(rows, copy, out / "gemv_gluon_probe.md")))


if __name__ == "__main__":
    main()

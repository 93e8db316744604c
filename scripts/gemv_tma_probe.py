"""Int4 GEMV round 11 (a bench, not a test): codes through TMA, deeper in flight, and the read floor.

Rounds 1-10 (scripts/gemv_probe.py) left the shipped GEMV at 14.1 us cold on the H200 where 70 % of the
copy bandwidth needs 12.0 us. Its programs are short (2-4 groups each, all in one wave): every program
loads a group, computes it, loads the next, so loads and math alternate in lock-step across the GPU,
and cp.async stages (Triton's pipeliner) cost the shared memory that residency needs. Two questions:

1. The floor: how long does merely READING the same bytes take, cold, with a streaming kernel that
   does nothing else (utils.kernels.stream_read, and torch's own reduction over them)? That is the
   most a GEMV can hope for. (Round 11's 64 KB rows ran with 8 warps; stream_read launches 4.)
2. TMA: the codes of a group come as two bulk tensor copies (even and odd packed rows, as the f16x2
   dot wants them) issued by the copy engine, NUM_STAGES groups ahead, with no registers or address
   math per byte in flight. Does that keep DRAM busy while the math runs?

Answers on the H200 (docs/device-runs/20261123-lab05-kernels-h200/gemv_probe_round11_*.md): the read
floor is 9.0 us (88-90 % of copy); the shipped access pattern without the math 11.3 us at best and
12.2-13.2 us for most tiles, so most of the gap is there before any math; TMA lost (14.8 / 15.3 us at
best against 14.0 us for the shipped kernel's 128-column tile in the same run); so did an L2 prefetch of
a program's groups (13.1 -> 16.4 us), and loading the next group before this one's math did nothing
(13.3 -> 13.6 us, 13.4 -> 13.4 us); both were removed from utils.kernels after; codes repacked per
column block (--part tiled) 13.1 / 13.3 us, no better than the GPTQ layout.

    python scripts/gemv_tma_probe.py              # GPU (sm_90): the table, $OUT/gemv_tma_probe.md
    python scripts/gemv_tma_probe.py --quick      # one config per shape, to check it compiles and is right
    python scripts/gemv_tma_probe.py --part pattern   # the read floor and the access pattern without the math
    python scripts/gemv_tma_probe.py --part tiled     # the shipped loop over codes repacked per column block
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from utils import kernels  # noqa: E402
import gemv_probe as gp  # noqa: E402


@triton.jit
def _tma_gemv_kernel(x_ptr, qa_desc, qb_desc, qz_ptr, s_ptr, y_ptr, part_ptr, lock_ptr, K, N,
                     GROUP: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr,
                     NUM_STAGES: tl.constexpr, ROW_ACC: tl.constexpr):
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    R2: tl.constexpr = GROUP // 16                # even (and odd) packed rows per group
    n0 = pid_n * BLOCK_N
    rn = n0 + tl.arange(0, BLOCK_N)
    nmask = rn < N
    r16 = tl.arange(0, R2)
    if ROW_ACC:
        acc = tl.zeros((R2, BLOCK_N), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for g in tl.range(pid_k, K // GROUP, SPLIT_K, num_stages=NUM_STAGES):
        qa = qa_desc.load([g * R2, n0])           # packed rows 2 r16 of group g: one bulk copy
        qb = qb_desc.load([g * R2, n0])           # packed rows 2 r16 + 1
        z, s = kernels._group_zeros_scales(qz_ptr, s_ptr, g, rn, nmask, N)
        part = kernels._group_dot_f16x2(qa, qb, z, x_ptr, g, r16, GROUP)
        if ROW_ACC:
            acc += part * s[None, :]
        else:
            acc += tl.sum(part, axis=0) * s
    if ROW_ACC:
        y = tl.sum(acc, axis=0)
    else:
        y = acc
    last = True
    if SPLIT_K > 1:
        y, last = gp.splitk_fixup(y, part_ptr, lock_ptr, pid_n, pid_k, rn, nmask, N, SPLIT_K, BLOCK_N)
    if last:
        tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=nmask)


@triton.jit
def _pattern_kernel(qw_ptr, qz_ptr, s_ptr, y_ptr, part_ptr, lock_ptr, K, N, GROUP: tl.constexpr,
                    BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, EVICT: tl.constexpr):
    """The shipped GEMV's grid, loads and split-K fix-up with the dot replaced by an xor: what its access
    pattern alone costs (the GEMV minus this is the math that did not overlap the loads)."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    R2: tl.constexpr = GROUP // 16
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    r16 = tl.arange(0, R2)
    acc = tl.zeros((R2, BLOCK_N), dtype=tl.int32)
    for g in tl.range(pid_k, K // GROUP, SPLIT_K, num_stages=1):
        zp = tl.load(qz_ptr + g * (N // 8) + rn // 8, mask=nmask, other=0)
        s = tl.load(s_ptr + g * N + rn, mask=nmask, other=0.0).to(tl.int16, bitcast=True).to(tl.int32)
        qa = tl.load(qw_ptr + (g * 2 * R2 + 2 * r16)[:, None] * N + rn[None, :], mask=nmask[None, :], other=0,
                     eviction_policy=EVICT)
        qb = tl.load(qw_ptr + (g * 2 * R2 + 2 * r16 + 1)[:, None] * N + rn[None, :], mask=nmask[None, :],
                     other=0, eviction_policy=EVICT)
        acc ^= qa ^ qb ^ (zp + s)[None, :]
    y = tl.xor_sum(acc, axis=0).to(tl.float32)
    last = True
    if SPLIT_K > 1:
        y, last = gp.splitk_fixup(y, part_ptr, lock_ptr, pid_n, pid_k, rn, nmask, N, SPLIT_K, BLOCK_N)
    if last:
        tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=nmask)


def pattern(x, qw, qz, s, block_n=128, split_k=7, num_warps=2, evict="evict_first"):
    K, N = qw.shape[0] * 8, qw.shape[1]
    y = torch.empty((N,), device=x.device, dtype=x.dtype)
    locks = gp.fixup_locks(x.device, triton.cdiv(N, block_n))
    work = torch.empty((split_k, N), device=x.device, dtype=torch.float32)
    _pattern_kernel[(triton.cdiv(N, block_n), split_k)](qw, qz, s, y, work, locks, K, N, GROUP=128,
                                                        BLOCK_N=block_n, SPLIT_K=split_k, EVICT=evict,
                                                        num_warps=num_warps, num_stages=1)
    return y


@triton.jit
def _tiled_gemv_kernel(x_ptr, qt_ptr, qz_ptr, s_ptr, y_ptr, part_ptr, lock_ptr, K, N,
                       GROUP: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, ROW_ACC: tl.constexpr,
                       F16X2: tl.constexpr):
    """The shipped GEMV (same dot, loop and fix-up) over codes repacked as [N / BLOCK_N, K / 8, BLOCK_N]:
    a column block's packed rows are one contiguous run, as Marlin-style kernels repack at load time."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    qbase = qt_ptr + pid_n * (K // 8) * BLOCK_N - pid_n * BLOCK_N      # + rn inside: the tile's column
    y = kernels._gemv_groups(x_ptr, qbase, qz_ptr, s_ptr, rn, nmask, N, pid_k, K // GROUP, SPLIT_K, GROUP,
                             BLOCK_N, F16X2, 1, ROW_ACC, BLOCK_N)
    last = True
    if SPLIT_K > 1:
        y, last = gp.splitk_fixup(y, part_ptr, lock_ptr, pid_n, pid_k, rn, nmask, N, SPLIT_K, BLOCK_N)
    if last:
        tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=nmask)


def tile_codes(qw, block_n):
    """[K/8, N] GPTQ codes -> [N / block_n, K/8, block_n]: the same int32 words, a column block contiguous."""
    K8, N = qw.shape
    assert N % block_n == 0
    return qw.reshape(K8, N // block_n, block_n).permute(1, 0, 2).contiguous()


def tiled_gemv(x, qt, qz, s, block_n=64, split_k=7, num_warps=1):
    nb, K8, bn = qt.shape
    K, N = K8 * 8, nb * bn
    assert bn == block_n
    y = torch.empty((N,), device=x.device, dtype=x.dtype)
    locks = gp.fixup_locks(x.device, nb)
    work = torch.empty((split_k, N), device=x.device, dtype=torch.float32)
    _tiled_gemv_kernel[(nb, split_k)](x, qt, qz, s, y, work, locks, K, N, GROUP=128, BLOCK_N=block_n,
                                      SPLIT_K=split_k, ROW_ACC=kernels._gemv_row_acc(block_n, num_warps),
                                      F16X2=kernels.int4_gemv_dequant(x) == "f16x2", num_warps=num_warps,
                                      num_stages=1)
    return y.reshape(1, N)


_DESCS: dict = {}


def row_pair_descriptors(qw, block_n: int, group_size: int = 128, make=TensorDescriptor):
    """TMA descriptors of GPTQ codes qw [K/8, N] as even and odd packed rows ([K/16, N] views with row
    stride 2N), one box per group and column block, as the f16x2 dot takes them. make(base, shape,
    strides, box) builds one (Triton's TensorDescriptor, or a Gluon one with its layout). Cached per codes
    tensor, box and maker, because the probes time CUDA-graph replays of the same few operand copies;
    the probes clear _DESCS between shapes."""
    K8, N = qw.shape
    key = (qw.data_ptr(), tuple(qw.shape), block_n, group_size, make)
    if key not in _DESCS:
        box = [group_size // 16, block_n]
        _DESCS[key] = (make(qw, [K8 // 2, N], [2 * N, 1], box), make(qw[1:], [K8 // 2, N], [2 * N, 1], box))
    return _DESCS[key]


def tma_gemv(x, qw, qz, s, block_n=128, split_k=7, num_warps=1, num_stages=3, row_acc=False, group_size=128):
    """Round 11's GEMV at a fixed tile: fp16 x, sm_90, the shipped kernel's dot and fix-up."""
    K, N = qw.shape[0] * 8, qw.shape[1]
    assert x.dtype == torch.float16 and x.data_ptr() % 16 == 0 and N % 4 == 0 and K % 16 == 0
    qa, qb = row_pair_descriptors(qw, block_n, group_size)
    y = torch.empty((N,), device=x.device, dtype=x.dtype)
    locks = gp.fixup_locks(x.device, triton.cdiv(N, block_n))
    work = torch.empty((split_k, N), device=x.device, dtype=torch.float32)
    _tma_gemv_kernel[(triton.cdiv(N, block_n), split_k)](
        x, qa, qb, qz, s, y, work, locks, K, N, GROUP=group_size, BLOCK_N=block_n, SPLIT_K=split_k,
        NUM_STAGES=num_stages, ROW_ACC=row_acc, num_warps=num_warps, num_stages=1)
    return y.reshape(1, N)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--part", choices=("tma", "pattern", "tiled"), default="tma",
                    help="tma: the TMA kernel's sweep; pattern: the shipped access pattern without the math, "
                    "tiled: the shipped loop over codes repacked per column block")
    args = ap.parse_args()
    from utils import roofline
    out = Path(os.environ.get("OUT", "/tmp"))
    device = "cuda"
    copy = gp.gpu_copy_gbps()
    rows = []
    shapes = ((3584, 18944), (18944, 3584))
    for K, N in shapes:
        ops, wd, qbytes, t_bf = gp.shape_case(K, N, device)
        x, qw, qz, s = ops
        t_bf_floor = roofline.time_cold(kernels.stream_read, (wd.t().contiguous().to(torch.bfloat16),), device)
        print(f"{K}->{N}: bf16 F.linear {t_bf * 1e6:.1f} us; reading its 2-byte weights alone "
              f"{t_bf_floor * 1e6:.1f} us", flush=True)
        for what, fn in [("read floor: Triton stream of the codes, 16 KB per program", kernels.stream_read),
                         ("read floor: Triton stream of the codes, 64 KB per program",
                          lambda q: kernels.stream_read(q, block=16384)),
                         ("read floor: torch.sum of the codes", lambda q: q.sum())]:
            t = roofline.time_cold(fn, (qw,), device)
            rows.append((K, N, what, t, qw.numel() * 4, t_bf))
            print(f"  {what}: {t * 1e6:.1f} us", flush=True)
        best = None
        for name, fn, cfg in [("shipped int4_gemv (default)", lambda *o: kernels.int4_gemv(*o, 128), {}),
                              ("shipped bn=128 w=2 sk=%d stages=1" % (7 if K == 3584 else 37),
                               lambda *o: kernels.int4_gemv(*o, 128, block_n=128, num_warps=2,
                                                            split_k=7 if K == 3584 else 37, num_stages=1), {})]:
            t = gp.time_ops(fn, ops)
            rows.append((K, N, name, t, qbytes, t_bf))
            print(f"  {name}: {t * 1e6:.1f} us", flush=True)
        ng = K // 128
        if args.part == "pattern":
            for bn, nw in [(128, 1), (128, 2), (128, 4), (64, 1), (64, 2), (256, 2), (256, 4), (128, 8)]:
                for sk in sorted({triton.cdiv(ng, gpp) for gpp in (1, 2, 4)}):
                    for ev in ("evict_first", ""):
                        what = f"pattern only ({ev or 'no hint'}) bn={bn} w={nw} sk={sk}"
                        t = gp.time_ops(lambda *o, c=(bn, sk, nw, ev): pattern(*o, *c), ops)
                        rows.append((K, N, what, t, qbytes, t_bf))
                        print(f"  {what}: {t * 1e6:.1f} us", flush=True)
            continue
        if args.part == "tiled":
            for bn, nw in [(64, 1), (64, 2), (128, 1), (128, 2), (256, 2), (256, 4)]:
                qt = tile_codes(qw, bn)
                tops = (x, qt, qz, s)
                for sk in sorted({triton.cdiv(ng, gpp) for gpp in (1, 2, 4, 7)}):
                    cfg = dict(block_n=bn, num_warps=nw, split_k=sk)
                    fn = lambda x_, q_, z_, s_, c=cfg: tiled_gemv(x_, q_, z_, s_, **c)  # noqa: E731
                    try:
                        gp.check(lambda x_, *_, f=fn, q_=qt: f(x_, q_, qz, s), qw, qz, s, wd, K, device, "tiled")
                        t = gp.time_ops(fn, tops)
                    except Exception as exc:  # noqa: BLE001
                        print(f"  tiled {cfg}: FAILED {exc}", flush=True)
                        continue
                    what = f"tiled codes bn={bn} w={nw} sk={sk}"
                    rows.append((K, N, what, t, qbytes, t_bf))
                    print(f"  {what}: {t * 1e6:.1f} us", flush=True)
            continue
        layouts = [(128, 1)] if args.quick else [(64, 1), (128, 1), (128, 2), (128, 4), (256, 2), (256, 4)]
        gpps = (4,) if args.quick else (2, 4, 7, 14)
        stages = (3,) if args.quick else (2, 3, 4)
        for bn, nw in layouts:
            for sk in sorted({triton.cdiv(ng, gpp) for gpp in gpps}):
                for ns in stages:
                    for ra in ((False,) if bn >= 128 * nw else (True,)):
                        cfg = dict(block_n=bn, num_warps=nw, split_k=sk, num_stages=ns, row_acc=ra)
                        what = f"tma bn={bn} w={nw} sk={sk} stages={ns}"
                        best = gp.time_variant(lambda *o, c=cfg: tma_gemv(*o, **c), what, cfg, K, N, ops, wd,
                                               qbytes, t_bf, rows, device, best)
        _DESCS.clear()
    print("\n".join(gp.write_table(rows, copy, out / "gemv_tma_probe.md")))


if __name__ == "__main__":
    main()

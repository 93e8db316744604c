"""Int4 GEMV round 18 (a bench, not a test): a persistent, stream-K GEMV whose loads run ahead of its math.

Rounds 1-17 (scripts/gemv_probe.py, scripts/gemv_tma_probe.py) kept the GEMV's grid: one short program
per (column block, K split), all in one wave, each loading a group, computing it, loading the next. The
read floor is 9.0 us on the H200; the shipped kernel 12.5-13.6 us; prefetching in registers or cp.async
stages did not help there, because a program of 4-5 groups has no steady state to pipeline and every
stage of shared memory costs residency. This kernel asks the other way round:

- a few long programs (PROGS_PER_SM per SM), each owning one contiguous run of the (column block, group)
  tiles, column block major (stream-K: every program gets the same number of tiles, +-1, whatever the
  shape, so no split-K leaves a ragged last group);
- one loop over that run, software-pipelined NUM_STAGES deep (Triton's pipeliner: cp.async copies of the
  codes, zeros and scales, or with TMA bulk tensor copies, into a shared-memory ring), so DRAM sees
  NUM_STAGES - 1 tiles in flight per program at all times, math or not;
- when a column block ends (or the run does), its sum over the groups this program saw is flushed: stored
  if this program saw them all, otherwise written as a partial, and the last of the column block's
  programs to arrive adds the partials in program order (deterministic, as the shipped fix-up).

Answer (H200, docs/device-runs/20261124-lab05-kernels-h200/): no. Best 18.1 / 18.4 us (256 columns,
4 warps, 3 programs per SM, 3 stages) against 13.2 / 13.3 us for the shipped GEMV in the same run; the
TMA form 19.8 us at best; deeper stages lost. A first version that ran the fix-up (a barrier and an
atomic) inside the loop was not pipelined at all (stages 3, 4, 6 all the same; compiled here for sm_90
it had no async copies), so the fix-up now runs after the loop, once per cut column block. ncu
(ncu_persistent.txt, --ncu below, at ncu's locked 1.47 GHz) says why: the shipped GEMV issues an
instruction on 63 % of scheduler cycles with 22.6 warps per SM resident; this one has 125 registers,
11.3 warps per SM, and issues on 53 %. Loads further ahead do not help when they cost resident warps.
The shipped loop (32 columns, one warp, compiled for sm_90 by this machine's Triton 3.9) is 363 SASS
instructions per group, 238 of them the dequant and the dot. Fewer of them alone did not help either
(round 21, scripts/gemv_gluon_probe.py).

    python scripts/gemv_persistent_probe.py            # GPU: the sweep; $OUT/gemv_persistent_probe.md
    python scripts/gemv_persistent_probe.py --quick    # GPU: one config per shape
    TRITON_INTERPRET=1 python scripts/gemv_persistent_probe.py --check-only   # CPU: the stream-K logic
    ncu --section WarpStateStats -k regex:"_int4_gemv|_persistent_gemv" python scripts/gemv_persistent_probe.py --ncu
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

from utils import kernels  # noqa: E402
import gemv_probe as gp  # noqa: E402
import gemv_tma_probe as tp  # noqa: E402


@triton.jit
def _owner(t, total, P):
    """The program whose run holds tile t (run p is tiles [p total // P, (p + 1) total // P))."""
    return ((t + 1) * P - 1) // total


@triton.jit
def _fixup(part_ptr, lock_ptr, y_ptr, nb, rn, nmask, N, ng, total, P):
    """Column block nb was cut between programs: each wrote its partial sum at its program's row of
    part_ptr; the last to arrive adds them in program order (the same bits every run) and stores y."""
    first = _owner(nb * ng, total, P)
    last = _owner(nb * ng + ng - 1, total, P)
    tl.debug_barrier()                            # every thread's partial is written ...
    arrived = tl.atomic_add(lock_ptr + nb, 1, sem="acq_rel")          # ... before this release
    if arrived == last - first:
        y = tl.zeros((rn.shape[0],), dtype=tl.float32)
        for p in range(first, last + 1):
            y += tl.load(part_ptr + p * N + rn, mask=nmask, other=0.0, cache_modifier=".cg")
        tl.atomic_xchg(lock_ptr + nb, 0)
        tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=nmask)


@triton.jit
def _persistent_gemv_kernel(x_ptr, qw_ptr, qa_desc, qb_desc, qz_ptr, s_ptr, y_ptr, part_ptr, lock_ptr, K, N, P,
                            GROUP: tl.constexpr, BLOCK_N: tl.constexpr, F16X2: tl.constexpr,
                            NUM_STAGES: tl.constexpr, TMA: tl.constexpr):
    pid = tl.program_id(0)
    ng = K // GROUP
    total = tl.cdiv(N, BLOCK_N) * ng
    t0 = (pid * total) // P
    t1 = ((pid + 1) * total) // P
    R: tl.constexpr = GROUP // 8
    R2: tl.constexpr = R // 2
    acc = tl.zeros((R2 if F16X2 else R, BLOCK_N), dtype=tl.float32)
    for t in tl.range(t0, t1, num_stages=NUM_STAGES):
        nb = t // ng
        g = t - nb * ng
        rn = nb * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = rn < N
        z, s = kernels._group_zeros_scales(qz_ptr, s_ptr, g, rn, nmask, N)
        if F16X2:
            r16 = tl.arange(0, R2)
            if TMA:
                qa = qa_desc.load([g * R2, nb * BLOCK_N])
                qb = qb_desc.load([g * R2, nb * BLOCK_N])
            else:
                qa = tl.load(qw_ptr + (g * R + 2 * r16)[:, None] * N + rn[None, :], mask=nmask[None, :], other=0,
                             eviction_policy="evict_first")
                qb = tl.load(qw_ptr + (g * R + 2 * r16 + 1)[:, None] * N + rn[None, :], mask=nmask[None, :],
                             other=0, eviction_policy="evict_first")
            part = kernels._group_dot_f16x2(qa, qb, z, x_ptr, g, r16, GROUP)
        else:
            r8 = tl.arange(0, R)
            q = tl.load(qw_ptr + (g * R + r8)[:, None] * N + rn[None, :], mask=nmask[None, :], other=0)
            part = kernels._group_dot_f32(q, z, x_ptr, g, r8, GROUP)
        acc += part * s[None, :]
        if (g == ng - 1) | (t == t1 - 1):         # this program's part of column block nb is done
            y = tl.sum(acc, axis=0)
            whole = (t - g >= t0) & (g == ng - 1)       # it saw all ng groups: y is the answer
            if whole:
                tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=nmask)
            else:                                 # a partial: summed by _fixup after the loop
                tl.store(part_ptr + pid * N + rn, y, mask=nmask)
            acc = tl.zeros_like(acc)
    # only the run's first and last column blocks can be cut (plain stores inside the loop keep it
    # pipelineable; the fix-up's barrier and atomics here, once per cut block, do not)
    ra = tl.arange(0, BLOCK_N)
    nb0 = t0 // ng
    if (t0 - nb0 * ng != 0) | (t1 - nb0 * ng < ng):
        rn0 = nb0 * BLOCK_N + ra
        _fixup(part_ptr, lock_ptr, y_ptr, nb0, rn0, rn0 < N, N, ng, total, P)
    nb1 = (t1 - 1) // ng
    if (nb1 != nb0) & (t1 - nb1 * ng < ng):
        rn1 = nb1 * BLOCK_N + ra
        _fixup(part_ptr, lock_ptr, y_ptr, nb1, rn1, rn1 < N, N, ng, total, P)


def persistent_gemv(x, qw, qz, s, block_n=256, num_warps=8, num_stages=4, progs_per_sm=1, tma=False,
                    programs=None, group_size=128):
    """y [1, N] from the persistent kernel at a fixed config; programs overrides progs_per_sm x SMs."""
    K, N = qw.shape[0] * 8, qw.shape[1]
    f16x2 = kernels.int4_gemv_dequant(x) == "f16x2"
    assert x.data_ptr() % 16 == 0 and N % 8 == 0 and (f16x2 or not tma)
    nb = triton.cdiv(N, block_n)
    total = nb * (K // group_size)
    if programs is None:
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4
        programs = sms * progs_per_sm
    P = max(1, min(programs, total))
    y = torch.empty((N,), device=x.device, dtype=x.dtype)
    part = torch.empty((P, N), device=x.device, dtype=torch.float32)
    locks = gp.fixup_locks(x.device, nb)
    qa = qb = None
    if tma:
        qa, qb = tp.row_pair_descriptors(qw, block_n, group_size)
    _persistent_gemv_kernel[(P,)](x, qw, qa, qb, qz, s, y, part, locks, K, N, P, GROUP=group_size,
                                  BLOCK_N=block_n, F16X2=f16x2, NUM_STAGES=num_stages, TMA=tma,
                                  num_warps=num_warps, num_stages=1)
    return y.reshape(1, N)


def check_only():
    """CPU (interpreter): the stream-K runs, partials and fix-up against the fp32 reference, at program
    counts that cut column blocks in every way (one program, runs inside a block, runs across blocks)."""
    K, N = 1024, 256
    qw, qz, s, wd = gp.shape_setup(K, N, "cpu")
    for bn in (32, 64):
        for programs in (1, 3, 5, 8, 16, 64):
            err = gp.check(lambda *o: persistent_gemv(*o, block_n=bn, programs=programs, num_warps=1), qw, qz, s,
                           wd, K, "cpu", f"bn={bn} P={programs}")
            print(f"ok bn={bn} programs={programs}: rel L2 {err:.2e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--ncu", action="store_true", help="launch the shipped GEMV and the best persistent config "
                    "once at 3584 -> 18944 (run under ncu)")
    args = ap.parse_args()
    if args.check_only or not torch.cuda.is_available() or kernels.interpreted():
        return check_only()
    if args.ncu:
        qw, qz, s, _ = gp.shape_setup(3584, 18944, "cuda")
        x = torch.randn(1, 3584, device="cuda", dtype=torch.float16)
        kernels.int4_gemv(x, qw, qz, s, 128, block_n=32, split_k=6, num_warps=1, num_stages=1)
        persistent_gemv(x, qw, qz, s, block_n=256, num_warps=4, num_stages=3, progs_per_sm=3)
        torch.cuda.synchronize()
        return
    out = Path(os.environ.get("OUT", "/tmp"))
    device = "cuda"
    copy = gp.gpu_copy_gbps()
    rows = []
    if args.quick:
        configs = [dict(block_n=256, num_warps=8, num_stages=4, progs_per_sm=1)]
    else:
        configs = ([dict(block_n=bn, num_warps=w, num_stages=st, progs_per_sm=pp)
                    for bn, w, pp in ((256, 8, 1), (256, 4, 2), (256, 4, 3), (128, 4, 2), (128, 4, 4), (128, 2, 4),
                                      (64, 2, 8), (512, 8, 1), (512, 4, 2))
                    for st in (2, 3, 4, 6)]
                   + [dict(block_n=bn, num_warps=w, num_stages=st, progs_per_sm=pp, tma=True)
                      for bn, w, pp in ((256, 8, 1), (256, 4, 2), (128, 4, 2)) for st in (3, 4)])
    for K, N in ((3584, 18944), (18944, 3584)):
        ops, wd, qbytes, t_bf = gp.shape_case(K, N, device)
        x, qw, qz, s = ops
        t_floor = gp.time_ops(lambda q, *_: kernels.stream_read(q), (qw, qz, s, x))
        rows.append((K, N, "read floor: stream_read of the codes", t_floor, qw.numel() * 4, t_bf))
        t = gp.time_ops(lambda *o: kernels.int4_gemv(*o, 128), ops)
        rows.append((K, N, "shipped int4_gemv (default)", t, qbytes, t_bf))
        print(f"{K}->{N}: bf16 {t_bf * 1e6:.1f} us, read floor {t_floor * 1e6:.1f} us, shipped {t * 1e6:.1f} us",
              flush=True)
        best = None
        for cfg in configs:
            what = "persistent " + " ".join(f"{k}={v}" for k, v in cfg.items())
            best = gp.time_variant(lambda *o, c=cfg: persistent_gemv(*o, **c), what, cfg, K, N, ops, wd, qbytes,
                                   t_bf, rows, device, best)
        t = gp.time_ops(lambda *o: kernels.int4_gemv(*o, 128), ops)
        rows.append((K, N, "shipped int4_gemv (default), again", t, qbytes, t_bf))
        tp._DESCS.clear()
    print("\n".join(gp.write_table(rows, copy, out / "gemv_persistent_probe.md")))


if __name__ == "__main__":
    main()

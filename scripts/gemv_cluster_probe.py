"""Int4 GEMV, round 24 (issue 8; a bench, not a test): sum the split-K partials through distributed
shared memory (DSMEM) of a thread-block cluster instead of through global memory.

Round 22 (gemv_tail_probe.py) measured the shipped fix-up's cost: at 3584 -> 18944 the group loop with
its partials only stored took 11.2 us, the shipped kernel 12.5-12.7 us. That fix-up is three dependent
L2 round trips at the end of every column block (store and fence, the arrival counter's atomic, the
last program's loads). On sm_90 the programs of one column block can instead be one cluster: each
writes its partial to its own shared memory, a cluster barrier, then the cluster's rank 0 reads the
others' partials straight from their SMs (mapa + ld.shared::cluster), sums them in rank order (the same
order as the shipped fix-up, so the same bits), and stores y; a second cluster barrier keeps the others'
shared memory alive until it has. No workspace, no counters, no atomics, deterministic.

Triton 3.6 cannot express this: its num_ctas makes one program of a cluster (and its layout passes
fail on this kernel at num_ctas 2, 4, 6 and 8), and it has no DSMEM. So the kernel is compiled as a plain
one-program-per-CTA Triton kernel whose end is inline PTX, and launched here through cuLaunchKernelEx
with a cluster dimension (ctypes, libcuda); the partials' shared buffer is declared in the PTX.
Its group loop is the shipped one (utils.kernels._gemv_groups).

Answer (H200, gemv_cluster_probe.md and .log in docs/device-runs/20261124-lab05-kernels-h200/): right
at every config, no output bit changing in 20 runs, the shipped kernel's bits at its split 6, and slower
at every config. Round 24a, one-warp CTAs (this Triton kernel): the driver keeps 978-992 of them resident
at once when they are launched as clusters (cuOccupancyMaxActiveClusters x the cluster size), against
3552 in the shipped grid, and they took 28.1 / 22.5 us. Round 24b, CTAs of 2-8 warps, each warp its own
32 columns (a Gluon kernel with the layout stated, so one wave fits): 13.8 / 15.3 us at best against the
shipped kernel's 12.5 / 13.1 us and the same Gluon kernel's 13.6 / 14.3 us through the global fix-up.

    python scripts/gemv_cluster_probe.py     # GPU (sm_90); table $OUT/gemv_cluster_probe.md
"""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from gemv_probe import fixup_locks  # noqa: E402
from utils import kernels  # noqa: E402


def cluster_sum_asm(split: int, pack: int, block_n: int) -> str:
    """PTX for `pack` fp32 partials per thread ($pack.. as int32 bits; $2pack.. their byte offsets in a
    shared buffer of block_n floats that the block declares): store, cluster barrier, rank 0 adds ranks
    1..split-1's in order, barrier; $0.. the sums (rank 0's are y; the others' are their own partials,
    unused). The buffer is the asm's own (.shared in its scope): Triton declares no shared memory in a
    kernel that needs none."""
    ins = lambda e: f"${pack + e}"       # noqa: E731
    offs = lambda e: f"${2 * pack + e}"  # noqa: E731
    lines = ["{", f".shared .align 16 .b8 clbuf[{4 * block_n}];", ".reg .pred p0;", ".reg .b32 base, rank, ra, rr;",
             ".reg .b32 " + ", ".join(f"a{e}" for e in range(pack)) + ";",
             ".reg .f32 " + ", ".join(f"v{e}" for e in range(pack)) + ";"]
    if split > 1:
        lines.append(".reg .f32 " + ", ".join(f"t{e}_{r}" for e in range(pack) for r in range(1, split)) + ";")
    lines.append("mov.u32 base, clbuf;")
    for e in range(pack):
        lines += [f"add.u32 a{e}, base, {offs(e)};", f"mov.b32 v{e}, {ins(e)};", f"st.shared.f32 [a{e}], v{e};"]
    lines += ["barrier.cluster.arrive.release.aligned;", "barrier.cluster.wait.acquire.aligned;",
              "mov.u32 rank, %cluster_ctarank;", "setp.eq.u32 p0, rank, 0;"]
    for r in range(1, split):                       # every remote load issued before any add
        lines.append(f"mov.u32 rr, {r};")
        for e in range(pack):
            lines += [f"@p0 mapa.shared::cluster.u32 ra, a{e}, rr;", f"@p0 ld.shared::cluster.f32 t{e}_{r}, [ra];"]
    for e in range(pack):
        lines += [f"@p0 add.f32 v{e}, v{e}, t{e}_{r};" for r in range(1, split)]
    lines += ["barrier.cluster.arrive.release.aligned;", "barrier.cluster.wait.acquire.aligned;"]
    lines += [f"mov.b32 ${e}, v{e};" for e in range(pack)]
    return "\n".join(lines + ["}"])


@triton.jit
def _cluster_gemv_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, y_ptr, K, N,
                         BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, ASM: tl.constexpr,
                         CONSTRAINTS: tl.constexpr, PACK: tl.constexpr):
    pid = tl.program_id(0)
    pid_n = pid // SPLIT_K                        # a cluster = the SPLIT_K programs of one column block
    pid_k = pid % SPLIT_K                         # = %cluster_ctarank (cluster dims (SPLIT_K, 1, 1))
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    ng = K // 128
    y = kernels._gemv_groups(x_ptr, qw_ptr, qz_ptr, s_ptr, rn, nmask, N, pid_k, ng, SPLIT_K, 128, BLOCK_N,
                             True, 1, True, N)
    off = 4 * tl.arange(0, BLOCK_N)
    y = tl.inline_asm_elementwise(ASM, CONSTRAINTS, [y.to(tl.int32, bitcast=True), off], dtype=tl.int32,
                                  is_pure=False, pack=PACK).to(tl.float32, bitcast=True)
    if pid_k == 0:
        bad = tl.sum(((y - y) != 0).to(tl.int32), axis=0)   # fp16 overflow: redo exactly (as shipped)
        if bad > 0:
            y = kernels._gemv_exact(x_ptr, qw_ptr, qz_ptr, s_ptr, rn, nmask, N, ng, 128, BLOCK_N)
        tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=nmask)


def _gluon():
    """The Gluon kernel of round 24b, built on first use (Gluon needs Triton 3.6, as on the lent GPU)."""
    if "gluon" in _CU:
        return _CU["gluon"]
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from gemv_gluon_probe import _group_terms, _scaled_dot, _store_splitk

    @gluon.jit
    def _cluster_gemv_gluon(x_ptr, qw_ptr, qz_ptr, s_ptr, y_ptr, part_ptr, lock_ptr, K, N,
                            SPLIT_K: gl.constexpr, CLUSTER: gl.constexpr, ASM: gl.constexpr,
                            CONSTRAINTS: gl.constexpr, num_warps: gl.constexpr):
        """CTAs of num_warps warps, each warp its own 32 columns with the shipped kernel's per-warp tile
        (each thread 2 of a group's 8 even (odd) packed rows x 4 columns) and group order (pid_k, pid_k +
        SPLIT_K, ...). CLUSTER: the partials summed through DSMEM (launched as clusters of SPLIT_K);
        else the shipped global fix-up (gemv_gluon_probe._store_splitk), the control."""
        L: gl.constexpr = gl.BlockedLayout([2, 4], [4, 8], [1, num_warps], [1, 0])
        BLOCK_N: gl.constexpr = 32 * num_warps
        pid = gl.program_id(0)
        pid_n = pid // SPLIT_K
        pid_k = pid % SPLIT_K
        rows = gl.arange(0, 8, layout=gl.SliceLayout(1, L))
        cols = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, L))
        x32 = x_ptr.to(gl.pointer_type(gl.int32))
        acc = gl.zeros([8, BLOCK_N], gl.float32, L)
        for g in range(pid_k, K // 128, SPLIT_K):
            terms = _group_terms(x32, qz_ptr, s_ptr, g, rows, cols, N, 128)
            qa = gl.load(qw_ptr + gl.expand_dims(g * 16 + 2 * rows, 1) * N + gl.expand_dims(cols, 0),
                         eviction_policy="evict_first")
            qb = gl.load(qw_ptr + gl.expand_dims(g * 16 + 2 * rows + 1, 1) * N + gl.expand_dims(cols, 0),
                         eviction_policy="evict_first")
            acc += _scaled_dot(qa, qb, terms)
        y = gl.sum(acc, axis=0)
        if CLUSTER:
            off = 4 * gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, L))
            y = gl.inline_asm_elementwise(ASM, CONSTRAINTS, [y.to(gl.int32, bitcast=True), off], dtype=gl.int32,
                                          is_pure=False, pack=4).to(gl.float32, bitcast=True)
            if pid_k == 0:
                gl.store(y_ptr + cols, y.to(y_ptr.dtype.element_ty))
        else:
            _store_splitk(y, part_ptr, lock_ptr, y_ptr, pid_n, pid_k, cols, N, SPLIT_K)

    _CU["gluon"] = _cluster_gemv_gluon
    return _cluster_gemv_gluon


def gluon_gemv(x, qw, qz, s, warps: int = 4, split: int = 6, cluster: bool = True):
    """Round 24b: y [1, N] fp16, CTAs of `warps` independent warps (32 columns each); cluster=True sums
    the split through DSMEM (clusters of `split` CTAs), else through the shipped global fix-up."""
    K, N = qw.shape[0] * 8, qw.shape[1]
    bn = 32 * warps
    if N % bn or (K // 128) < split:
        raise ValueError(f"need N % (32 warps) == 0 and split <= K/128; got N={N}, warps={warps}, split={split}")
    y = torch.empty((N,), device=x.device, dtype=x.dtype)
    kern = _gluon()
    asm = cluster_sum_asm(split, 4, bn)
    cons = ",".join(["=r"] * 4 + ["r"] * 8)
    grid = (N // bn) * split
    if not cluster:
        part = torch.empty((split, N), device=x.device, dtype=torch.float32)
        locks = fixup_locks(x.device, N // bn)
        kern[(grid,)](x, qw, qz, s, y, part, locks, K, N, SPLIT_K=split, CLUSTER=False, ASM=asm, CONSTRAINTS=cons,
                      num_warps=warps)
        return y.reshape(1, N)
    key = ("gluon", warps, split)
    if key not in _COMPILED:
        _register(key, kern.warmup(x, qw, qz, s, y, y, y, K, N, SPLIT_K=split, CLUSTER=True, ASM=asm,
                                   CONSTRAINTS=cons, num_warps=warps, grid=(1,)), 9, split)
    _launch_cluster(_COMPILED[key][0], (x, qw, qz, s, y, y, y), (K, N), grid, split)   # part and locks unused
    return y.reshape(1, N)


class _Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class _AttrValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("align", ctypes.c_uint64), ("clusterDim", _Dim3)]


class _Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttrValue)]


class _Config(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attr)), ("numAttrs", ctypes.c_uint)]


_CU = {}
_CLUSTER_DIMENSION, _NON_PORTABLE_CLUSTER = 4, 14        # cuda.h: CU_LAUNCH_ATTRIBUTE_*, CU_FUNC_ATTRIBUTE_*


def _cuda():
    if "lib" not in _CU:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                         ctypes.c_void_p]
        lib.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        lib.cuOccupancyMaxActiveClusters.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p,
                                                     ctypes.POINTER(_Config)]
        _CU["lib"] = lib
    return _CU["lib"]


_COMPILED: dict = {}


def _compiled(x, qw, qz, s, y, block_n: int, split: int, pack: int):
    key = (block_n, split, pack)
    if key not in _COMPILED:
        K, N = qw.shape[0] * 8, qw.shape[1]
        asm = cluster_sum_asm(split, pack, block_n)
        cons = ",".join(["=r"] * pack + ["r"] * (2 * pack))
        _register(key, _cluster_gemv_kernel.warmup(x, qw, qz, s, y, K, N, BLOCK_N=block_n, SPLIT_K=split,
                                                   ASM=asm, CONSTRAINTS=cons, PACK=pack, grid=(1,), num_warps=1,
                                                   num_stages=1), 7, split)
    return _COMPILED[key]


def _register(key, ck, nargs: int, split: int) -> None:
    """Keep a compiled kernel for _launch_cluster (with its count of cluster barriers), after checking
    that its parameters are what the launcher passes: nargs arguments and Triton's two scratch pointers."""
    ck._init_handles()
    ptx = ck.asm["ptx"]
    nparams = ptx.split(".entry", 1)[1].split(")", 1)[0].count(".param")
    if nparams != nargs + 2:
        raise SystemExit(f"unexpected kernel parameters ({nparams}); this launcher passes {nargs + 2}")
    if getattr(ck.metadata, "global_scratch_size", 0):
        raise SystemExit("the kernel wants global scratch; this launcher passes none")
    if split > 8:
        err = _cuda().cuFuncSetAttribute(ctypes.c_void_p(ck.function), _NON_PORTABLE_CLUSTER, 1)
        if err:
            raise SystemExit(f"cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED) failed: CUresult {err}")
    _COMPILED[key] = (ck, ptx.count("barrier.cluster.arrive"))


def _launch_cluster(ck, tensors: tuple, ints: tuple, grid: int, split: int) -> None:
    """cuLaunchKernelEx of ck on the current stream: the tensors' pointers, the int32s, two null scratch
    pointers; a 1-D grid of `grid` CTAs in clusters of `split`."""
    vals = [ctypes.c_uint64(t.data_ptr()) for t in tensors] + [ctypes.c_int32(i) for i in ints]
    vals += [ctypes.c_uint64(0), ctypes.c_uint64(0)]
    params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in vals])
    cfg, _attr = _launch_config(ck, grid, split)
    err = _cuda().cuLaunchKernelEx(ctypes.byref(cfg), ctypes.c_void_p(ck.function), params, None)
    if err:
        raise RuntimeError(f"cuLaunchKernelEx failed: CUresult {err}")


def _launch_config(ck, grid: int, split: int) -> tuple:
    attr = _Attr(id=_CLUSTER_DIMENSION)
    attr.value.clusterDim = _Dim3(split, 1, 1)
    cfg = _Config(gridDimX=grid, gridDimY=1, gridDimZ=1, blockDimX=32 * ck.metadata.num_warps, blockDimY=1,
                  blockDimZ=1, sharedMemBytes=ck.metadata.shared, hStream=torch.cuda.current_stream().cuda_stream,
                  attrs=ctypes.pointer(attr), numAttrs=1)
    return cfg, attr


def resident_ctas(key: tuple) -> int:
    """CTAs of a compiled kernel (_COMPILED's key) resident at once on the device, by the driver's
    occupancy calculator for clusters (cuOccupancyMaxActiveClusters x the cluster size): one wave."""
    ck, _ = _COMPILED[key]
    split = key[2] if key[0] == "gluon" else key[1]
    cfg, _attr = _launch_config(ck, split * 1024, split)
    n = ctypes.c_int(0)
    err = _cuda().cuOccupancyMaxActiveClusters(ctypes.byref(n), ctypes.c_void_p(ck.function), ctypes.byref(cfg))
    if err:
        raise RuntimeError(f"cuOccupancyMaxActiveClusters failed: CUresult {err}")
    return n.value * split


def cluster_gemv(x, qw, qz, s, block_n: int = 32, split: int = 6, pack: int = 4):
    """y [1, N] fp16 = x @ dequant(W), one cluster of `split` one-warp CTAs per column block."""
    K, N = qw.shape[0] * 8, qw.shape[1]
    if N % block_n or (K // 128) < split:
        raise ValueError(f"need N % block_n == 0 and split <= K/128; got N={N}, block_n={block_n}, split={split}")
    y = torch.empty((N,), device=x.device, dtype=x.dtype)
    ck, _ = _compiled(x, qw, qz, s, y, block_n, split, pack)
    _launch_cluster(ck, (x, qw, qz, s, y), (K, N), (N // block_n) * split, split)
    return y.reshape(1, N)


# (K, N): round 24a's Triton configs (block_n, split) and round 24b's Gluon ones (warps, split)
CASES = {(3584, 18944): {"triton": [(32, 6)], "gluon": [(1, 6), (2, 6), (4, 6), (8, 6), (4, 4), (4, 7), (4, 8)]},
         (18944, 3584): {"triton": [(32, 8)], "gluon": [(2, 8), (4, 8), (8, 8), (2, 16), (4, 16), (8, 16)]}}
SHIPPED = {(3584, 18944): 6, (18944, 3584): 30}


def main():
    from gemv_probe import write_table
    from gemv_tail_probe import keep_checked, probe_shapes, probe_start, shipped_gemv, timed_rows
    out, copy = probe_start("gemv_cluster_probe", "thread-block clusters and DSMEM are sm_90 features")
    rows = []
    for K, N, cases, ops, ref, qbytes, t_bf in probe_shapes(CASES):
        sk = SHIPPED[(K, N)]
        fns = dict([shipped_gemv(sk)])
        shipped_y = next(iter(fns.values()))(*ops)
        fns[f"Gluon control: 1 warp, split {sk}, global fix-up"] = (
            lambda *o, sk=sk: gluon_gemv(*o, warps=1, split=sk, cluster=False))
        keys = {}                                   # name -> _COMPILED's key, for the cluster kernels
        for bn, sp in cases["triton"]:
            name = f"Triton cluster: {bn} columns, 1 warp, split {sp}"
            fns[name] = lambda *o, bn=bn, sp=sp: cluster_gemv(*o, block_n=bn, split=sp, pack=4)
            keys[name] = (bn, sp, 4)
        for w, sp in cases["gluon"]:
            name = f"Gluon cluster: {w} warps (32 columns each), split {sp}"
            fns[name] = lambda *o, w=w, sp=sp: gluon_gemv(*o, warps=w, split=sp)
            keys[name] = ("gluon", w, sp)

        def note(name, fns=fns, keys=keys, ops=ops, shipped_y=shipped_y, N=N):
            line = ""
            if name in keys:
                key = keys[name]
                ck, barriers = _COMPILED[key]
                grid = (N // 32) * key[2] // key[1] if key[0] == "gluon" else (N // key[0]) * key[1]
                line = (f"; {ck.n_regs} registers, {barriers} cluster barriers in the PTX; {resident_ctas(key)} "
                        f"CTAs resident at once for {grid} in the grid")
            return line + f"; bit-identical to shipped: {bool(torch.equal(fns[name](*ops), shipped_y))}"

        rows += timed_rows(keep_checked(fns, ops, ref, K, N, note), ops, K, N, qbytes, t_bf)
    print("\n".join(write_table(rows, copy, out / "gemv_cluster_probe.md")))


if __name__ == "__main__":
    main()

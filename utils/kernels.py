"""Triton kernels written in the project: GEMM, grouped GEMM, int8 GEMM and an Int4 (GPTQ) GEMV.

Why hand-written: Lab 05 opens the operators, so the kernels whose precision and speed it measures
are ours, small enough to read. Each runs on a GPU (compiled, autotuned) and on a CPU through
Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported) at small sizes. The
interpreter has no bfloat16 and ignores input_precision (it computes the dot in numpy);
`interpreter_limits()` says so, and the lab reports it rather than pretending otherwise.

Layouts: GEMM is row-major A[M, K] @ B[K, N]. The grouped GEMM takes every group's rows in ONE
buffer A[sum M_g, K] with int32 end offsets (as torch._grouped_mm does), weights B[G, K, N]; no array
of pointers, so it also runs in the interpreter. The Int4 GEMV reads the GPTQ checkpoint layout
(v1): qweight int32 [K/8, N] (8 nibbles along K), qzeros int32 [K/g, N/8] stored minus one,
scales fp16 [K/g, N]; w = (q - (z + 1)) * s.
"""
from __future__ import annotations

import functools
import importlib
import os

import torch
import triton
import triton.language as tl

from .gptq import dequant_gptq_int4, pack_gptq_int4  # noqa: F401  (the GEMV's public names)

try:    # griddepcontrol (sm_90+): programmatic dependent launch of the GEMV's sum kernel
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:     # a Triton without them: the sum kernel is then launched plainly (PDL off)
    gdc_launch_dependents = gdc_wait = None

INPUT_PRECISIONS = ("tf32", "tf32x3", "ieee")


def _precision(input_precision: str | None) -> str:
    """tl.dot's input_precision for matmul and grouped_matmul: "ieee" when None (tl.dot's own default on a
    GPU is tf32, which would give fp32 inputs a 10-bit mantissa without saying so)."""
    _check(input_precision is None or input_precision in INPUT_PRECISIONS,
           f"input_precision must be one of {INPUT_PRECISIONS} or None, got {input_precision!r}")
    return input_precision or "ieee"


def interpreted() -> bool:
    """True when Triton runs through its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def interpreter_limits() -> list[str]:
    """What the interpreter cannot show; empty on a GPU."""
    if not interpreted():
        return []
    return ["no bfloat16: bf16 GEMMs are skipped under TRITON_INTERPRET=1",
            "input_precision (tf32 / tf32x3 / ieee) is ignored: the dot runs in numpy at fp32",
            "fp16 accumulation (out_dtype=fp16) is numpy's fp16 dot, not a tensor core's"]


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _gpu_configs(keys):
    cfgs = []
    for bm, bn, bk, st, w in [(128, 256, 64, 3, 8), (128, 256, 64, 4, 8), (256, 128, 64, 3, 8),
                              (128, 128, 64, 4, 4), (128, 128, 64, 4, 8), (128, 128, 32, 4, 4),
                              (64, 128, 64, 4, 4), (64, 64, 64, 4, 4)]:
        cfgs.append(triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                                  num_stages=st, num_warps=w))
    return cfgs


# ----------------------------------------------------------------------------------------- GEMM
@triton.jit
def _tile_of(pid, num_m, num_n, GROUP_M: tl.constexpr):
    """Grouped ordering (Triton's matmul tutorial): GROUP_M row-tiles in a row share B's tiles in L2."""
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    gsize = min(num_m - first_m, GROUP_M)
    return first_m + ((pid % group) % gsize), (pid % group) // gsize


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, PRECISION: tl.constexpr, ACC_FP16: tl.constexpr):
    pid_m, pid_n = _tile_of(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (rm % M)[:, None] * sam + rk[None, :] * sak
    b_ptrs = b_ptr + rk[:, None] * sbk + (rn % N)[None, :] * sbn
    if ACC_FP16:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float16)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kmask = rk < K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=kmask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=kmask[:, None], other=0.0)
        if ACC_FP16:
            acc = tl.dot(a, b, acc, out_dtype=tl.float16)
        else:
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * sak
        b_ptrs += BLOCK_K * sbk
    c = acc.to(c_ptr.dtype.element_ty)
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, c, mask=mask)


def _fits_shared_memory(configs, named_args, **kwargs):
    """Drop tiles whose pipelined A and B buffers exceed ~220 KB of shared memory (fp32 needs smaller ones)."""
    size = named_args["a_ptr"].element_size()
    ok = [c for c in configs if (c.kwargs["BLOCK_M"] + c.kwargs["BLOCK_N"]) * c.kwargs["BLOCK_K"] * size
          * c.num_stages <= 220 * 1024]
    return ok or configs[-1:]


_matmul_tuned = triton.autotune(configs=_gpu_configs(None), key=["M", "N", "K"],
                                prune_configs_by={"early_config_prune": _fits_shared_memory})(_matmul_kernel)


def _small_config(M, N, K):
    return dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=4)


def matmul(a: torch.Tensor, b: torch.Tensor, input_precision: str | None = None,
           acc_dtype: torch.dtype = torch.float32, config: dict | None = None) -> torch.Tensor:
    """C = A @ B in A's dtype (fp16, bf16 or fp32), accumulated in fp32 (or fp16 for fp16 inputs).

    input_precision is how tl.dot treats fp32 inputs: "tf32" (10-bit mantissa), "tf32x3" (three
    tf32 products, about fp32 accuracy) or "ieee"; None means "ieee" for fp32, ignored for 16-bit.
    config fixes the tile (keys BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages) instead of
    autotuning; the interpreter always uses small fixed tiles.
    """
    _check(a.ndim == 2 and b.ndim == 2 and a.shape[1] == b.shape[0],
           f"a and b must be 2-D with a.shape[1] == b.shape[0], got {tuple(a.shape)} @ {tuple(b.shape)}")
    _check(a.dtype == b.dtype and a.dtype in (torch.float16, torch.bfloat16, torch.float32),
           f"a and b must share dtype fp16, bf16 or fp32, got {a.dtype}, {b.dtype}")
    prec = _precision(input_precision)
    _check(acc_dtype in (torch.float32, torch.float16) and (acc_dtype == torch.float32 or a.dtype == torch.float16),
           "acc_dtype must be torch.float32, or torch.float16 with fp16 inputs")
    _check(a.device == b.device, f"a is on {a.device}, b on {b.device}: put both on one device")
    if interpreted():
        _check(a.dtype != torch.bfloat16, "bfloat16 does not run under TRITON_INTERPRET=1 (numpy has no bf16)")
        _check(a.device.type == "cpu", "under TRITON_INTERPRET=1 the tensors must be on the CPU")
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    args = (a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    if interpreted() or config is not None:
        cfg = dict(config or _small_config(M, N, K))
        kw = {k: cfg.pop(k) for k in ("num_warps", "num_stages") if k in cfg}
        grid = (triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"]),)
        _matmul_kernel[grid](*args, PRECISION=prec, ACC_FP16=acc_dtype == torch.float16, **cfg, **kw)
    else:
        grid = lambda m: (triton.cdiv(M, m["BLOCK_M"]) * triton.cdiv(N, m["BLOCK_N"]),)  # noqa: E731
        _matmul_tuned[grid](*args, PRECISION=prec, ACC_FP16=acc_dtype == torch.float16)
    return c


# --------------------------------------------------------------------------------- grouped GEMM
@triton.jit
def _group_rows(offs_ptr, g):
    """(first row, number of rows) of group g, from the int32 cumulative row ends offs."""
    start = tl.load(offs_ptr + g - 1, mask=g > 0, other=0)
    return start, tl.load(offs_ptr + g) - start


@triton.jit
def _grouped_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, N, K, sam, sak, sbg, sbk, sbn, scm, scn,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP_M: tl.constexpr, PRECISION: tl.constexpr):
    g = tl.program_id(1)
    start, Mg = _group_rows(offs_ptr, g)
    pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(Mg, BLOCK_M), tl.cdiv(N, BLOCK_N)
    if pid < num_m * num_n:                      # programs past this group's tiles do nothing
        pid_m, pid_n = _tile_of(pid, num_m, num_n, GROUP_M)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        rows = start + tl.minimum(rm, Mg - 1)     # clamp inside the group (masked on store)
        a_ptrs = a_ptr + rows[:, None] * sam + rk[None, :] * sak
        b_ptrs = b_ptr + g * sbg + rk[:, None] * sbk + (rn % N)[None, :] * sbn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            kmask = rk < K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=kmask[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=kmask[:, None], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
            a_ptrs += BLOCK_K * sak
            b_ptrs += BLOCK_K * sbk
        mask = (rm < Mg)[:, None] & (rn < N)[None, :]
        tl.store(c_ptr + (start + rm)[:, None] * scm + rn[None, :] * scn,
                 acc.to(c_ptr.dtype.element_ty), mask=mask)


_grouped_tuned = triton.autotune(configs=_gpu_configs(None), key=["N", "K"],
                                 prune_configs_by={"early_config_prune": _fits_shared_memory})(_grouped_kernel)


@triton.jit
def _tma_tile_acc(a_desc, b_desc, start, g, pid_m, pid_n, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    """fp32 [BLOCK_M, BLOCK_N] tile (pid_m, pid_n) of group g (rows from start) through TMA descriptors."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = a_desc.load([start + pid_m * BLOCK_M, k])
        b = b_desc.load([g * K + k, pid_n * BLOCK_N])
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _grouped_tma_kernel(a_desc, b_desc, c_ptr, offs_ptr, N, K, scm, scn, MAX_ROWS,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr):
    """The grouped GEMM with A and B read through TMA descriptors (Hopper's bulk tensor copy engine).
    A tile may read rows past its group's end (the next group's, or TMA's zero fill): they are never
    stored. B is viewed as [G*K, N], so K must be a multiple of BLOCK_K (the wrapper checks)."""
    g = tl.program_id(1)
    start, Mg = _group_rows(offs_ptr, g)
    pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(Mg, BLOCK_M), tl.cdiv(N, BLOCK_N)
    if pid < num_m * num_n:
        pid_m, pid_n = _tile_of(pid, num_m, num_n, GROUP_M)
        acc = _tma_tile_acc(a_desc, b_desc, start, g, pid_m, pid_n, K, BLOCK_M, BLOCK_N, BLOCK_K)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (rm < Mg)[:, None] & (rn < N)[None, :]
        tl.store(c_ptr + (start + rm)[:, None] * scm + rn[None, :] * scn, acc.to(c_ptr.dtype.element_ty), mask=mask)


def _tma_block_shapes(nargs):
    """Autotune pre-hook: each config's tile is the descriptors' block shape."""
    nargs["a_desc"].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_K"]]
    nargs["b_desc"].block_shape = [nargs["BLOCK_K"], nargs["BLOCK_N"]]


# Measured on the H100 (scripts/grouped_probe.py): 128x256x64 won at 8 x 512 and 8 x 2048 rows.
_grouped_tma_tuned = triton.autotune(
    configs=[triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=st,
                           num_warps=w, pre_hook=_tma_block_shapes)
             for bm, bn, st, w in [(128, 256, 3, 8), (128, 256, 4, 8), (256, 128, 4, 8), (128, 128, 4, 4)]],
    key=["N", "K", "MAX_ROWS"])(_grouped_tma_kernel)


GROUPED_KERNELS = ("gluon", "tma", "pointers")
_GLUON_BROKEN: list = []        # why the Gluon kernel failed here, once it has (auto then skips it)


def _why_not_tma(a: torch.Tensor, b: torch.Tensor) -> str | None:
    """Why the TMA kernel cannot take these operands (None: it can): an NVIDIA GPU of compute capability
    9+, 16-bit data, K a multiple of 64, N of 8, contiguous 16-byte-aligned operands, some rows."""
    if interpreted() or a.device.type != "cuda" or torch.version.hip is not None:
        return "it needs an NVIDIA GPU (not the interpreter, not ROCm)"
    if torch.cuda.get_device_capability(a.device)[0] < 9:
        return "it needs compute capability 9.0 or newer (TMA)"
    K, N = b.shape[1], b.shape[2]
    if a.dtype not in (torch.float16, torch.bfloat16):
        return f"it takes fp16 or bf16, not {a.dtype}"
    if K % 64 or N % 8:
        return f"it needs K % 64 == 0 and N % 8 == 0, got K={K}, N={N}"
    if not (a.is_contiguous() and b.is_contiguous() and a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0):
        return "it needs contiguous, 16-byte-aligned a and b"
    if a.shape[0] == 0:
        return "a has no rows"
    return None


def _why_not_gluon(a: torch.Tensor, why_not_tma: str | None) -> str | None:
    """Why the warp-specialized Gluon kernel (utils.grouped_gluon) cannot run here (None: it can): the
    TMA kernel's conditions (why_not_tma, _why_not_tma's answer for the same operands), wgmma (sm_90
    exactly), and a Triton with Gluon."""
    why = why_not_tma
    if why is None and torch.cuda.get_device_capability(a.device) != (9, 0):
        why = "it needs an sm_90 GPU (Hopper's wgmma)"
    if why is None:
        try:
            importlib.import_module(".grouped_gluon", __package__)
        except ImportError as exc:
            why = f"this Triton has no usable Gluon ({exc}); Triton 3.5 or newer has it"
    if why is None and _GLUON_BROKEN:
        why = f"it failed here before: {_GLUON_BROKEN[0]}"
    return why


def _grouped_refusals(a: torch.Tensor, b: torch.Tensor) -> dict:
    """Each grouped kernel -> why it cannot run on a and b (None: it can)."""
    why_not_tma = _why_not_tma(a, b)
    return {"gluon": _why_not_gluon(a, why_not_tma), "tma": why_not_tma, "pointers": None}


def grouped_kernel(a: torch.Tensor, b: torch.Tensor, kernel: str = "auto") -> str:
    """Which grouped GEMM kernel grouped_matmul runs on a and b: "gluon" (warp-specialized, Hopper),
    "tma" (Triton, TMA loads) or "pointers" (Triton, pointer loads; everywhere, the interpreter too).
    "auto" is the first of those that can run; a named one that cannot raises ValueError saying why."""
    _check(kernel in ("auto",) + GROUPED_KERNELS, f"kernel must be 'auto' or one of {GROUPED_KERNELS}, got {kernel!r}")
    if kernel == "auto":
        return grouped_kernels_here(a, b)[0]
    why = _grouped_refusals(a, b)[kernel]
    _check(why is None, f"the {kernel} grouped GEMM cannot run here: {why}; kernel='auto' picks one that can")
    return kernel


def grouped_kernels_here(a: torch.Tensor, b: torch.Tensor) -> list[str]:
    """Every grouped GEMM kernel that can run on a and b, fastest first (GROUPED_KERNELS' order)."""
    why = _grouped_refusals(a, b)
    return [k for k in GROUPED_KERNELS if why[k] is None]


def group_offsets(sizes: list[int], device="cpu") -> torch.Tensor:
    """int32 end offsets of groups of `sizes` rows laid one after another (torch._grouped_mm's offs)."""
    _check(all(int(s) >= 0 for s in sizes) and len(sizes) > 0, f"group sizes must be >= 0, got {sizes}")
    return torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)


def grouped_matmul(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, max_rows: int | None = None,
                   config: dict | None = None, kernel: str = "auto", input_precision: str | None = None) -> torch.Tensor:
    """out[offs[g-1]:offs[g]] = a[offs[g-1]:offs[g]] @ b[g] for every group g, in one launch.

    a: [sum M_g, K]; b: [G, K, N]; offs: int32 [G] cumulative row ends. max_rows (the largest
    group) sizes the grid; given, it saves reading offs back to the host. kernel: "auto" (the fastest
    that runs here), "gluon" (warp-specialized, utils.grouped_gluon: an sm_90 GPU, 16-bit data, K % 64 ==
    0), "tma" (Triton with TMA loads: compute capability 9+, the same operands) or "pointers" (anywhere);
    grouped_kernel says which and why not. A fixed config (Triton tile keys, as in matmul) runs the
    pointer kernel. input_precision as in matmul (None is "ieee", _precision says why).
    """
    _check(a.ndim == 2 and b.ndim == 3 and a.shape[1] == b.shape[1],
           f"a must be [rows, K] and b [G, K, N] with the same K, got {tuple(a.shape)} and {tuple(b.shape)}")
    _check(offs.ndim == 1 and offs.shape[0] == b.shape[0] and offs.dtype == torch.int32,
           f"offs must be int32 of length G={b.shape[0]} (cumulative row ends), got {offs.dtype} {tuple(offs.shape)}")
    _check(a.dtype == b.dtype and a.dtype in (torch.float16, torch.bfloat16, torch.float32),
           f"a and b must share dtype fp16, bf16 or fp32, got {a.dtype}, {b.dtype}")
    prec = _precision(input_precision)
    if interpreted():
        _check(a.dtype != torch.bfloat16, "bfloat16 does not run under TRITON_INTERPRET=1 (numpy has no bf16)")
    _check(config is None or kernel in ("auto", "pointers"),
           f"a fixed config runs the pointer kernel: pass kernel='auto' or 'pointers', not {kernel!r}")
    path = "pointers" if config is not None else grouped_kernel(a, b, kernel)
    G, K, N = b.shape
    if max_rows is None:
        o = offs.cpu().long()
        _check(int(o[-1]) == a.shape[0] and bool((o[1:] >= o[:-1]).all()) and int(o[0]) >= 0,
               f"offs must be non-decreasing and end at a.shape[0]={a.shape[0]}, got {o.tolist()}")
        max_rows = int(torch.diff(o, prepend=o.new_zeros(1)).max())
    if path == "gluon":
        from . import grouped_gluon
        try:
            return grouped_gluon.grouped_matmul_ws(a, b, offs, max_rows)
        except Exception as exc:  # noqa: BLE001 - a Triton whose Gluon differs: say so once, use the TMA kernel
            if kernel == "gluon" or isinstance(exc, torch.cuda.OutOfMemoryError):
                raise
            _GLUON_BROKEN.append(f"{type(exc).__name__}: {str(exc)[:200]}")
            import warnings
            warnings.warn(f"the Gluon grouped GEMM failed here ({_GLUON_BROKEN[0]}); using the TMA kernel from now on")
            path = "tma"
    c = torch.empty((a.shape[0], N), device=a.device, dtype=a.dtype)
    args = (a, b, c, offs, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2),
            c.stride(0), c.stride(1))
    if interpreted() or config is not None:
        cfg = dict(config or _small_config(max_rows, N, K))
        kw = {k: cfg.pop(k) for k in ("num_warps", "num_stages") if k in cfg}
        grid = (triton.cdiv(max(max_rows, 1), cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"]), G)
        _grouped_kernel[grid](*args, PRECISION=prec, **cfg, **kw)
    elif path == "tma":
        from triton.tools.tensor_descriptor import TensorDescriptor
        a_desc = TensorDescriptor.from_tensor(a, [128, 64])          # block shapes set per config
        b_desc = TensorDescriptor.from_tensor(b.reshape(G * K, N), [64, 128])
        grid = lambda m: (triton.cdiv(max(max_rows, 1), m["BLOCK_M"]) * triton.cdiv(N, m["BLOCK_N"]), G)  # noqa: E731
        _grouped_tma_tuned[grid](a_desc, b_desc, c, offs, N, K, c.stride(0), c.stride(1), max_rows)
    else:
        grid = lambda m: (triton.cdiv(max(max_rows, 1), m["BLOCK_M"]) * triton.cdiv(N, m["BLOCK_N"]), G)  # noqa: E731
        _grouped_tuned[grid](*args, PRECISION=prec)
    return c


def grouped_matmul_loop(a: torch.Tensor, b: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """The baseline: one torch.matmul per group, written into one output."""
    out = torch.empty((a.shape[0], b.shape[2]), device=a.device, dtype=a.dtype)
    start = 0
    for g, m in enumerate(sizes):
        torch.matmul(a[start:start + m], b[g], out=out[start:start + m])
        start += m
    return out


# ------------------------------------------------------------------------------------ int8 GEMM
@triton.jit
def _int8_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (rm % M)[:, None] * sam + rk[None, :] * sak
    b_ptrs = b_ptr + rk[:, None] * sbk + (rn % N)[None, :] * sbn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kmask = rk < K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=kmask[None, :], other=0)
        b = tl.load(b_ptrs, mask=kmask[:, None], other=0)
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)  # int8 x int8 -> int32 accumulator
        a_ptrs += BLOCK_K * sak
        b_ptrs += BLOCK_K * sbk
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc, mask=mask)


def int8_matmul(a: torch.Tensor, b: torch.Tensor, block_k: int = 128) -> torch.Tensor:
    """int32 C = A @ B for int8 A [M, K], B [K, N], accumulated in int32 by tl.dot (what it does past
    the int32 range is what Lab 05 measures)."""
    _check(a.dtype == torch.int8 and b.dtype == torch.int8, f"a and b must be int8, got {a.dtype}, {b.dtype}")
    _check(a.ndim == 2 and b.ndim == 2 and a.shape[1] == b.shape[0],
           f"a must be [M, K] and b [K, N], got {tuple(a.shape)} @ {tuple(b.shape)}")
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=torch.int32)
    bm, bn = (32, 32) if interpreted() else (64, 64)
    grid = (triton.cdiv(M, bm), triton.cdiv(N, bn))
    _int8_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                       c.stride(0), c.stride(1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=block_k)
    return c


# ------------------------------------------------------------------------ Int4 GPTQ weights + GEMV
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
# needs every pair of its rows, so this is per thread and per row. Done with tl.load and bit operations
# it was four 4-byte loads through the pipeline's shared memory, their addresses and masks: compiled for
# sm_90 the loop went from 1321 to 1199 instructions per group and 96 to 80 registers, and on the H200
# the 18944 -> 3584 GEMV from 13.7 to 12.4-12.6 us (scripts/gemv_probe.py rounds 4a and 4b).
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
    # first in the same group, they held the codes' loads back by a round trip. One group ahead: 12.5 ->
    # 12.4 us and 13.2 -> 12.9 us on the H200 (scripts/gemv_order_probe.py, round 25).
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
    runs when that path overflowed or its split-K state was misused). Nothing is unrolled: unrolled
    (8 weights of a packed row per step, until round 26), this code, never run, made ptxas compile the
    whole kernel in 64 registers instead of 72 (the 32-column tile, sm_90) and its group loop slower:
    12.5-12.7 against 12.1 us at 18944 -> 3584 on the H200 (scripts/gemv_tail_probe.py)."""
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
    """The shipped split-K fix-up: deterministic, with no fence and one round trip at the end. Each
    program publishes its partial with the lowest mantissa bit replaced by the call's parity (from the
    ticket: bit 16 counts calls) and leaves. The program with the last ticket (the last to start, so
    every other has started and none waits on it: no deadlock) reads the partials until every parity
    is this call's, and sums them with that bit cleared, POLL_ROWS at a time in a fixed order (the same
    bits every run). A partial loses its lowest bit, at most 1 ulp of fp32. The workspace and counters
    must belong to this tile and split alone, so that a slot is never more than one call stale
    (_gemv_state). A partial still missing after MAX_POLLS reads (a misuse, such as two streams sharing
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
def _int4_gemv_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, y_ptr, part_ptr, lock_ptr, K, N,
                      GROUP: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr,
                      F16X2: tl.constexpr, NUM_STAGES: tl.constexpr, ROW_ACC: tl.constexpr,
                      WS_OFF: tl.constexpr, LOCK_OFF: tl.constexpr, POLL_ROWS: tl.constexpr,
                      THREADS: tl.constexpr, SUM_KERNEL: tl.constexpr, PDL: tl.constexpr):
    """WS_OFF / LOCK_OFF: where this tile's own workspace and counters start in part_ptr / lock_ptr;
    THREADS: 32 x num_warps (_gemv_fixup_args). SUM_KERNEL (with SPLIT_K > 1): no fix-up here, the
    partials go to the workspace as [SPLIT_K, N] and _gemv_sum_kernel adds them up; PDL lets it launch
    now, to wait on this grid resident beside it instead of after a launch gap."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    ng = K // GROUP
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    if SUM_KERNEL:                                  # (only with SPLIT_K > 1: _gemv_prune, int4_gemv)
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
def _gemv_sum_kernel(part_ptr, y_ptr, x_ptr, qw_ptr, qz_ptr, s_ptr, K, N, GROUP: tl.constexpr,
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


# (block_n, num_warps, groups per program, NUM_STAGES): block_n = 128 x num_warps gives each thread all
# rows of its 4 columns (16-byte loads, a thread-local sum over rows). Measured on the H100
# (scripts/gemv_probe.py --round 3): 2 groups per program was best at K=3584, 4 at K=18944; split-K past
# ~60 fell off a cliff; NUM_STAGES=2 (the next group's codes copied to shared memory while this one is
# computed) took 0.5-1.3 us off the best configs, 3 stages lost. Since two int32 go to each asm call,
# one stage is slower still (bench_run4.log's sweep: 15.5-23 us against 12.6-15 us with two). On the
# H200 (round 4b, x read 16 bytes per row) one-warp programs with two stages were fastest at both shapes;
# in round 6 two warps splitting the rows of 128 columns (ROW_ACC) were 0.2-0.3 us faster at K=18944.
# All of those were timed hot (one copy of the weights replayed, partly in L2). Cold (round 10) the
# order changed: one stage, 128 columns over two warps, split 7 / 37 was fastest at both shapes (14.1 us
# each on the H200, against 15.5 / 15.8 us for the two-stage configs the hot autotuner had picked).
# Round 11 (gemv_probe_round11_*.md): 64 columns on one warp (rows spread over its lanes, ROW_ACC), 4
# groups per program, one stage, was the fastest tile at both shapes in three cold sweeps on the H200
# (13.1-13.3 us at 3584 -> 18944, 13.4-13.8 us at 18944 -> 3584, against 13.8-14.0 us for the best before);
# 32 columns with 5 groups per program (split 6 / 30) faster still, 12.5 / 13.1 us (rounds 11 and 12).
# Why these: their programs just fit in one wave of resident warps (round 15: 32 columns take 72
# registers, 3696 one-warp programs fit on 132 SMs; split 6 makes 3552, split 7 makes 4144 and is 3 us
# slower). Nothing that left that grid shape beat them (rounds 14-19, scripts/gemv_probe.py and
# scripts/gemv_persistent_probe.py; round 23, programs of 2-8 warps summing their split in registers,
# scripts/gemv_wsplit_probe.py; round 24, a column block's programs as one thread-block cluster summing
# over distributed shared memory, scripts/gemv_cluster_probe.py). The 64-column tile (64, 1, 4, 1) was
# a candidate until 2026-11-24: the autotuner, which times one launch after an L2 flush, picked it at
# 18944 -> 3584 in both of the last benchmarks (bench_round13.md, bench_review.md: 13.4 / 13.6 us cold),
# where 32 columns split 30 timed 13.2 us in every cold sweep (rounds 12, 13, 15, 19); at 3584 -> 18944
# it was 13.0-13.1 us against 12.5-12.6 us for 32 columns split 6.
# Groups per program 0 means "as many programs per column block as fill one wave" (_gemv_one_wave_split):
# 32 columns split 6 at 3584 -> 18944 (3552 programs of the 3696 that fit), split 33 at 18944 -> 3584
# (3696), where the sweep of every split from 25 to 37 put 33 and 28 first, 12.5 us, and 30 (the 5-group
# candidate) at 13.0 us (bench_sweep.log of 2026-11-24, H200). With the tagged fix-up: 28 at 12.3 us, 32 at
# 12.4, 33 at 12.5-12.6 (its partials read in two rounds), 30 at 13.0 (bench_tagged.log, bench_81ea082.log).
# With round 26's lighter exact redo: 28 at 12.1, 32 at 12.2, 30 at 12.3, 33 at 12.5 (bench.log).
_GEMV_CONFIGS = [(512, 4, 2, 2), (512, 4, 4, 2), (256, 2, 2, 2), (256, 2, 4, 2), (128, 1, 2, 2), (128, 2, 4, 1),
                 (128, 2, 4, 2), (512, 4, 4, 1), (256, 2, 2, 1), (128, 1, 2, 1), (32, 1, 5, 1), (32, 1, 0, 1)]
# Which fix-up a candidate gets follows from its split (round 26, bench.md, H200, 32 columns, one warp):
# the sum kernel launched with PDL took 11.5-11.6 us at splits 32-33 of 18944 -> 3584, 11.8 at 28, where
# the in-kernel fix-up took 12.2-12.5; at 3584 -> 18944 (split 5-7) it lost, 11.8 against 11.6 at split 6.
# So: the sum kernel from 16 partials per column (splits 8-24 are unmeasured), with PDL only (without
# it, 12.2 us at split 28, no better). The autotuner is not asked to choose between the two: given both
# as candidates and timing one launch at a time (do_bench), it picked the in-kernel split 30 (12.4 us)
# over the sum kernel at split 32 (11.6 us in the same run's sweep; bench_sum_choice.md). And only the
# tile it was measured on gets it (32 columns, one warp: splits 30 and 32 there). Given to every
# candidate of split 16 or more, the autotuner once picked 128 columns, split 50, two stages with it at
# 18944 -> 3584: 16.0 us cold (bench_sumall.md); given to the one-wave candidate alone, it picked the
# 32-column split 30 with the in-kernel fix-up: 12.4 us (bench_gluon_first.md; 11.6 for split 33 with
# the sum kernel in the same sweep).
_GEMV_SUM_MIN_SPLIT = 16
_GEMV_SUM_TILE = (32, 1)            # (BLOCK_N, num_warps) of the tiles that take the sum kernel
# Registers of the 32-column one-warp tile compiled for sm_90 by Triton 3.6, which size its one-wave split:
# 72 in round 15; with round 25's tagged fix-up and its unrolled exact redo 64 at splits 6 and 28 (72 at 32),
# and 72 at splits 6, 28, 30, 32 and 33 since round 26 (see _gemv_exact). Another compiler or GPU may give another
# count; the candidate is timed like the others anyway.
_GEMV_ONE_WAVE_REGS = 72
_GEMV_SUM_BLOCK = 32      # columns per program of _gemv_sum_kernel (one warp): 32 beat 64 and 128 (round 26)
_GEMV_STATE: dict = {}


def resident_programs(regs: int, warps: int, sms: int, shared: int = 0) -> int:
    """Programs of `warps` warps resident at once on sm_90 (one wave): 64K registers per SM allocated
    256 per warp, at most 64 warps and 32 blocks per SM, and 228 KiB of shared memory (1 KiB of it
    reserved per block)."""
    per_warp = -(-regs * 32 // 256) * 256
    by_smem = 233472 // (shared + 1024) if shared else 32
    return sms * min(32, (65536 // per_warp) // warps, 64 // warps, by_smem)


@functools.lru_cache(maxsize=None)
def _sm_count(device: str) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _gemv_row_acc(block_n: int, num_warps: int) -> bool:
    """ROW_ACC for a tile: one warp's 32 threads x 4 columns cover 128 columns, so a narrower tile
    spreads each group's rows over warps (or threads) and keeps one sum per row."""
    return block_n < 128 * num_warps


def _gemv_split(ng: int, groups_per_program: int) -> int:
    """split-K for a K of ng groups: programs of ~groups_per_program groups, at most 64 of them."""
    return triton.cdiv(ng, max(groups_per_program, triton.cdiv(ng, 64)))


def _gemv_one_wave_split(ng: int, n_blocks: int, num_warps: int, sms: int, reserve: int = 0) -> int:
    """split-K whose programs (n_blocks column blocks x split) just fit in one wave of resident warps,
    with `reserve` programs' room left (the sum kernel's): the fastest GEMV grids on the H200 were those
    (docs/lab05-kernels-gpu.md, round 15). At most ng and 64, at least 1."""
    return max(1, min(ng, 64, (resident_programs(_GEMV_ONE_WAVE_REGS, num_warps, sms) - reserve) // n_blocks))


def _gemv_takes_sum_kernel(split: int, block_n: int, num_warps: int, pdl: bool) -> bool:
    """The fix-up rule: the sum kernel for the measured tile (_GEMV_SUM_TILE) from _GEMV_SUM_MIN_SPLIT
    partials, launched with PDL; the in-kernel fix-up otherwise."""
    return pdl and split >= _GEMV_SUM_MIN_SPLIT and (block_n, num_warps) == _GEMV_SUM_TILE


def _gemv_one_wave_tile_split(ng: int, N: int, block_n: int, num_warps: int, sms: int, pdl: bool) -> int:
    """A tile's one-wave split; where that split gives the tile the sum kernel, the split that leaves room
    in the wave for the sum kernel's programs (one per _GEMV_SUM_BLOCK columns)."""
    split = _gemv_one_wave_split(ng, triton.cdiv(N, block_n), num_warps, sms)
    if _gemv_takes_sum_kernel(split, block_n, num_warps, pdl):
        split = _gemv_one_wave_split(ng, triton.cdiv(N, block_n), num_warps, sms, triton.cdiv(N, _GEMV_SUM_BLOCK))
    return split


def _gemv_fixup_args(block_n: int, num_warps: int, split: int, N: int, ws_off: int = 0, lock_off: int = 0) -> dict:
    """The fix-up's constants for a tile: where its own workspace (split x N words) and counters (one
    per column block) start, and how many partials its last program reads per round trip (POLL_ROWS:
    a power of two, about 32 per thread, so the reads fit in registers)."""
    per_thread = max(1, 32 * 32 * num_warps // block_n)
    poll = min(triton.next_power_of_2(split), triton.next_power_of_2(per_thread))
    return {"WS_OFF": ws_off, "LOCK_OFF": lock_off, "POLL_ROWS": poll, "THREADS": 32 * num_warps}


def _gemv_state_words(block_n: int, split: int, N: int) -> tuple[int, int]:
    """(workspace words, counters) a tile's fix-up needs: none without a split."""
    blocks = triton.cdiv(N, block_n)
    return (blocks * split * block_n, blocks) if split > 1 else (0, 0)


def _gemv_prune(configs, named_args, **kwargs):
    """Turn (block_n, warps, groups per program) into this shape's constant SPLIT_K, without duplicates,
    and give each its own slice of the shape's fix-up state (_gemv_state), one after another."""
    ng, N = named_args["K"] // kwargs.get("GROUP", 128), named_args["N"]
    pdl = gemv_pdl(named_args["x_ptr"])     # the sum kernel from _GEMV_SUM_MIN_SPLIT partials, with PDL only
    seen, out, ws_off, lock_off = set(), [], 0, 0
    for c in configs:
        b, w, gpp = c.kwargs["BLOCK_N"], c.num_warps, c.kwargs["GROUPS_PER_PROGRAM"]
        if gpp:
            split = _gemv_split(ng, gpp)
        else:
            split = _gemv_one_wave_tile_split(ng, N, b, w, _sm_count(str(named_args["x_ptr"].device)), pdl)
        sum_kernel = _gemv_takes_sum_kernel(split, b, w, pdl)
        key = (b, w, split, c.kwargs["NUM_STAGES"], sum_kernel)
        if key not in seen:
            seen.add(key)
            out.append(triton.Config({"BLOCK_N": b, "SPLIT_K": split, "NUM_STAGES": key[3],
                                      "ROW_ACC": _gemv_row_acc(b, w), "SUM_KERNEL": sum_kernel,
                                      **_gemv_fixup_args(b, w, split, N, ws_off, lock_off)},
                                     num_warps=w, num_stages=1))
            words, counters = _gemv_state_words(b, split, N)
            ws_off, lock_off = ws_off + words, lock_off + counters
    return out


def _gemv_sum(work, ws_off: int, y, x, qweight, qzeros, scales, K: int, N: int, group: int, split: int, pdl: bool):
    """Launch _gemv_sum_kernel on a tile's partials (work[ws_off:] as fp32 [split, N]), into y."""
    part = work[ws_off:ws_off + split * N].view(torch.float32)
    _gemv_sum_kernel[(triton.cdiv(N, _GEMV_SUM_BLOCK),)](
        part, y, x, qweight, qzeros, scales, K, N, GROUP=group, SPLIT_K=split, SPLIT_P2=triton.next_power_of_2(split),
        BLOCK=_GEMV_SUM_BLOCK, PDL=pdl, num_warps=1, num_stages=1, **({"launch_pdl": True} if pdl else {}))


def _gemv_sum_after_bench(nargs, exception):
    """The autotuner's post_hook: a candidate that leaves its sum to _gemv_sum_kernel is timed with it."""
    if exception is None and nargs["SUM_KERNEL"]:
        _gemv_sum(nargs["part_ptr"], nargs["WS_OFF"], nargs["y_ptr"],
                  nargs["x_ptr"], nargs["qw_ptr"], nargs["qz_ptr"], nargs["s_ptr"], nargs["K"], nargs["N"],
                  nargs["GROUP"], nargs["SPLIT_K"], nargs["PDL"])


_int4_gemv_tuned = triton.autotune(
    configs=[triton.Config({"BLOCK_N": b, "GROUPS_PER_PROGRAM": gpp, "NUM_STAGES": st}, num_warps=w, num_stages=1)
             for b, w, gpp, st in _GEMV_CONFIGS],
    post_hook=_gemv_sum_after_bench,
    # Timed by Triton's do_bench, which flushes L2 (a 256 MB write) before each call: a decode step reads
    # every layer's weights cold. CUDA-graph replays of one call (used here until round 10) let part of
    # a 34 MB layer stay in a 50 MB L2; they picked two-stage configs that are 1.4-1.7 us slower cold.
    # Timed one launch at a time, it picks one-warp tiles that the benchmark's cold graph replays put
    # 0.2 / 1.1 us behind two-warp ones on the H200; a timer that flushed by reading instead (clean
    # lines) picked the same (bench_cold_reads.md), so Triton's own stays.
    key=["K", "N", "GROUP", "F16X2"],
    prune_configs_by={"early_config_prune": _gemv_prune})(_int4_gemv_kernel)


def _gemv_state(device, key: tuple, sizes) -> tuple[torch.Tensor, torch.Tensor]:
    """The tagged fix-up's workspace (int32, every word's parity bit 1: matched by no call before it is
    written) and counters (zeros), made once per device and key: a shape's autotuned tiles, or one fixed
    tile and split; sizes() gives (words, counters) when they are made. Each tile then only ever sees
    its own slots, at most one call stale. Shared by every stream of the device: int4_gemv calls must
    not run concurrently on two streams (a CUDA graph replays on its own capture stream, one call after
    another, which is fine)."""
    device = torch.device(device)
    key = (str(device),) + key
    if key not in _GEMV_STATE:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("int4_gemv: call it once before capturing a CUDA graph (its split-K "
                               "state, and its autotuning, must be made outside the graph)")
        words, counters = sizes()
        _GEMV_STATE[key] = (torch.ones(max(words, 1), dtype=torch.int32, device=device),
                            torch.zeros(max(counters, 1), dtype=torch.int32, device=device))
    return _GEMV_STATE[key]


def gemv_hopper_tile(ng: int, N: int, sms: int, pdl: bool) -> dict:
    """The Int4 GEMV tile an sm_90 GPU gets by default (f16x2 dequant): 32 columns on one warp, one
    stage, the one-wave split of ng groups (with room for the sum kernel's programs when it takes it),
    and the fix-up that split calls for (the sum kernel from _GEMV_SUM_MIN_SPLIT partials, with PDL).
    Measured: the fastest tile at both of Qwen2.5-7B's MLP shapes in every cold sweep on the H200 since
    round 26 (11.6 us each). The autotuner, which times one launch at a time after an L2 flush, picked a
    slower one in three of the last five benchmarks there (bench_sumall.md, bench_gluon_first.md,
    bench_autotune_miss.md: 12.4-16.0 us at 18944 -> 3584), so on sm_90 the measured tile is the default."""
    block_n, num_warps = _GEMV_SUM_TILE
    split = _gemv_one_wave_tile_split(ng, N, block_n, num_warps, sms, pdl)
    return {"block_n": block_n, "num_warps": num_warps, "num_stages": 1, "split_k": split,
            "fixup": "sum kernel" if _gemv_takes_sum_kernel(split, block_n, num_warps, pdl) else "in-kernel"}


def int4_gemv_dequant(x: torch.Tensor) -> str:
    """Which dequant int4_gemv runs for x: "f16x2" (two weights per instruction, inline PTX, fp16 x on an
    NVIDIA GPU) or "f32" (exact fp32 dequant: the interpreter, ROCm, bf16/fp32 activations)."""
    nvidia = x.device.type == "cuda" and torch.version.hip is None and not interpreted()
    return "f16x2" if nvidia and x.dtype == torch.float16 else "f32"


def gemv_pdl(x: torch.Tensor) -> bool:
    """Whether int4_gemv launches its sum kernel with programmatic dependent launch: an NVIDIA GPU of
    sm_90 or later (Hopper), compiled (not the interpreter), and a Triton that has griddepcontrol."""
    return (x.device.type == "cuda" and torch.version.hip is None and not interpreted() and gdc_wait is not None
            and torch.cuda.get_device_capability(x.device) >= (9, 0))


def int4_gemv_default_tile(x: torch.Tensor, K: int, N: int, group_size: int, dequant: str) -> dict | None:
    """The fixed tile int4_gemv takes when block_n and split_k are left None: gemv_hopper_tile on an
    sm_90 GPU with the f16x2 dequant; None (autotuned) elsewhere."""
    if dequant != "f16x2" or torch.version.hip is not None or torch.cuda.get_device_capability(x.device) != (9, 0):
        return None
    return gemv_hopper_tile(K // group_size, N, _sm_count(str(x.device)), gemv_pdl(x))


GEMV_FIXUPS = ("in-kernel", "sum kernel")


def int4_gemv(x: torch.Tensor, qweight, qzeros, scales, group_size: int = 128,
              block_n: int | None = None, split_k: int | None = None, num_warps: int = 4,
              dequant: str | None = None, num_stages: int = 2, fixup: str | None = None) -> torch.Tensor:
    """y [1, N] = x [1, K] @ dequant(W), the weights dequantized inside the kernel (the decode step).

    Per group and column: sum_k (q - z) x_k, times the group's scale, accumulated in fp32; split over K,
    the partials summed in a fixed order (the same bits every run) by one of two fix-ups (GEMV_FIXUPS):
    "in-kernel" (the last program of a column block sums them) or "sum kernel" (a second kernel does,
    launched with PDL on sm_90+, gemv_pdl). Autotuned calls take the fix-up that their tile's split
    calls for (_GEMV_SUM_MIN_SPLIT); with block_n and split_k given, fixup picks it (default
    "in-kernel"). dequant "f32" is exact; "f16x2" (the default for fp16 x on
    NVIDIA, int4_gemv_dequant) rounds each product and 8-term sum to fp16, about 2^-11 relative, and
    redoes a column block in "f32" if fp16 overflowed. On an sm_90 GPU with the f16x2 dequant, block_n
    and split_k left None take the measured tile (gemv_hopper_tile); on other GPUs they, with num_warps,
    are autotuned per shape. Give block_n and split_k to fix them (and num_stages, how many groups of
    codes are in flight per program; the interpreter ignores it). Call it once (per shape and tile)
    before capturing it in a CUDA graph: autotuning and the fix-up's state are made outside the graph.
    Not on two streams at once: calls of one shape share that state (_gemv_state).
    """
    _check(x.ndim == 2 and x.shape[0] == 1, f"x must be [1, K] (batch 1 decode), got {tuple(x.shape)}")
    K, N = qweight.shape[0] * 8, qweight.shape[1]
    _check(x.shape[1] == K, f"x has K={x.shape[1]} but qweight packs K={K}")
    _check(qweight.dtype == torch.int32 and qzeros.dtype == torch.int32,
           "qweight and qzeros must be int32 (GPTQ packing)")
    _check(group_size >= 8 and group_size & (group_size - 1) == 0,
           f"group_size must be a power of two of at least 8 (GPTQ uses 32, 64, 128), got {group_size}")
    _check(K % group_size == 0 and scales.shape == (K // group_size, N),
           f"scales must be [K/group_size, N] = {(K // group_size, N)}, got {tuple(scales.shape)}")
    _check(N % 8 == 0 and qzeros.shape == (K // group_size, N // 8),
           f"qzeros must be [K/group_size, N/8] = {(K // group_size, N // 8)}, got {tuple(qzeros.shape)}")
    auto = int4_gemv_dequant(x)
    dequant = dequant or auto
    _check(isinstance(num_stages, int) and num_stages >= 1, f"num_stages must be an int >= 1, got {num_stages!r}")
    _check(dequant in ("f32", "f16x2") and (dequant == "f32" or auto == "f16x2"),
           f"dequant must be 'f32', or 'f16x2' for fp16 x on an NVIDIA GPU (here: {auto!r}), got {dequant!r}")
    _check(dequant == "f32" or group_size >= 16,      # f16x2 takes two packed rows per asm call
           f"the f16x2 dequant needs group_size >= 16, got {group_size}: pass dequant='f32'")
    fixed = interpreted() or block_n is not None or split_k is not None
    _check(fixup is None or (fixup in GEMV_FIXUPS and fixed),
           f"fixup must be one of {GEMV_FIXUPS}, given with block_n and split_k (autotuned calls choose their "
           f"own), got {fixup!r}")
    tile = None if fixed else int4_gemv_default_tile(x, K, N, group_size, dequant)
    if tile is not None:
        block_n, split_k, num_warps, num_stages, fixup = (tile[k] for k in ("block_n", "split_k", "num_warps",
                                                                             "num_stages", "fixup"))
        fixed = True
    x, qweight, qzeros, scales = (t.contiguous() for t in (x, qweight, qzeros, scales))
    if x.data_ptr() % 16:
        x = x.clone()                             # f16x2 reads x 16 bytes at a time: 16-byte aligned
    y = torch.empty((N,), device=x.device, dtype=x.dtype)
    ng = K // group_size
    f16x2 = dequant == "f16x2"
    pdl = gemv_pdl(x)
    if fixed:
        block_n = block_n or (32 if interpreted() else 256)
        split_k = max(1, min(split_k or 1, ng))
        sum_kernel = fixup == "sum kernel" and split_k > 1
        # the sum kernel's partials are plain floats: never in a workspace the tagged fix-up reads
        work, locks = _gemv_state(x.device, ("fixed", N, block_n, split_k) + (("sum kernel",) if sum_kernel else ()),
                                  lambda: _gemv_state_words(block_n, split_k, N))
        _int4_gemv_kernel[(triton.cdiv(N, block_n), split_k)](
            x, qweight, qzeros, scales, y, work, locks, K, N, GROUP=group_size, BLOCK_N=block_n, SPLIT_K=split_k,
            F16X2=f16x2, NUM_STAGES=num_stages, ROW_ACC=_gemv_row_acc(block_n, num_warps),
            **_gemv_fixup_args(block_n, num_warps, split_k, N), SUM_KERNEL=sum_kernel, PDL=pdl,
            num_warps=num_warps, num_stages=1)
        if sum_kernel:
            _gemv_sum(work, 0, y, x, qweight, qzeros, scales, K, N, group_size, split_k, pdl)
    else:   # one state for all of this shape's candidates, each its own slice of it (_gemv_prune)
        def sizes():
            tiles = _gemv_prune(_int4_gemv_tuned.configs, {"K": K, "N": N, "x_ptr": x}, GROUP=group_size)
            each = [_gemv_state_words(c.kwargs["BLOCK_N"], c.kwargs["SPLIT_K"], N) for c in tiles]
            return sum(w for w, _ in each), sum(c for _, c in each)
        work, locks = _gemv_state(x.device, ("tuned", K, N, group_size), sizes)
        grid = lambda m: (triton.cdiv(N, m["BLOCK_N"]), m["SPLIT_K"])  # noqa: E731
        _int4_gemv_tuned[grid](x, qweight, qzeros, scales, y, work, locks, K, N, GROUP=group_size, F16X2=f16x2,
                               PDL=pdl)
        best = _int4_gemv_tuned.best_config.kwargs
        if best["SUM_KERNEL"]:
            _gemv_sum(work, best["WS_OFF"], y, x, qweight, qzeros, scales, K, N, group_size, best["SPLIT_K"], pdl)
    return y.reshape(1, N)


# ------------------------------------------------------------------------ the read floor
@triton.jit
def _stream_read_kernel(q_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    q = tl.load(q_ptr + offs, mask=offs < n, other=0, eviction_policy="evict_first")
    tl.store(out_ptr + tl.program_id(0), tl.xor_sum(q, axis=0))


def stream_read(t: torch.Tensor, block: int = 4096) -> torch.Tensor:
    """Read every 32-bit word of t once and do nothing else: what a memory-bound kernel that moves the
    same bytes can hope for on this device (the copy bandwidth also writes). Each program xors `block`
    words (so the reads are not optimized away) and the int32 xors are returned, one per block. On the
    H200, 34 MB of Int4 codes read this way, cold, took 9.0 us: 88-90 % of the copy bandwidth
    (docs/lab05-kernels-gpu.md)."""
    _check(t.is_contiguous() and (t.numel() * t.element_size()) % 4 == 0 and t.data_ptr() % 4 == 0,
           f"stream_read needs a contiguous tensor whose bytes are a multiple of 4 bytes, 4-byte aligned; "
           f"got {tuple(t.shape)} {t.dtype}")
    _check(block >= 16 and block & (block - 1) == 0, f"block must be a power of two >= 16, got {block}")
    words = t.reshape(-1).view(torch.uint8).view(torch.int32)
    out = torch.empty(triton.cdiv(words.numel(), block), device=t.device, dtype=torch.int32)
    _stream_read_kernel[(out.numel(),)](words, out, words.numel(), BLOCK=block, num_warps=4)
    return out

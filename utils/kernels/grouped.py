"""The grouped GEMM: out[offs[g-1]:offs[g]] = a[offs[g-1]:offs[g]] @ b[g] for every group, in one launch.

Every group's rows lie in ONE buffer A[sum M_g, K] with int32 end offsets (as torch._grouped_mm takes
them), weights B[G, K, N]: no array of pointers, so the pointer kernel also runs in the interpreter.
Three kernels (GROUPED_KERNELS, fastest first): "gluon" (warp-specialized, grouped_gluon.py, sm_90),
"tma" (Triton, TMA descriptors, sm_90+) and "pointers" (Triton, everywhere). docs/kernels.md has the
measurements behind that order.
"""
from __future__ import annotations

import importlib
import warnings

import torch
import triton
import triton.language as tl

from .common import cache, fits_shared_memory, gpu_configs, interpreted, precision, require, small_config, tile_of


@triton.jit
def _group_rows(group_ends_ptr, g):
    """(first row, number of rows) of group g, from the int32 cumulative row ends (grouped_matmul's offs)."""
    start = tl.load(group_ends_ptr + g - 1, mask=g > 0, other=0)
    return start, tl.load(group_ends_ptr + g) - start


@triton.jit
def _grouped_kernel(a_ptr, b_ptr, c_ptr, group_ends_ptr, N, K,
                    stride_am, stride_ak, stride_bg, stride_bk, stride_bn, stride_cm, stride_cn,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP_M: tl.constexpr, PRECISION: tl.constexpr):
    # grid axis 1 is the group, axis 0 a tile of it (sized for the largest group)
    g = tl.program_id(1)
    start, Mg = _group_rows(group_ends_ptr, g)
    pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(Mg, BLOCK_M), tl.cdiv(N, BLOCK_N)
    if pid < num_m * num_n:                      # programs past this group's tiles do nothing
        pid_m, pid_n = tile_of(pid, num_m, num_n, GROUP_M)
        # the tile's rows of A (inside group g), columns of B[g], first k-block
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        rows = start + tl.minimum(offs_m, Mg - 1)     # clamp inside the group (masked on store)
        a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak
        b_ptrs = b_ptr + g * stride_bg + offs_k[:, None] * stride_bk + (offs_n % N)[None, :] * stride_bn
        # walk K one block at a time (the k tail is loaded as zeros)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            kmask = offs_k < K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=kmask[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=kmask[:, None], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        # store only the group's rows
        mask = (offs_m < Mg)[:, None] & (offs_n < N)[None, :]
        tl.store(c_ptr + (start + offs_m)[:, None] * stride_cm + offs_n[None, :] * stride_cn,
                 acc.to(c_ptr.dtype.element_ty), mask=mask)


_grouped_tuned = triton.autotune(configs=gpu_configs(), key=["N", "K"],
                                 prune_configs_by={"early_config_prune": fits_shared_memory})(_grouped_kernel)


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
def _grouped_tma_kernel(a_desc, b_desc, c_ptr, group_ends_ptr, N, K, stride_cm, stride_cn, MAX_ROWS,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr):
    """The grouped GEMM with A and B read through TMA descriptors (Hopper's bulk tensor copy engine).
    A tile may read rows past its group's end (the next group's, or TMA's zero fill): they are never
    stored. B is viewed as [G*K, N], so K must be a multiple of BLOCK_K (the wrapper checks)."""
    g = tl.program_id(1)
    start, Mg = _group_rows(group_ends_ptr, g)
    pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(Mg, BLOCK_M), tl.cdiv(N, BLOCK_N)
    if pid < num_m * num_n:
        pid_m, pid_n = tile_of(pid, num_m, num_n, GROUP_M)
        acc = _tma_tile_acc(a_desc, b_desc, start, g, pid_m, pid_n, K, BLOCK_M, BLOCK_N, BLOCK_K)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (offs_m < Mg)[:, None] & (offs_n < N)[None, :]
        tl.store(c_ptr + (start + offs_m)[:, None] * stride_cm + offs_n[None, :] * stride_cn,
                 acc.to(c_ptr.dtype.element_ty), mask=mask)


def _tma_block_shapes(nargs):
    """Autotune pre-hook: each config's tile is the descriptors' block shape."""
    nargs["a_desc"].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_K"]]
    nargs["b_desc"].block_shape = [nargs["BLOCK_K"], nargs["BLOCK_N"]]


# 128 x 256 x 64 won at 8 x 512 and 8 x 2048 rows (docs/kernels.md); the others stay for other shapes.
_grouped_tma_tuned = triton.autotune(
    configs=[triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=st,
                           num_warps=w, pre_hook=_tma_block_shapes)
             for bm, bn, st, w in [(128, 256, 3, 8), (128, 256, 4, 8), (256, 128, 4, 8), (128, 128, 4, 4)]],
    key=["N", "K", "MAX_ROWS"])(_grouped_tma_kernel)


GROUPED_KERNELS = ("gluon", "tma", "pointers")


def _why_not_tma(a: torch.Tensor, b: torch.Tensor) -> str | None:
    """Why the TMA kernel cannot take these operands (None: it can): an NVIDIA GPU of compute capability
    9+, 16-bit data, K a multiple of 64, N of 8, contiguous 16-byte-aligned operands, some rows."""
    if interpreted() or a.device.type != "cuda" or torch.version.hip is not None:
        return "it needs an NVIDIA GPU (not the interpreter, not ROCm)"
    if cache.device_info(a.device)["capability"][0] < 9:
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
    """Why the warp-specialized Gluon kernel (grouped_gluon.py) cannot run here (None: it can): the
    TMA kernel's conditions (why_not_tma, _why_not_tma's answer for the same operands), wgmma (sm_90
    exactly), and a Triton with Gluon."""
    why = why_not_tma
    if why is None and cache.device_info(a.device)["capability"] != (9, 0):
        why = "it needs an sm_90 GPU (Hopper's wgmma)"
    if why is None:
        try:
            importlib.import_module(".grouped_gluon", __package__)
        except ImportError as exc:
            why = f"this Triton has no usable Gluon ({exc}); Triton 3.5 or newer has it"
    if why is None and cache.gluon_failure:
        why = f"it failed here before: {cache.gluon_failure}"
    return why


def _grouped_refusals(a: torch.Tensor, b: torch.Tensor) -> dict:
    """Each grouped kernel -> why it cannot run on a and b (None: it can)."""
    why_not_tma = _why_not_tma(a, b)
    return {"gluon": _why_not_gluon(a, why_not_tma), "tma": why_not_tma, "pointers": None}


def grouped_kernel(a: torch.Tensor, b: torch.Tensor, kernel: str = "auto") -> str:
    """Which grouped GEMM kernel grouped_matmul runs on a and b: "gluon" (warp-specialized, Hopper),
    "tma" (Triton, TMA loads) or "pointers" (Triton, pointer loads; everywhere, the interpreter too).
    "auto" is the first of those that can run; a named one that cannot raises ValueError saying why."""
    require(kernel in ("auto",) + GROUPED_KERNELS, f"kernel must be 'auto' or one of {GROUPED_KERNELS}, got {kernel!r}")
    if kernel == "auto":
        return grouped_kernels_here(a, b)[0]
    why = _grouped_refusals(a, b)[kernel]
    require(why is None, f"the {kernel} grouped GEMM cannot run here: {why}; kernel='auto' picks one that can")
    return kernel


def grouped_kernels_here(a: torch.Tensor, b: torch.Tensor) -> list[str]:
    """Every grouped GEMM kernel that can run on a and b, fastest first (GROUPED_KERNELS' order)."""
    why = _grouped_refusals(a, b)
    return [k for k in GROUPED_KERNELS if why[k] is None]


def group_offsets(sizes: list[int], device="cpu") -> torch.Tensor:
    """int32 end offsets of groups of `sizes` rows laid one after another (torch._grouped_mm's offs)."""
    require(all(int(s) >= 0 for s in sizes) and len(sizes) > 0, f"group sizes must be >= 0, got {sizes}")
    return torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)


def grouped_matmul(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, max_rows: int | None = None,
                   config: dict | None = None, kernel: str = "auto", input_precision: str | None = None) -> torch.Tensor:
    """out[offs[g-1]:offs[g]] = a[offs[g-1]:offs[g]] @ b[g] for every group g, in one launch.

    a: [sum M_g, K]; b: [G, K, N]; offs: int32 [G] cumulative row ends. max_rows (the largest
    group) sizes the grid; given, it saves reading offs back to the host. kernel: "auto" (the fastest
    that runs here), "gluon" (warp-specialized, grouped_gluon.py: an sm_90 GPU, 16-bit data, K % 64 ==
    0), "tma" (Triton with TMA loads: compute capability 9+, the same operands) or "pointers" (anywhere);
    grouped_kernel says which and why not. A fixed config (Triton tile keys, as in matmul) runs the
    pointer kernel. input_precision as in matmul (None is "ieee", common.precision says why).
    """
    require(a.ndim == 2 and b.ndim == 3 and a.shape[1] == b.shape[1],
            f"a must be [rows, K] and b [G, K, N] with the same K, got {tuple(a.shape)} and {tuple(b.shape)}")
    require(offs.ndim == 1 and offs.shape[0] == b.shape[0] and offs.dtype == torch.int32,
            f"offs must be int32 of length G={b.shape[0]} (cumulative row ends), got {offs.dtype} {tuple(offs.shape)}")
    require(a.dtype == b.dtype and a.dtype in (torch.float16, torch.bfloat16, torch.float32),
            f"a and b must share dtype fp16, bf16 or fp32, got {a.dtype}, {b.dtype}")
    prec = precision(input_precision)
    if interpreted():
        require(a.dtype != torch.bfloat16, "bfloat16 does not run under TRITON_INTERPRET=1 (numpy has no bf16)")
    require(config is None or kernel in ("auto", "pointers"),
            f"a fixed config runs the pointer kernel: pass kernel='auto' or 'pointers', not {kernel!r}")
    path = "pointers" if config is not None else grouped_kernel(a, b, kernel)
    G, K, N = b.shape
    if max_rows is None:
        o = offs.cpu().long()
        require(int(o[-1]) == a.shape[0] and bool((o[1:] >= o[:-1]).all()) and int(o[0]) >= 0,
                f"offs must be non-decreasing and end at a.shape[0]={a.shape[0]}, got {o.tolist()}")
        max_rows = int(torch.diff(o, prepend=o.new_zeros(1)).max())
    if path == "gluon":
        from . import grouped_gluon
        try:
            return grouped_gluon.grouped_matmul_ws(a, b, offs, max_rows)
        except Exception as exc:  # noqa: BLE001 - a Triton whose Gluon differs: say so once, use the TMA kernel
            if kernel == "gluon" or isinstance(exc, torch.cuda.OutOfMemoryError):
                raise
            cache.gluon_failure = f"{type(exc).__name__}: {str(exc)[:200]}"
            warnings.warn(f"the Gluon grouped GEMM failed here ({cache.gluon_failure}); using the TMA kernel "
                          "from now on (kernels.cache.reset() tries it again)")
            path = "tma"
    c = torch.empty((a.shape[0], N), device=a.device, dtype=a.dtype)
    args = (a, b, c, offs, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2),
            c.stride(0), c.stride(1))
    if interpreted() or config is not None:
        cfg = dict(config or small_config())
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



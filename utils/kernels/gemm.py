"""The tiled GEMM (fp16 / bf16 / fp32, row-major A[M, K] @ B[K, N]) and the int8 GEMM with an int32
accumulator: Triton's matmul tutorial, small enough to read, so that Lab 05 measures code it can open."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import fits_shared_memory, gpu_configs, interpreted, precision, require, small_config, tile_of


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                   stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,  # elements to the next row/col
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, PRECISION: tl.constexpr, ACC_FP16: tl.constexpr):
    # which [BLOCK_M, BLOCK_N] tile of C this program computes (grouped order, for L2 reuse of B)
    pid_m, pid_n = tile_of(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    # the tile's rows of A, columns of B, and the first k-block; rows/cols past M/N wrap (masked on store)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_m % M)[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + (offs_n % N)[None, :] * stride_bn
    # walk K one block at a time, accumulating A-block @ B-block (the k tail is loaded as zeros)
    if ACC_FP16:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float16)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kmask = offs_k < K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=kmask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=kmask[:, None], other=0.0)
        if ACC_FP16:
            acc = tl.dot(a, b, acc, out_dtype=tl.float16)
        else:
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    # round to C's dtype and store the part of the tile inside C
    c = acc.to(c_ptr.dtype.element_ty)
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, c, mask=mask)


_matmul_tuned = triton.autotune(configs=gpu_configs(), key=["M", "N", "K"],
                                prune_configs_by={"early_config_prune": fits_shared_memory})(_matmul_kernel)


def matmul_tuned_config():
    """The config the GEMM autotuner chose for the last autotuned matmul (None before one ran)."""
    return getattr(_matmul_tuned, "best_config", None)


def matmul(a: torch.Tensor, b: torch.Tensor, input_precision: str | None = None,
           acc_dtype: torch.dtype = torch.float32, config: dict | None = None) -> torch.Tensor:
    """C = A @ B in A's dtype (fp16, bf16 or fp32), accumulated in fp32 (or fp16 for fp16 inputs).

    input_precision is how tl.dot treats fp32 inputs: "tf32" (10-bit mantissa), "tf32x3" (three
    tf32 products, about fp32 accuracy) or "ieee"; None means "ieee" for fp32, ignored for 16-bit.
    config fixes the tile (keys BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages) instead of
    autotuning; the interpreter always uses small fixed tiles.
    """
    require(a.ndim == 2 and b.ndim == 2 and a.shape[1] == b.shape[0],
            f"a and b must be 2-D with a.shape[1] == b.shape[0], got {tuple(a.shape)} @ {tuple(b.shape)}")
    require(a.dtype == b.dtype and a.dtype in (torch.float16, torch.bfloat16, torch.float32),
            f"a and b must share dtype fp16, bf16 or fp32, got {a.dtype}, {b.dtype}")
    prec = precision(input_precision)
    require(acc_dtype in (torch.float32, torch.float16) and (acc_dtype == torch.float32 or a.dtype == torch.float16),
            "acc_dtype must be torch.float32, or torch.float16 with fp16 inputs")
    require(a.device == b.device, f"a is on {a.device}, b on {b.device}: put both on one device")
    if interpreted():
        require(a.dtype != torch.bfloat16, "bfloat16 does not run under TRITON_INTERPRET=1 (numpy has no bf16)")
        require(a.device.type == "cpu", "under TRITON_INTERPRET=1 the tensors must be on the CPU")
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    args = (a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    if interpreted() or config is not None:
        cfg = dict(config or small_config())
        kw = {k: cfg.pop(k) for k in ("num_warps", "num_stages") if k in cfg}
        grid = (triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"]),)
        _matmul_kernel[grid](*args, PRECISION=prec, ACC_FP16=acc_dtype == torch.float16, **cfg, **kw)
    else:
        grid = lambda m: (triton.cdiv(M, m["BLOCK_M"]) * triton.cdiv(N, m["BLOCK_N"]),)  # noqa: E731
        _matmul_tuned[grid](*args, PRECISION=prec, ACC_FP16=acc_dtype == torch.float16)
    return c


@triton.jit
def _int8_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                 stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_m % M)[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + (offs_n % N)[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kmask = offs_k < K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=kmask[None, :], other=0)
        b = tl.load(b_ptrs, mask=kmask[:, None], other=0)
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)  # int8 x int8 -> int32 accumulator
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc, mask=mask)


def int8_matmul(a: torch.Tensor, b: torch.Tensor, block_k: int = 128) -> torch.Tensor:
    """int32 C = A @ B for int8 A [M, K], B [K, N], accumulated in int32 by tl.dot (what it does past
    the int32 range is what Lab 05 measures)."""
    require(a.dtype == torch.int8 and b.dtype == torch.int8, f"a and b must be int8, got {a.dtype}, {b.dtype}")
    require(a.ndim == 2 and b.ndim == 2 and a.shape[1] == b.shape[0],
            f"a must be [M, K] and b [K, N], got {tuple(a.shape)} @ {tuple(b.shape)}")
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=torch.int32)
    bm, bn = (32, 32) if interpreted() else (64, 64)
    grid = (triton.cdiv(M, bm), triton.cdiv(N, bn))
    _int8_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                       c.stride(0), c.stride(1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=block_k)
    return c

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

import os

import torch
import triton
import triton.language as tl

from . import gptq

INPUT_PRECISIONS = ("tf32", "tf32x3", "ieee")


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
    _check(input_precision is None or input_precision in INPUT_PRECISIONS,
           f"input_precision must be one of {INPUT_PRECISIONS} or None, got {input_precision!r}")
    _check(acc_dtype in (torch.float32, torch.float16) and (acc_dtype == torch.float32 or a.dtype == torch.float16),
           "acc_dtype must be torch.float32, or torch.float16 with fp16 inputs")
    _check(a.device == b.device, f"a is on {a.device}, b on {b.device}: put both on one device")
    if interpreted():
        _check(a.dtype != torch.bfloat16, "bfloat16 does not run under TRITON_INTERPRET=1 (numpy has no bf16)")
        _check(a.device.type == "cpu", "under TRITON_INTERPRET=1 the tensors must be on the CPU")
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    prec = input_precision or "ieee"
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
def _grouped_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, N, K, sam, sak, sbg, sbk, sbn, scm, scn,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP_M: tl.constexpr):
    g = tl.program_id(1)
    start = tl.load(offs_ptr + g - 1, mask=g > 0, other=0)
    end = tl.load(offs_ptr + g)
    Mg = end - start
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
            acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K * sak
            b_ptrs += BLOCK_K * sbk
        mask = (rm < Mg)[:, None] & (rn < N)[None, :]
        tl.store(c_ptr + (start + rm)[:, None] * scm + rn[None, :] * scn,
                 acc.to(c_ptr.dtype.element_ty), mask=mask)


_grouped_tuned = triton.autotune(configs=_gpu_configs(None), key=["N", "K"],
                                 prune_configs_by={"early_config_prune": _fits_shared_memory})(_grouped_kernel)


def group_offsets(sizes: list[int], device="cpu") -> torch.Tensor:
    """int32 end offsets of groups of `sizes` rows laid one after another (torch._grouped_mm's offs)."""
    _check(all(int(s) >= 0 for s in sizes) and len(sizes) > 0, f"group sizes must be >= 0, got {sizes}")
    return torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)


def grouped_matmul(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, max_rows: int | None = None,
                   config: dict | None = None) -> torch.Tensor:
    """out[offs[g-1]:offs[g]] = a[offs[g-1]:offs[g]] @ b[g] for every group g, in one launch.

    a: [sum M_g, K]; b: [G, K, N]; offs: int32 [G] cumulative row ends. max_rows (the largest
    group) sizes the grid; given, it saves reading offs back to the host.
    """
    _check(a.ndim == 2 and b.ndim == 3 and a.shape[1] == b.shape[1],
           f"a must be [rows, K] and b [G, K, N] with the same K, got {tuple(a.shape)} and {tuple(b.shape)}")
    _check(offs.ndim == 1 and offs.shape[0] == b.shape[0] and offs.dtype == torch.int32,
           f"offs must be int32 of length G={b.shape[0]} (cumulative row ends), got {offs.dtype} {tuple(offs.shape)}")
    _check(a.dtype == b.dtype and a.dtype in (torch.float16, torch.bfloat16, torch.float32),
           f"a and b must share dtype fp16, bf16 or fp32, got {a.dtype}, {b.dtype}")
    if interpreted():
        _check(a.dtype != torch.bfloat16, "bfloat16 does not run under TRITON_INTERPRET=1 (numpy has no bf16)")
    G, K, N = b.shape
    if max_rows is None:
        o = offs.cpu().long()
        _check(int(o[-1]) == a.shape[0] and bool((o[1:] >= o[:-1]).all()) and int(o[0]) >= 0,
               f"offs must be non-decreasing and end at a.shape[0]={a.shape[0]}, got {o.tolist()}")
        max_rows = int(torch.diff(o, prepend=o.new_zeros(1)).max())
    c = torch.empty((a.shape[0], N), device=a.device, dtype=a.dtype)
    args = (a, b, c, offs, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2),
            c.stride(0), c.stride(1))
    if interpreted() or config is not None:
        cfg = dict(config or _small_config(max_rows, N, K))
        kw = {k: cfg.pop(k) for k in ("num_warps", "num_stages") if k in cfg}
        grid = (triton.cdiv(max(max_rows, 1), cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"]), G)
        _grouped_kernel[grid](*args, **cfg, **kw)
    else:
        grid = lambda m: (triton.cdiv(max(max_rows, 1), m["BLOCK_M"]) * triton.cdiv(N, m["BLOCK_N"]), G)  # noqa: E731
        _grouped_tuned[grid](*args)
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
def pack_gptq_int4(w: torch.Tensor, group_size: int = 128):
    """Quantize w [K, N] (y = x @ w) to GPTQ v1 Int4, symmetric (the course's sym=True): per group of K
    and column, s = 2 max|w| / 15 and zero 8; returns (qweight int32 [K/8, N], qzeros int32 [K/g, N/8]
    holding zero - 1 = 7, scales fp16 [K/g, N]). Round-to-nearest here (GPTQ proper chooses the codes
    with second-order information; the layout is the same, packed by utils.gptq.pack_int32)."""
    K, N = w.shape
    _check(K % group_size == 0 and group_size % 8 == 0 and N % 8 == 0,
           f"need K % group_size == 0, group_size % 8 == 0, N % 8 == 0; got K={K}, N={N}, group_size={group_size}")
    wg = w.detach().float().cpu().reshape(K // group_size, group_size, N)
    scales = (wg.abs().amax(1).clamp(min=1e-8) * 2 / 15).half()
    s = scales.float()
    zeros = torch.full_like(s, 8, dtype=torch.int32)
    q = torch.clamp(torch.round(wg / s[:, None, :]) + 8, 0, 15).to(torch.int32).reshape(K, N)
    qweight = gptq.pack_int32(q, bits=4, dim=0)
    qzeros = gptq.pack_int32((zeros - 1) & 0xF, bits=4, dim=1)   # v1 stores zero - 1 (as a nibble)
    return qweight.to(w.device), qzeros.to(w.device), scales.to(w.device)


def dequant_gptq_int4(qweight, qzeros, scales, group_size: int = 128) -> torch.Tensor:
    """The reference: fp32 weights [K, N] = (q - (z + 1)) * s from the GPTQ v1 layout (utils.gptq's
    unpacker, with the scales in fp32 so the product is not rounded to fp16)."""
    return gptq.dequantize(qweight, qzeros, scales.float(), group_size=group_size).t()


@triton.jit
def _int4_gemv_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, y_ptr, K, N,
                      GROUP: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr):
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    r8 = tl.arange(0, GROUP // 8)                # the packed rows of one quantization group
    acc = tl.zeros((GROUP // 8, BLOCK_N), dtype=tl.float32)   # reduced over rows once, at the end
    for g in range(pid_k, K // GROUP, SPLIT_K):  # one group per step
        q = tl.load(qw_ptr + (g * (GROUP // 8) + r8)[:, None] * N + rn[None, :], mask=nmask[None, :], other=0)
        qh = q >> 16                             # nibbles 4..7 moved to bits 0..15
        zp = tl.load(qz_ptr + g * (N // 8) + rn // 8, mask=nmask, other=0)
        z = (((zp >> ((rn % 8) * 4)) & 0xF) + 1).to(tl.float32)
        s = tl.load(s_ptr + g * N + rn, mask=nmask, other=0.0).to(tl.float32)
        xg = x_ptr + g * GROUP + r8 * 8
        part = tl.zeros((GROUP // 8, BLOCK_N), dtype=tl.float32)
        for j in tl.static_range(4):
            # nibble j kept in place: (q & 0xF<<4j) | bits of 2^23, read as fp32, is exactly 2^23 + n 2^4j
            # (no shift, no slow int->float); the 2^4j goes into x instead
            m = 0xF << (4 * j)
            w0 = ((q & m) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
            w1 = ((qh & m) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
            x0 = tl.load(xg + j).to(tl.float32) * (1.0 / (1 << (4 * j)))
            x1 = tl.load(xg + j + 4).to(tl.float32) * (1.0 / (1 << (4 * j)))
            part += w0 * x0[:, None] + w1 * x1[:, None]
        xs = tl.sum(tl.load(x_ptr + g * GROUP + tl.arange(0, GROUP)).to(tl.float32), axis=0)
        acc += (part - (z * xs)[None, :] / (GROUP // 8)) * s[None, :]   # zero point: z * sum_k x_k
    y = tl.sum(acc, axis=0)
    if SPLIT_K == 1:
        tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=nmask)
    else:
        tl.atomic_add(y_ptr + rn, y, mask=nmask, sem="relaxed")


@triton.jit
def _int4_gemv_rows_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, y_ptr, K, N,
                           GROUP: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr):
    """The other layout: each thread owns columns and walks down K itself, so x is a scalar (the same
    for every thread) and nothing is reduced across threads."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for g in range(pid_k, K // GROUP, SPLIT_K):
        zp = tl.load(qz_ptr + g * (N // 8) + rn // 8, mask=nmask, other=0)
        z = (((zp >> ((rn % 8) * 4)) & 0xF) + 1).to(tl.float32)
        s = tl.load(s_ptr + g * N + rn, mask=nmask, other=0.0).to(tl.float32)
        part = tl.zeros((BLOCK_N,), dtype=tl.float32)
        xs = 0.0
        for r in tl.static_range(GROUP // 8):
            q = tl.load(qw_ptr + (g * (GROUP // 8) + r) * N + rn, mask=nmask, other=0)
            for j in tl.static_range(8):
                xk = tl.load(x_ptr + g * GROUP + r * 8 + j).to(tl.float32)
                w = (((q >> (4 * j)) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
                part += w * xk
                xs += xk
        acc += (part - z * xs) * s
    if SPLIT_K == 1:
        tl.store(y_ptr + rn, acc.to(y_ptr.dtype.element_ty), mask=nmask)
    else:
        tl.atomic_add(y_ptr + rn, acc, mask=nmask, sem="relaxed")


def int4_gemv(x: torch.Tensor, qweight, qzeros, scales, group_size: int = 128,
              block_n: int | None = None, split_k: int | None = None, num_warps: int = 4,
              num_stages: int = 3, variant: str = "tile") -> torch.Tensor:
    """y [1, N] = x [1, K] @ dequant(W), the weights dequantized inside the kernel (the decode step).

    Accumulates in fp32 (split over K with fp32 atomics when split_k > 1) and returns x's dtype: per
    group and column, (sum_k q x_k - z sum_k x_k) times the group's scale. variant "tile" works on
    [packed rows of a group, block_n] tiles; "rows" lets each thread walk down K for its columns.
    """
    _check(x.ndim == 2 and x.shape[0] == 1, f"x must be [1, K] (batch 1 decode), got {tuple(x.shape)}")
    _check(variant in ("tile", "rows"), f"variant must be 'tile' or 'rows', got {variant!r}")
    K, N = qweight.shape[0] * 8, qweight.shape[1]
    _check(x.shape[1] == K, f"x has K={x.shape[1]} but qweight packs K={K}")
    _check(qweight.dtype == torch.int32 and qzeros.dtype == torch.int32,
           "qweight and qzeros must be int32 (GPTQ packing)")
    _check(K % group_size == 0 and scales.shape == (K // group_size, N),
           f"scales must be [K/group_size, N] = {(K // group_size, N)}, got {tuple(scales.shape)}")
    if block_n is None:
        block_n = 32 if interpreted() else 256
    if split_k is None:
        sms = 1 if interpreted() else torch.cuda.get_device_properties(x.device).multi_processor_count
        split_k = max(1, min(K // group_size, (8 * sms) // max(1, triton.cdiv(N, block_n))))
    y = (torch.empty if split_k == 1 else torch.zeros)((N,), device=x.device,
                                                      dtype=x.dtype if split_k == 1 else torch.float32)
    grid = (triton.cdiv(N, block_n), split_k)
    kernel = _int4_gemv_kernel if variant == "tile" else _int4_gemv_rows_kernel
    kernel[grid](x.contiguous(), qweight.contiguous(), qzeros.contiguous(), scales.contiguous(), y, K, N,
                 GROUP=group_size, BLOCK_N=block_n, SPLIT_K=split_k, num_warps=num_warps, num_stages=num_stages)
    return y.to(x.dtype).reshape(1, N)

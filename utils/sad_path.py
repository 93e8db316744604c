"""The sad path: operators on extreme but legal inputs, in fp16/bf16 on the device against float64.

Why: a model's happy path (activations of a few units) hides what breaks at the edges: RMSNorm on
huge activations (x^2 overflows fp16 unless the kernel upcasts), softmax on large or fully masked
rows (exp overflow, 0/0 = NaN), SiLU in its tails, rotary angles at long positions (pos * freq
rounded to 8 or 11 bits), a GEMM whose sums pass the fp16 maximum 65504 (accumulator saturation,
累加器饱和). Each case runs in the low-precision dtype on the device and in float64 on the CPU on
the same (already rounded) inputs; the table says which overflow, lose precision or return NaN/Inf.
The determinism check runs the same forward N times and compares the outputs bit for bit.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from . import metrics

FP16_MAX = torch.finfo(torch.float16).max


# ---------------------------------------------------------------- the operators, written as the models do
def rmsnorm_naive(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm computed in the input dtype: x^2 overflows fp16 once |x| > 256."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rmsnorm_upcast(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm as transformers' Qwen2RMSNorm does it: the variance in float32, the result cast back."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def softmax_naive(x: torch.Tensor) -> torch.Tensor:
    """exp(x) / sum(exp(x)) without subtracting the row max: exp overflows for large logits."""
    e = torch.exp(x)
    return e / e.sum(-1, keepdim=True)


def softmax_torch(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def softmax_safe(x: torch.Tensor) -> torch.Tensor:
    """Max-subtracted softmax that returns zeros for a fully masked (all -inf) row, as attention kernels do."""
    m = x.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(x - m)
    s = e.sum(-1, keepdim=True)
    return torch.where(s > 0, e / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(e))


def silu(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(x)


def rope_angles(positions: torch.Tensor, dim: int = 128, base: float = 1e6) -> torch.Tensor:
    """cos(pos * inv_freq) with pos and inv_freq in the input dtype (the angle product is rounded there)."""
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    return torch.cos(positions[:, None] * inv.to(positions.device, positions.dtype)[None, :])


# ---------------------------------------------------------------- the cases
def _cases(gen: torch.Generator) -> list[tuple[str, str, Callable, Callable[[], tuple]]]:
    """(operator, case, fn, make_inputs) with inputs in float64 (rounded to each dtype when run)."""
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    masked = torch.full((4, 64), -math.inf, dtype=torch.float64)
    pos = torch.tensor([10.0, 1000.0, 32000.0, 131000.0], dtype=torch.float64)
    return [
        ("rmsnorm (in dtype)", "activations ~ 1", rmsnorm_naive, lambda: (r(4, 1024),)),
        ("rmsnorm (in dtype)", "activations ~ 1000", rmsnorm_naive, lambda: (1000 * r(4, 1024),)),
        ("rmsnorm (fp32 variance)", "activations ~ 1000", rmsnorm_upcast, lambda: (1000 * r(4, 1024),)),
        ("softmax (no max shift)", "logits ~ 1", softmax_naive, lambda: (r(4, 256),)),
        ("softmax (no max shift)", "logits ~ 100", softmax_naive, lambda: (100 * r(4, 256),)),
        ("softmax (torch)", "logits ~ 100", softmax_torch, lambda: (100 * r(4, 256),)),
        ("softmax (torch)", "fully masked row", softmax_torch, lambda: (masked,)),
        ("softmax (safe)", "fully masked row", softmax_safe, lambda: (masked,)),
        ("silu", "|x| up to 60000", silu, lambda: (torch.linspace(-60000, 60000, 4096, dtype=torch.float64),)),
        ("rotary cos(pos*freq)", "positions up to 131k", rope_angles, lambda: (pos,)),
        ("gemm", "sums ~ 50 (K=4096)", torch.matmul, lambda: (0.5 * r(64, 4096), 0.5 * r(4096, 64))),
        ("gemm", "sums near fp16 max (K=4096)", torch.matmul, lambda: (16 + r(64, 4096), 1 + r(4096, 64))),
    ]


# A fully masked row has no mathematical softmax; attention kernels define it as zeros. The reference
# for those cases is that convention, so NaN from torch.softmax shows up as a failure, not a match.
# Rotary positions are exact integers: rounding them to fp16/bf16 *is* the error taught, so that case's
# reference uses the exact float64 positions; every other case uses the same rounded inputs.
EXACT_INPUTS = (rope_angles,)


def _reference(fn: Callable, args: tuple) -> torch.Tensor:
    if fn in (softmax_torch, softmax_naive) and all(torch.isinf(a).all() for a in args):
        return softmax_safe(*args)
    return fn(*args)


def classify(out: torch.Tensor, ref: torch.Tensor, dtype, tolerance: float) -> tuple[str, float]:
    """'NaN' / 'overflow (Inf)' / 'precision loss' / 'ok' and the relative L2 error (finite parts only)."""
    o = out.to(torch.float64)
    if torch.isnan(o).any():
        return "NaN", float("nan")
    if torch.isinf(o).any() and not torch.isinf(ref).any():
        return "overflow (Inf)", float("inf")
    rel = metrics.relative_l2(o, ref)
    if not o.any() and ref.any():
        return "overflow inside (output 0)", rel
    return ("precision loss" if rel > tolerance else "ok"), rel


def run_cases(device: str = "cpu", dtypes=(torch.float16, torch.bfloat16), seed: int = 0,
              tolerance_ulps: float = 8.0) -> list[dict[str, Any]]:
    """Every case in every dtype on `device`, against float64 on the CPU on the same rounded inputs.

    tolerance: tolerance_ulps * unit roundoff of the dtype for elementwise ops, utils.metrics'
    matmul_error_bound for the GEMM; beyond it the row says 'precision loss'.
    """
    rows = []
    for dtype in dtypes:
        if dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):   # CPU arithmetic in it
            raise ValueError(f"dtypes: {dtype} is not a dtype the elementwise ops compute in; "
                             f"use float16, bfloat16, float32 or float64")
        gen = torch.Generator().manual_seed(seed)
        for op, case, fn, make in _cases(gen):
            args64 = make()
            rounded = tuple(a.to(dtype) for a in args64)
            ref = _reference(fn, args64 if fn in EXACT_INPUTS else tuple(a.to(torch.float64) for a in rounded))
            try:
                out = fn(*(a.to(device) for a in rounded)).cpu()
            except RuntimeError as exc:  # a dtype the device does not implement for this op
                rows.append({"op": op, "case": case, "dtype": str(dtype).replace("torch.", ""),
                             "status": f"error: {exc}"[:80], "rel_l2": float("nan"), "nan": 0, "inf": 0,
                             "ref_max_abs": float(ref.abs().max())})
                continue
            tol = (metrics.matmul_error_bound(dtype, args64[0].shape[-1]) if fn is torch.matmul
                   else tolerance_ulps * metrics.UNIT_ROUNDOFF[dtype])
            status, rel = classify(out, ref, dtype, tol)
            rows.append({"op": op, "case": case, "dtype": str(dtype).replace("torch.", ""), "status": status,
                         "rel_l2": rel, "tolerance": tol, "nan": int(torch.isnan(out).sum()),
                         "inf": int(torch.isinf(out).sum()),
                         "ref_max_abs": float(ref[torch.isfinite(ref)].abs().max()) if torch.isfinite(ref).any()
                         else float("nan")})
    return rows


# ---------------------------------------------------------------- determinism
def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a tensor (an integer view), so -0.0 vs 0.0 and NaN payloads count as different."""
    t = t.detach().contiguous()
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(view)


def determinism_check(fn: Callable[[], torch.Tensor], runs: int = 5) -> dict[str, Any]:
    """Call fn() `runs` times; compare every output with the first bit for bit.

    A GPU may pick different reduction orders run to run (atomics, split-K); bit-for-bit identical
    outputs are what a validation reference needs. Returns identical, distinct outputs, max abs diff.
    """
    if runs < 2:
        raise ValueError(f"runs must be >= 2 to compare anything, got {runs}")
    first = fn().detach().cpu()
    first_bits = bits(first)
    distinct = [first_bits]
    max_diff, n_diff_runs = 0.0, 0
    for _ in range(runs - 1):
        out = fn().detach().cpu()
        if out.shape != first.shape or out.dtype != first.dtype:
            raise ValueError(f"fn returned {tuple(out.shape)} {out.dtype} after {tuple(first.shape)} {first.dtype}")
        b = bits(out)
        if not torch.equal(b, first_bits):
            n_diff_runs += 1
            max_diff = max(max_diff, float((out.double() - first.double()).abs().nan_to_num(math.inf).max()))
        if not any(torch.equal(b, d) for d in distinct):
            distinct.append(b)
    return {"runs": runs, "identical": n_diff_runs == 0, "runs_differing": n_diff_runs,
            "distinct_outputs": len(distinct), "max_abs_diff": max_diff}

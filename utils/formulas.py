"""Closed-form quantities the labs compute and their exercises ask for, in one tested place.

ridge_point and gemm_intensity place a kernel on the roofline (Lab 01, Lab 05);
gptq_bytes_per_parameter is what a GPTQ checkpoint stores per weight (Lab 02); kl_divergence is
the per-token KL(golden || test) of Lab 04's llama.cpp-style statistics, for one pair of logit rows;
mx_scale_code is one MX block's shared E8M0 scale (Lab 05).
"""
from __future__ import annotations

import torch

from .numerics import mx_cast
from .roofline import gemm_bytes


def ridge_point(peak_tflops: float, bandwidth_gbps: float) -> float:
    """Arithmetic intensity (FLOP/byte) where the compute roof meets the memory line: peak / bandwidth."""
    if peak_tflops <= 0 or bandwidth_gbps <= 0:
        raise ValueError(f"peak_tflops and bandwidth_gbps must be > 0, got {peak_tflops}, {bandwidth_gbps}")
    return peak_tflops * 1e12 / (bandwidth_gbps * 1e9)


def gemm_intensity(m: int, n: int, k: int, bytes_per_element: float) -> float:
    """FLOP per byte of C[m, n] = A[m, k] B[k, n]: 2mnk FLOPs over A and B read once and C written once."""
    if min(m, n, k) < 1 or bytes_per_element <= 0:
        raise ValueError(f"m, n, k must be >= 1 and bytes_per_element > 0, got {m}, {n}, {k}, {bytes_per_element}")
    return 2 * m * n * k / gemm_bytes(m, n, k, bytes_per_element, bytes_per_element, bytes_per_element)


def gptq_bytes_per_parameter(bits: int = 4, group_size: int = 128, scale_bytes: int = 2) -> float:
    """Bytes per weight of a GPTQ layer: its code, plus one scale and one packed zero per group."""
    if bits < 1 or group_size < 1:
        raise ValueError(f"bits and group_size must be >= 1, got {bits}, {group_size}")
    return bits / 8 + scale_bytes / group_size + bits / 8 / group_size


def kl_divergence(golden_logits: torch.Tensor, test_logits: torch.Tensor) -> float:
    """KL(P || Q) in nats of the softmaxes of two logit rows, P the golden one, computed in float64."""
    if golden_logits.shape != test_logits.shape:
        raise ValueError(f"logit rows differ in shape: {tuple(golden_logits.shape)} vs {tuple(test_logits.shape)}")
    p = torch.log_softmax(golden_logits.double(), -1)
    q = torch.log_softmax(test_logits.double(), -1)
    return float((p.exp() * (p - q)).sum())


def mx_scale_code(block: torch.Tensor, elem: str = "mxfp8") -> int:
    """The E8M0 code of one MX block's shared scale (OCP MX v1.0), as utils.numerics.mx_cast computes it:
    floor(log2 amax) minus the element format's largest exponent, plus the bias 127; 0 for an all-zero
    block, 255 for a block holding a NaN."""
    flat = block.reshape(1, -1)
    return int(mx_cast(flat, elem, block=flat.shape[1]).scale_code.item())

"""Error metrics between an output and its reference, the vocabulary of every lab.

All are computed in float64, so the metric itself adds no rounding of its own; a NaN or Inf in the
output is never averaged away: it makes the metric NaN (or the SQNR -inf), which every check fails.
"""
from __future__ import annotations

import math

import torch

# Unit roundoff u = eps/2 of each format (the largest relative error of one rounding).
UNIT_ROUNDOFF = {
    torch.float64: 2.0**-53, torch.float32: 2.0**-24, "tf32": 2.0**-11,
    torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8,
    torch.float8_e4m3fn: 2.0**-4, torch.float8_e5m2: 2.0**-3,   # normal range; subnormals round coarser
}


# The course's one rule for "is this output the reference?", read by the per-layer table and the logit check
# alike: cosine (direction) AND normalized L2 (size). Each cosine bar c has its L2 bar sqrt(1/c^2 - 1), the L2
# that noise at right angles to the signal reaches at that cosine: for noise-like error the two agree, and an
# error along the signal (a change of scale, which leaves cosine at 1) is caught by the L2 bar alone.
COS_HEALTHY = 0.99   # the experiment report's threshold: at or above (and L2 <= 0.142), healthy
COS_CRITICAL = 0.95  # below (or L2 > 0.329): critical, suspected silent data corruption (SDC, 静默数据损坏)


def rel_l2_at_cosine(cos: float) -> float:
    """The normalized L2 of an error orthogonal to the reference that gives this cosine: sqrt(1/c^2 - 1)."""
    return math.sqrt(1.0 / cos**2 - 1.0)


def rule_verdict(cosine: float, rel_l2: float, healthy: float = COS_HEALTHY, critical: float = COS_CRITICAL) -> str:
    """'healthy' / 'degraded' / 'critical' by cosine AND normalized L2 against the bars above; NaN is critical."""
    if not (cosine >= critical and rel_l2 <= rel_l2_at_cosine(critical)):  # NaN fails both comparisons
        return "critical"
    return "healthy" if cosine >= healthy and rel_l2 <= rel_l2_at_cosine(healthy) else "degraded"


def _pair(out: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if out.shape != ref.shape:
        raise ValueError(f"shape mismatch: output {tuple(out.shape)} vs reference {tuple(ref.shape)}")
    return out.detach().to("cpu", torch.float64), ref.detach().to("cpu", torch.float64)


def relative_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref||: the normalized L2 error."""
    o, r = _pair(out, ref)
    denom = torch.linalg.vector_norm(r)
    err = torch.linalg.vector_norm(o - r)
    if denom == 0:
        return 0.0 if err == 0 else math.inf
    return float(err / denom)


def max_abs_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = _pair(out, ref)
    d = (o - r).abs()
    return float("nan") if torch.isnan(d).any() else float(d.max()) if d.numel() else 0.0


def sqnr_db(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio 20*log10(||ref|| / ||out - ref||), in dB (torchao's compute_error)."""
    rel = relative_l2(out, ref)
    if math.isnan(rel):
        return float("nan")
    return math.inf if rel == 0 else -20.0 * math.log10(rel)


class MetricAccumulator:
    """cosine, normalized L2, SQNR (dB) and max abs error accumulated batch by batch in float64.

    Sums of out*ref, out^2, ref^2, (out-ref)^2 are all the metrics need, so whole activations are
    never concatenated. result() on one batch equals the functions above on that batch (tested).
    Non-finite values are counted (output and reference apart), never averaged: with any of them
    the metrics are NaN and 'nonfinite' / 'ref_nonfinite' say how many there were.
    """

    def __init__(self):
        self.dot = self.oo = self.rr = self.ee = 0.0
        self.max_abs = 0.0
        self.nonfinite = self.ref_nonfinite = 0
        self.n = 0

    def update(self, out: torch.Tensor, ref: torch.Tensor) -> "MetricAccumulator":
        o, r = _pair(out, ref)
        o, r = o.flatten(), r.flatten()
        self.nonfinite += int((~torch.isfinite(o)).sum())
        self.ref_nonfinite += int((~torch.isfinite(r)).sum())
        d = o - r
        self.dot += float(o @ r)
        self.oo += float(o @ o)
        self.rr += float(r @ r)
        self.ee += float(d @ d)
        if o.numel():
            self.max_abs = max(self.max_abs, float(d.abs().max()))
        self.n += o.numel()
        return self

    def result(self) -> dict[str, float]:
        counts = {"nonfinite": self.nonfinite, "ref_nonfinite": self.ref_nonfinite}
        if self.nonfinite or self.ref_nonfinite:
            nan = float("nan")
            return {"cosine": nan, "rel_l2": nan, "sqnr_db": nan, "max_abs": nan, **counts}
        cos = self.dot / math.sqrt(self.oo * self.rr) if self.oo * self.rr > 0 else float(self.oo == self.rr)
        rel = math.sqrt(self.ee / self.rr) if self.rr > 0 else (0.0 if self.ee == 0 else math.inf)
        sqnr = math.inf if rel == 0 else -20.0 * math.log10(rel)
        return {"cosine": cos, "rel_l2": rel, "sqnr_db": sqnr, "max_abs": self.max_abs, **counts}


def cosine_similarity(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = _pair(out, ref)
    return float(torch.nn.functional.cosine_similarity(o.flatten(), r.flatten(), dim=0))


def matmul_error_bound(dtype, k: int, safety: float = 4.0, *, out_abs=1.0, sums_abs=None,
                       input_dtype=None, acc_dtype=torch.float32):
    """The course's one bound on the rounding error of C = A @ B (k-long dot products) against the exact
    product of the same inputs, elementwise:

        |C - C_exact| <= safety * (u_out |C| + (u_in + sqrt(k) u_acc) S)

    u_out: the output's rounding to `dtype` ("tf32" outputs fp32); u_in: a hidden rounding of the
    inputs (tf32 rounds fp32 operands to 10 mantissa bits; `input_dtype` names another, e.g.
    activations cast to bf16); u_acc: the accumulator's, over k additions of random-sign errors
    (sqrt(k)); S: the size of the partial sums. Defaults (out_abs = 1, S = |C|): the bound on
    relative_l2 for inputs of random sign, whose partial sums stay the size of C. Pass
    out_abs = |A @ B| and sums_abs = |A| @ |B| (tensors) for a bound per element, for any signs.
    """
    if dtype in (torch.int8, "int8"):
        return 0.0  # int32 accumulation is exact until it overflows
    if k < 1:
        raise ValueError(f"k (the reduction length) must be >= 1, got {k}")
    u_out = UNIT_ROUNDOFF[torch.float32 if dtype == "tf32" else dtype]
    u_in = max(UNIT_ROUNDOFF["tf32"] if dtype == "tf32" else 0.0,
               UNIT_ROUNDOFF[input_dtype] if input_dtype is not None else 0.0)
    sums = out_abs if sums_abs is None else sums_abs
    return safety * (u_out * out_abs + (u_in + math.sqrt(k) * UNIT_ROUNDOFF[acc_dtype]) * sums)

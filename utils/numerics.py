"""Reference numerics for Lab 05, written to be read: ULP distance, derived GEMM tolerances, integer
accumulators (wrap vs saturate), FP8 per-tensor scaling, MX block scaling (E8M0 + MXFP8 / MXFP4) and
an MX linear layer with four casts (vs a naive one that casts once).

Why our own: a library's behaviour is only checked when an independent implementation, derived from
the format's definition, agrees with it bit for bit, or the difference is named. Everything here is
computed in float64 / int64 on the CPU, so the reference adds no rounding of its own.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .metrics import matmul_error_bound, max_abs_error, relative_l2, sqnr_db

# ------------------------------------------------------------------------------------------ ULPs
_INT_VIEW = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
             torch.float64: torch.int64}
NAN_DISTANCE = torch.iinfo(torch.int64).max


def _ordered(x: torch.Tensor) -> torch.Tensor:
    """Map floats to integers whose order and differences count representable values (ULPs)."""
    i = x.contiguous().view(_INT_VIEW[x.dtype]).to(torch.int64)
    bits = torch.finfo(x.dtype).bits
    mag = i & ((1 << (bits - 1)) - 1)
    return torch.where(i < 0, -mag, mag)      # sign-magnitude -> two's complement; -0 and +0 meet


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many representable values of their (shared) dtype lie between a and b, elementwise.

    0 means bit-identical (or +0 vs -0); 1 means neighbours. A NaN on either side gives NAN_DISTANCE:
    a NaN is never close to anything.
    """
    if a.dtype != b.dtype or a.dtype not in _INT_VIEW:
        raise ValueError(f"a and b must share a float dtype of {list(_INT_VIEW)}, got {a.dtype}, {b.dtype}")
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: {tuple(a.shape)} vs {tuple(b.shape)}")
    a, b = a.detach().cpu(), b.detach().cpu()
    d = (_ordered(a) - _ordered(b)).abs()
    return torch.where(torch.isnan(a) | torch.isnan(b), torch.full_like(d, NAN_DISTANCE), d)


def next_up(x: torch.Tensor) -> torch.Tensor:
    """Each value moved one ULP away from zero in its own dtype (a 'one-ULP different' result)."""
    i = x.contiguous().view(_INT_VIEW[x.dtype])
    return (i + 1).view(x.dtype)


# ------------------------------------------------------------------------------------ tolerances
def gemm_tolerance(dtype, k: int, acc_dtype=torch.float32, safety: float = 4.0) -> dict:
    """(rtol, atol) for torch.testing.assert_close of a k-long GEMM whose inputs have unit scale (randn),
    read off metrics.matmul_error_bound: rtol is its |C| term (the output's own rounding), atol the
    whole bound at the sizes randn gives, |C| ~ sqrt(k) and partial sums |A| @ |B| ~ k * 2/pi.
    Derived, not tuned. For inputs of another scale use elementwise_bound.
    """
    return {"rtol": matmul_error_bound(dtype, k, safety, sums_abs=0.0, acc_dtype=acc_dtype),
            "atol": matmul_error_bound(dtype, k, safety, out_abs=math.sqrt(k), sums_abs=k * 2 / math.pi,
                                       acc_dtype=acc_dtype)}


def elementwise_bound(a: torch.Tensor, b: torch.Tensor, out_dtype, acc_dtype=torch.float32,
                      safety: float = 4.0) -> torch.Tensor:
    """Per-element bound on |C - C_exact| for C = A @ B, in fp64: metrics.matmul_error_bound with this
    product's own |A @ B| and |A| @ |B|."""
    a64, b64 = a.detach().cpu().double(), b.detach().cpu().double()
    return matmul_error_bound(out_dtype, a64.shape[-1], safety, out_abs=(a64 @ b64).abs(),
                              sums_abs=a64.abs() @ b64.abs(), acc_dtype=acc_dtype)


def error_report(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """Max abs, max relative (over |ref| > 0) and normalized L2 error of out against ref, in fp64."""
    o, r = out.detach().cpu().double(), ref.detach().cpu().double()
    nz = r != 0
    rel = ((o - r).abs()[nz] / r.abs()[nz]).max().item() if nz.any() else 0.0
    return {"max_abs": max_abs_error(o, r), "max_rel": rel, "rel_l2": relative_l2(o, r)}


def chunked_matmul(a: torch.Tensor, b: torch.Tensor, acc_dtype, chunk: int = 32) -> torch.Tensor:
    """A @ B with the running sum kept in acc_dtype: each `chunk` of K is multiplied exactly (fp64) and
    added to the accumulator, which is rounded to acc_dtype after every addition, as a tensor core
    with an fp16 (or fp32) accumulator does once per MMA step. An emulation, any device."""
    a64, b64 = a.detach().cpu().double(), b.detach().cpu().double()
    acc = torch.zeros(a64.shape[0], b64.shape[1], dtype=acc_dtype)
    for k0 in range(0, a64.shape[1], chunk):
        acc = (acc.double() + a64[:, k0:k0 + chunk] @ b64[k0:k0 + chunk]).to(acc_dtype)
    return acc


# ---------------------------------------------------------------------------------- accumulators
def _int_range(bits: int) -> tuple[int, int]:
    if bits not in (8, 16, 32):
        raise ValueError(f"accumulator bits must be 8, 16 or 32, got {bits}")
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def wrap_int(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Two's-complement wrap of int64 values into a `bits`-bit signed integer (what hardware adders do)."""
    lo, _ = _int_range(bits)
    return (x.to(torch.int64) - lo) % (2**bits) + lo


def accumulate(products: torch.Tensor, bits: int, mode: str) -> torch.Tensor:
    """Sum products along the last axis, in order, in a `bits`-bit accumulator that wraps or saturates.

    Emulated exactly in int64, one addition at a time. Wrap is modular, so its result does not depend
    on the order; saturate clamps after every addition, so it does (the order here is k = 0, 1, ...).
    """
    if mode not in ("wrap", "saturate"):
        raise ValueError(f"mode must be 'wrap' or 'saturate', got {mode!r}")
    if products.dtype.is_floating_point:
        raise ValueError(f"products must be integers, got {products.dtype}")
    lo, hi = _int_range(bits)
    p = products.to(torch.int64)
    acc = torch.zeros(p.shape[:-1], dtype=torch.int64)
    for k in range(p.shape[-1]):
        acc = acc + p[..., k]
        acc = wrap_int(acc, bits) if mode == "wrap" else acc.clamp(lo, hi)
    return acc


def int_dot(a: torch.Tensor, b: torch.Tensor, bits: int, mode: str, in_bits: int = 8) -> torch.Tensor:
    """Rows of a (..., K) dotted with b (K,) in a `bits`-bit accumulator; inputs must fit in in_bits."""
    lo, hi = -(2 ** (in_bits - 1)), 2 ** (in_bits - 1) - 1
    for name, t in (("a", a), ("b", b)):
        if t.dtype.is_floating_point or int(t.min()) < lo or int(t.max()) > hi:
            raise ValueError(f"{name} must be integers in [{lo}, {hi}] (int{in_bits})")
    return accumulate(a.to(torch.int64) * b.to(torch.int64), bits, mode)


# --------------------------------------------------------------------------- minifloats and FP8
@dataclass(frozen=True)
class MiniFloat:
    """A small float format: exponent and mantissa bits, the largest finite value, NaN/inf rules."""
    name: str
    ebits: int
    mbits: int
    max: float
    has_inf: bool

    @property
    def emin(self) -> int:          # exponent of the smallest normal
        return 2 - 2 ** (self.ebits - 1)


E4M3 = MiniFloat("float8_e4m3fn", 4, 3, 448.0, False)
E5M2 = MiniFloat("float8_e5m2", 5, 2, 57344.0, True)
E2M1 = MiniFloat("float4_e2m1", 2, 1, 6.0, False)
FP8_FORMATS = {torch.float8_e4m3fn: E4M3, torch.float8_e5m2: E5M2}


def round_to_format(x: torch.Tensor, fmt: MiniFloat, saturate: bool = True) -> torch.Tensor:
    """Round to the nearest value of `fmt` (ties to even), in float64; subnormals included.

    Past the largest finite value: saturate clamps to +-max; otherwise the value becomes inf (a
    format with inf) or NaN (e4m3fn, e2m1 have none). NaN stays NaN. Overflow is decided after
    rounding, as the OCP spec does: 460 rounds to 448 in e4m3fn, 470 does not.
    """
    x = x.detach().cpu().double()
    _, e = torch.frexp(x)                                  # x = m 2^e, 0.5 <= |m| < 1
    e = torch.clamp(e - 1, min=fmt.emin)                   # floor(log2|x|), subnormals share emin
    step = torch.pow(2.0, (e - fmt.mbits).double())
    r = torch.round(x / step) * step                       # torch.round: half to even
    r = torch.where(torch.isfinite(x), r, x)
    over = r.abs() > fmt.max
    if saturate:
        return torch.where(over, torch.sign(x) * fmt.max, r)
    return torch.where(over, torch.sign(x) * math.inf if fmt.has_inf else torch.full_like(r, math.nan), r)


def naive_fp8_quantize(x: torch.Tensor, fp8_dtype) -> dict:
    """The bug: a per-tensor scale computed in x's own dtype (fp16): scale = amax / fp8_max, then
    x * (1 / scale). A tiny scale, or one whose reciprocal overflows fp16, gives inf, and 0 * inf = NaN."""
    fmt = FP8_FORMATS[fp8_dtype]
    amax = x.abs().max()
    scale = amax / fmt.max                                  # in x.dtype
    inv = 1 / scale
    scaled = x * inv
    return {"amax": float(amax), "scale": float(scale), "inv_scale": float(inv),
            "scaled": scaled, "fp8": scaled.to(fp8_dtype)}


def fp8_scale(amax: torch.Tensor, fp8_dtype, eps: float = 1e-12) -> torch.Tensor:
    """The fix: fp8_max / max(amax, eps) computed in float64, returned as float32 (a multiplier)."""
    fmt = FP8_FORMATS[fp8_dtype]
    if eps <= 0:
        raise ValueError(f"eps must be > 0 (it keeps an all-zero tensor from a 1/0 scale), got {eps}")
    return (fmt.max / torch.clamp(amax.detach().to(torch.float64), min=eps)).to(torch.float32)


def fp8_quantize(x: torch.Tensor, fp8_dtype, saturate: bool = True, eps: float = 1e-12) -> dict:
    """Per-tensor FP8 quantization with the fixed scale: q = cast(x * scale); x ~ q / scale."""
    scale = fp8_scale(x.abs().max(), fp8_dtype, eps)
    grid = round_to_format(x.float() * scale, FP8_FORMATS[fp8_dtype], saturate=saturate)
    return {"scale": scale, "fp8": grid.to(fp8_dtype), "dequant": grid.float() / scale}


# ---------------------------------------------------------------------------------- MX formats
MX_ELEMENTS = {"mxfp8": E4M3, "mxfp4": E2M1}
MX_RULES = ("spec", "torchao")
E8M0_BIAS, E8M0_NAN = 127, 255
_E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


@dataclass
class MXCast:
    """An MX-cast tensor: E8M0 scale codes per block, element codes, and what they decode to."""
    scale_code: torch.Tensor      # uint8 [..., n_blocks]: scale = 2^(code - 127), 255 = NaN
    codes: torch.Tensor           # uint8 [..., K]: e4m3fn bit patterns, or e2m1 nibbles (sign<<3 | index)
    values: torch.Tensor          # float64 element values (before the scale)
    dequant: torch.Tensor         # float32 values * 2^(code - 127) (NaN in a NaN block), input's layout


def _elem_codes(values: torch.Tensor, fmt: MiniFloat) -> torch.Tensor:
    if fmt is E4M3:
        return values.float().to(torch.float8_e4m3fn).view(torch.uint8)   # exact: values are on the grid
    idx = (values.abs().unsqueeze(-1) == _E2M1_VALUES).int().argmax(-1)
    # e2m1 has no NaN. torchao's encoder sends a NaN's fp32 bits through its normal-number rounding
    # (add a bias, shift right by 22, keep 8 bits), which lands on index 2, 3 or 4 by payload.
    m = values.float().view(torch.int32).to(torch.int64) & 0x7FFFFFFF
    nan_idx = ((m - (126 << 23) + 0x1FFFFF + ((m >> 22) & 1)) >> 22) & 0xFF
    idx = torch.where(torch.isnan(values), nan_idx, idx)
    return (torch.signbit(values).to(torch.uint8) << 3) | idx.to(torch.uint8)   # -0 keeps its sign


def mx_cast(x: torch.Tensor, elem: str = "mxfp8", block: int = 32, axis: int = -1,
            rules: str = "spec") -> MXCast:
    """OCP MX v1.0 cast: blocks of `block` along `axis` share X = 2^(floor(log2 amax) - emax_elem).

    emax_elem is the element format's largest exponent (8 for e4m3, 2 for e2m1). Elements are x / X
    rounded to nearest-even and clamped to the element's max (floor-scaling can exceed it by < 2x).
    E8M0 has no zero and no Inf; code 255 is NaN, and a NaN scale makes every element of its block NaN.
    Where the spec and torchao's to_mx differ, rules="spec" (default) follows the spec, "torchao" torchao:
      - a block holding a NaN: scale code 255 under both rules;
      - a block holding +-Inf and no NaN: floor(log2 Inf) is no exponent E8M0 can hold, so "spec"
        makes it a NaN block (code 255), as the spec's companion library microxcaling does (shared
        exponents above 127 become NaN): an Inf is not silently turned into a number. "torchao" reads
        Inf's fp32 exponent field as 2^128: code 128 - emax_elem + 127 (247 e4m3, 253 e2m1), the Inf
        saturates to +-max, the block's finite values mostly flush to 0, and the Inf decodes back to
        Inf in fp32 only because max * 2^(128 - emax_elem) overflows;
      - an all-zero (or tiny) block gets code 0, scale 2^-127; "torchao" divides by 2^-126 there (it
        clamps the fp32 scale to the smallest normal, since Triton flushes 2^-127 to zero).
    The elements of a NaN block carry no value; both rules store what torchao stores: x / +Inf (code
    255 read as fp32 bits is +Inf), i.e. +-0 for finite x and a NaN (sign and payload as this CPU's
    division gives them) for NaN or Inf x.
    """
    if elem not in MX_ELEMENTS:
        raise ValueError(f"elem must be one of {list(MX_ELEMENTS)}, got {elem!r}")
    if rules not in MX_RULES:
        raise ValueError(f"rules must be one of {MX_RULES}, got {rules!r}")
    fmt = MX_ELEMENTS[elem]
    xt = x.detach().cpu().double().movedim(axis, -1)
    if xt.shape[-1] % block:
        raise ValueError(f"the cast axis has length {xt.shape[-1]}, not a multiple of block={block}: pad it")
    blocks = xt.reshape(*xt.shape[:-1], xt.shape[-1] // block, block)
    amax = blocks.abs().amax(-1)                                        # NaN if any element is NaN
    _, e = torch.frexp(torch.where(torch.isfinite(amax), amax, torch.zeros_like(amax)))
    emax_elem = int(math.floor(math.log2(fmt.max)))
    shared = torch.clamp(e - 1 - emax_elem, -E8M0_BIAS, E8M0_BIAS)
    shared = torch.where(amax == 0, torch.full_like(shared, -E8M0_BIAS), shared)
    nan_block = torch.isnan(amax)
    if rules == "torchao":
        shared = torch.where(torch.isinf(amax), torch.full_like(shared, 128 - emax_elem), shared)
    else:
        nan_block = nan_block | torch.isinf(amax)
    code = torch.where(nan_block, torch.full_like(shared, E8M0_NAN), shared + E8M0_BIAS).to(torch.uint8)
    div_exp = shared.clamp(min=-126) if rules == "torchao" else shared
    div = torch.where(nan_block, torch.full_like(amax, math.inf), torch.pow(2.0, div_exp.double()))
    scale = torch.where(nan_block, torch.full_like(amax, math.nan), torch.pow(2.0, shared.double()))
    values = round_to_format(blocks / div.unsqueeze(-1), fmt, saturate=True)
    deq = (values * scale.unsqueeze(-1)).reshape(xt.shape).movedim(-1, axis).float()
    return MXCast(code, _elem_codes(values, fmt).reshape(xt.shape).movedim(-1, axis),
                  values.reshape(xt.shape).movedim(-1, axis), deq)


def torchao_mx(x: torch.Tensor, elem: str = "mxfp8", block: int = 32) -> dict:
    """torchao's to_mx on the same tensor (fp32 and bf16 as they are, other dtypes as fp32): E8M0 scale
    codes and element codes (uint8, our layout) and its own decode to fp32 (to_dtype)."""
    from torchao.prototype.mx_formats.kernels import unpack_uint4
    from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx

    dt = torch.float8_e4m3fn if elem == "mxfp8" else torch.float4_e2m1fn_x2
    xt = x.detach().contiguous()
    xt = xt if xt.dtype in (torch.float32, torch.bfloat16) else xt.float()
    scale, data = to_mx(xt, dt, block)
    deq = to_dtype(data, scale, dt, block, torch.float32).cpu()
    scale, data = scale.view(torch.uint8).cpu(), data.view(torch.uint8).cpu()
    codes = data if elem == "mxfp8" else unpack_uint4(data).reshape(x.shape)
    return {"scale_code": scale, "codes": codes, "dequant": deq}


def compare_mx(x: torch.Tensor, elem: str = "mxfp8", block: int = 32, rules: str = "spec") -> dict:
    """Our mx_cast against torchao's to_mx: how many scale codes, element codes and decoded values
    (NaN counts as equal to NaN) differ, and how many blocks hold a NaN or an Inf."""
    ours = mx_cast(x, elem, block, rules=rules)
    ao = torchao_mx(x, elem, block)
    d, t = ours.dequant, ao["dequant"]
    same = (d == t) | (torch.isnan(d) & torch.isnan(t))
    nonfinite = (~torch.isfinite(x.detach().cpu().float().reshape(-1, block))).any(-1)
    return {"elem": elem, "blocks": ao["scale_code"].numel(), "non_finite_blocks": int(nonfinite.sum()),
            "scale_mismatches": int((ao["scale_code"] != ours.scale_code).sum()),
            "elements": ao["codes"].numel(), "code_mismatches": int((ao["codes"] != ours.codes).sum()),
            "decoded_mismatches": int((~same).sum())}


# -------------------------------------------------------------------------------- MX linear layer
def mx_fake(x: torch.Tensor, elem: str, axis: int) -> torch.Tensor:
    """Quantize-dequantize along `axis` (emulated MX: the GEMM then runs in fp32 on exact MX values)."""
    return mx_cast(x, elem, axis=axis).dequant.to(x.device)


def mx_linear_grads(x: torch.Tensor, w: torch.Tensor, grad_out: torch.Tensor, elem: str = "mxfp8",
                    recipe: str = "four_casts") -> dict:
    """y = x @ w.T and its two gradients with every GEMM operand MX-cast.

    four_casts: each operand is cast along the axis its GEMM reduces over (forward: x and w along K;
    grad_input = gy @ w: gy and w along N; grad_weight = gy.T @ x: gy and x along M), so the scales
    sit where an MX tensor-core GEMM needs them. naive: x, w and gy cast once along their last axis
    and reused, so grad_input's w and grad_weight's gy and x carry blocks across the reduction.
    """
    if recipe not in ("four_casts", "naive"):
        raise ValueError(f"recipe must be 'four_casts' or 'naive', got {recipe!r}")
    x, w, gy = (t.detach().float().cpu() for t in (x, w, grad_out))
    if recipe == "four_casts":
        y = mx_fake(x, elem, -1) @ mx_fake(w, elem, -1).T
        gx = mx_fake(gy, elem, -1) @ mx_fake(w, elem, 0)
        gw = mx_fake(gy, elem, 0).T @ mx_fake(x, elem, 0)
    else:
        xq, wq, gq = mx_fake(x, elem, -1), mx_fake(w, elem, -1), mx_fake(gy, elem, -1)
        y, gx, gw = xq @ wq.T, gq @ wq, gq.T @ xq
    return {"output": y, "grad_input": gx, "grad_weight": gw}


def mx_linear_sqnr(x, w, grad_out, elem: str = "mxfp8", recipe: str = "four_casts") -> dict:
    """SQNR (dB) of an MX linear's output and gradients against the same linear in bf16."""
    xb = x.detach().to(torch.bfloat16).requires_grad_(True)
    wb = w.detach().to(torch.bfloat16).requires_grad_(True)
    yb = xb @ wb.T
    yb.backward(grad_out.to(torch.bfloat16))
    mx = mx_linear_grads(x, w, grad_out, elem, recipe)
    return {"elem": elem, "recipe": recipe, "output_db": sqnr_db(mx["output"], yb.detach()),
            "grad_input_db": sqnr_db(mx["grad_input"], xb.grad), "grad_weight_db": sqnr_db(mx["grad_weight"], wb.grad)}

"""w4a16_matmul: y = x @ W + bias for GPTQ Int4 weights, the kernel of the Int4 model's decode step.

Why its own kernel: a decode step at batch M multiplies M = 1..16 rows by every weight, so it is bound
by reading the weights, and Int4 weights are about a quarter of BF16's bytes. GPTQModel's Triton kernel
unpacks the whole weight on every call; this one dequantizes each tile in registers and multiplies it
on the tensor cores (w4a16_kernels.py; on Hopper w4a16_fragment.py, which loads the packed words
straight into the tensor cores' operand layout; which tile and launches a call gets: w4a16_launch.py). Beyond 16 rows (a prompt) the weight
is dequantized once into a scratch tensor and multiplied by cuBLAS: there the multiply, not the read,
sets the time.

It is a torch custom op (torch.ops.quantlab.w4a16_matmul, with a fake implementation), so torch.compile
and its CUDA graphs take it whole, without a graph break. An eager call goes through a launch plan
cached per (device, dtypes, shapes, options), as int4_gemv does, so Python costs little per call.
Deterministic: split-K partials are summed in a fixed order. w4a16_gated_silu (torch.ops.quantlab.
w4a16_gated_silu) runs a gated MLP's gate and up projections in one launch, silu applied as it writes.
"""
from __future__ import annotations

import contextlib

import torch
import triton

from .common import require, cache, interpreted
from .gemv_plan import gemv_pdl
from . import w4a16_fragment
from .w4a16_kernels import w4a16_dequant_kernel
from .w4a16_launch import (UNPACKS, V1_ZERO_WORD, W4A16_MAX_ROWS, W4A16Plan, W4A16Tile,  # noqa: F401 - re-exported
                           fragment_refusal, w4a16_block_k, w4a16_default_tile, w4a16_default_unpack)

ZERO_FORMATS = (1, 2)         # GPTQModel's qzero_format(): 1 = v1 (stored minus one), 2 = v2 (as is)
# Launch the split-K sum kernel as a programmatic dependent (PDL, sm_90)? Off: alone it saved 0.6 us a call, but
# the compiled 7B decode step was 0.11 ms slower with it (its early-resident programs wait beside the GEMM's;
# docs/device-runs/20261127-w4a16-gated-h100, run3).
SUM_PDL = False


def _check_operands(x, qweight, qzeros, scales, g_idx, bias, group_size, zero_format):
    K, N = qweight.shape[0] * 8, qweight.shape[1]
    require(x.shape[-1] == K, f"x has {x.shape[-1]} input features but qweight packs K={K} (qweight is [K/8, N])")
    require(qweight.dtype == torch.int32 and qzeros.dtype == torch.int32,
           f"qweight and qzeros must be int32 (GPTQ packing), got {qweight.dtype} and {qzeros.dtype}")
    devs = {t.device for t in (x, qweight, qzeros, scales, g_idx, bias) if t is not None}
    require(len(devs) == 1, f"x, qweight, qzeros, scales, g_idx and bias must be on one device, got {sorted(map(str, devs))}")
    require(x.dtype in (torch.float16, torch.bfloat16, torch.float32),
           f"x must be float16, bfloat16 or float32, got {x.dtype}")
    require(scales.dtype in (torch.float16, torch.bfloat16, torch.float32),
           f"scales must be float16, bfloat16 or float32, got {scales.dtype}")
    require(zero_format in ZERO_FORMATS, f"zero_format must be 1 (GPTQ v1: zeros stored minus one) or 2 (v2), "
           f"got {zero_format!r}")
    require(isinstance(group_size, int) and group_size >= 16 and group_size & (group_size - 1) == 0
           and K % group_size == 0,
           f"group_size must be a power of two >= 16 dividing K={K} (GPTQ uses 32, 64, 128; -1 means K), "
           f"got {group_size}")
    ng = K // group_size
    require(N % 8 == 0 and tuple(scales.shape) == (ng, N) and tuple(qzeros.shape) == (ng, N // 8),
           f"scales must be [K/group_size, N] = {(ng, N)} and qzeros [K/group_size, N/8] = {(ng, N // 8)}, "
           f"got {tuple(scales.shape)} and {tuple(qzeros.shape)}")
    require(g_idx is None or (tuple(g_idx.shape) == (K,) and g_idx.dtype == torch.int32),
           f"g_idx must be int32 [K] = [{K}] (or None: group i // group_size), got "
           f"{None if g_idx is None else (tuple(g_idx.shape), g_idx.dtype)}")
    require(bias is None or tuple(bias.shape) == (N,), f"bias must be [N] = [{N}], got "
           f"{None if bias is None else tuple(bias.shape)}")
    for name, t in (("qweight", qweight), ("qzeros", qzeros), ("scales", scales), ("g_idx", g_idx), ("bias", bias)):
        if t is not None and not t.is_contiguous():    # the kernel reads each row as packed: strides would be ignored
            require(False, f"{name} must be contiguous, got strides {t.stride()} for shape {tuple(t.shape)}: pass "
                           f"{name}.contiguous() (once, where the layer is built)")
    return K, N


def _check_device(x) -> None:
    require(x.is_cuda or x.device.type != "cpu" or interpreted(),
           "w4a16_matmul is a Triton kernel for a GPU; on a CPU it runs only under Triton's interpreter "
           "(TRITON_INTERPRET=1, set before triton is imported)")


def w4a16_plan(x2, qweight, qzeros, scales, g_idx, bias, group_size, zero_format, tile=None,
               gated: bool = False) -> W4A16Plan:
    """The plan for 2-D x [M <= 16, K] and these operands, made and checked once per key (kernels.cache).
    gated: for w4a16_gated_silu, whose second weight has the first's shapes (checked there)."""
    # what a call is planned by, checked when the plan is made (every operand on x's device, ...); every device is
    # in it, since a plan's compiled launches pass bare addresses, which nothing then checks lie on that GPU
    key = ("w4a16", x2.shape, x2.dtype, x2.device, qweight.shape, qweight.device, qzeros.shape, qzeros.device,
           scales.shape, scales.dtype, scales.device, None if g_idx is None else (g_idx.shape, g_idx.device),
           None if bias is None else (bias.shape, bias.dtype, bias.device),
           qweight.is_contiguous() and qzeros.is_contiguous() and scales.is_contiguous()
           and (g_idx is None or g_idx.is_contiguous()) and (bias is None or bias.is_contiguous()),
           group_size, zero_format, tile, gated, SUM_PDL, w4a16_fragment.SHARED_X_FROM,   # settings benchmarks flip
           w4a16_fragment.LAST_SUM)
    plan = cache.gemv_plans.get(key)
    if plan is None:
        K, N = _check_operands(x2, qweight, qzeros, scales, g_idx, bias, group_size, zero_format)
        M = x2.shape[0]
        if tile is None:
            tile = w4a16_default_tile(M, K, N, group_size, cache.device_info(x2.device)["sms"],
                                      w4a16_default_unpack(scales.dtype, g_idx is not None, x2, group_size), gated)
        require(tile.unpack == "fragment" or (K % tile.block_k == 0 and group_size % tile.block_k == 0
                                               and tile.block_k >= 16),
               f"tile.block_k must be >= 16 and divide K={K} and group_size={group_size}, got {tile.block_k}")
        require(tile.unpack in UNPACKS, f"tile.unpack must be one of {UNPACKS}, got {tile.unpack!r}")
        require(tile.unpack in ("reshape", "rows") or g_idx is None,
               f"tile.unpack={tile.unpack!r} reads one group per tile; act-order (g_idx) needs 'reshape' or 'rows'")
        require(tile.unpack != "ptx" or (scales.dtype == torch.float16 and not interpreted()
                                          and torch.version.hip is None),
               f"tile.unpack='ptx' needs float16 scales and an NVIDIA GPU (got {scales.dtype}"
               f"{', the interpreter' if interpreted() else ''}{', ROCm' if torch.version.hip else ''}): use 'join'")
        require(not gated or tile.unpack in ("join", "ptx", "fragment"),
               f"w4a16_gated_silu unpacks the weight as the first operand: tile.unpack 'join', 'ptx' or 'fragment', "
               f"got {tile.unpack!r}")
        if tile.unpack == "fragment":
            why = fragment_refusal(x2.dtype, x2.device, K, group_size, scales.dtype, g_idx is not None)
            require(why is None, f"tile.unpack='fragment' (the Gluon kernel) needs {why}: use 'ptx' or 'join'")
            require(tile.block_n in (64, 128) and (tile.block_k, tile.num_warps) == (w4a16_fragment.BLOCK_K,
                                                                                     w4a16_fragment.WARPS)
                    and isinstance(tile.num_stages, int) and 1 <= tile.num_stages <= w4a16_fragment.MAX_STAGES
                    and tile.split_k >= 1,
                    f"tile.unpack='fragment' runs block_n 64 or 128, block_k {w4a16_fragment.BLOCK_K}, "
                    f"{w4a16_fragment.WARPS} warps, 1 to {w4a16_fragment.MAX_STAGES} stages, split_k >= 1; got {tile}")
        plan = W4A16Plan(M, K, N, group_size, zero_format, g_idx is not None, bias is not None, tile,
                         "ieee" if x2.dtype == torch.float32 else None, x2.device, gated, SUM_PDL and gemv_pdl(x2))
        cache.gemv_plans[key] = plan
        cache.plans_made += 1
    return plan


def w4a16_dequant(qweight, qzeros, scales, g_idx=None, group_size: int = 128, zero_format: int = 1,
                  dtype: torch.dtype | None = None) -> torch.Tensor:
    """W [K, N] (y = x @ W) dequantized by the kernel's own tile code, in `dtype` (default the scales')."""
    K, N = qweight.shape[0] * 8, qweight.shape[1]
    dtype = dtype or scales.dtype
    probe = torch.empty((1, K), device=qweight.device, dtype=dtype)
    _check_device(probe)
    _check_operands(probe, qweight, qzeros, scales, g_idx, None, group_size, zero_format)
    w = torch.empty((K, N), device=qweight.device, dtype=dtype)
    block_k, block_n = w4a16_block_k(K, group_size), (256 if interpreted() else 128)
    with torch.cuda.device(qweight.device) if qweight.is_cuda else contextlib.nullcontext():   # sharded models
        w4a16_dequant_kernel[(K // block_k, triton.cdiv(N, block_n))](
            qweight, qzeros, scales, qweight if g_idx is None else g_idx, w, K, N, GROUP=group_size,
            ZP_ADD=V1_ZERO_WORD if zero_format == 1 else 0, ACT_ORDER=g_idx is not None, BLOCK_N=block_n,
            BLOCK_K=block_k)
    return w


def w4a16_matmul(x: torch.Tensor, qweight, qzeros, scales, g_idx=None, bias=None, group_size: int = 128,
                 zero_format: int = 1, tile: W4A16Tile | None = None) -> torch.Tensor:
    """y [..., N] = x [..., K] @ W + bias, W the GPTQ Int4 weight (module docstring), computed in fp32 and
    returned in x's dtype. zero_format: 1 for qzeros in the v1 layout (as stored in a `gptq` checkpoint),
    2 for v2 (as GPTQModel's kernels hold them after a load: module.qzero_format()). g_idx: act-order's
    group per input row, or None for i // group_size. Up to 16 rows: the fused kernel (tile: a fixed
    W4A16Tile instead of the default); more: w4a16_dequant, then torch.matmul."""
    _check_device(x)
    if x.dim() == 2 and 0 < x.shape[0] <= W4A16_MAX_ROWS and x.is_contiguous():    # a decode step: the short way
        return w4a16_plan(x, qweight, qzeros, scales, g_idx, bias, group_size, zero_format, tile).run(
            x, qweight, qzeros, scales, g_idx, bias)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    if x2.shape[0] == 0 or x2.shape[0] > W4A16_MAX_ROWS:
        _check_operands(x2, qweight, qzeros, scales, g_idx, bias, group_size, zero_format)
        w = w4a16_dequant(qweight, qzeros, scales, g_idx, group_size, zero_format, x2.dtype)
        y = torch.matmul(x2, w)
        if bias is not None:
            y = y + bias.to(y.dtype)
    else:
        y = w4a16_plan(x2, qweight, qzeros, scales, g_idx, bias, group_size, zero_format, tile).run(
            x2, qweight, qzeros, scales, g_idx, bias)
    return y.reshape(*lead, qweight.shape[1])


def _check_pair(gate, up) -> None:
    """The up projection's tensors must match the gate's (the plan checks the gate's alone), every call."""
    require((gate[3] is None) == (up[3] is None), "w4a16_gated_silu: give a bias to both projections or to neither")
    for name, a, b in zip(("qweight", "qzeros", "scales", "bias"), gate, up):
        if a is not None and not (a.shape == b.shape and a.dtype == b.dtype and a.device == b.device):
            require(False, f"w4a16_gated_silu: the up projection's {name} must match the gate's ({tuple(a.shape)}, "
                           f"{a.dtype}, {a.device}), got ({tuple(b.shape)}, {b.dtype}, {b.device})")
        if b is not None and not b.is_contiguous():
            require(False, f"w4a16_gated_silu: the up projection's {name} must be contiguous, got strides "
                           f"{b.stride()}: pass it .contiguous() (once, where the layer is built)")


def w4a16_gated_silu(x: torch.Tensor, gate: tuple, up: tuple, group_size: int = 128, zero_format: int = 1,
                     tile: W4A16Tile | None = None) -> torch.Tensor:
    """silu(x @ Wg + bg) * (x @ Wu + bu) in x's dtype: a gated MLP's gate and up projections (each a GPTQ
    Int4 layer, (qweight, qzeros, scales, bias), the same shapes, no act-order) in one launch that reads x
    once and applies the activation as it writes; the down projection's input. Each projection is rounded
    to x's dtype before silu, as two separate layers hand it over. Beyond 16 rows: two w4a16_matmul calls."""
    _check_device(x)
    _check_pair(gate, up)
    x2 = x.reshape(-1, x.shape[-1])
    if 0 < x2.shape[0] <= W4A16_MAX_ROWS and x2.is_contiguous():
        y = w4a16_plan(x2, *gate[:3], None, gate[3], group_size, zero_format, tile, gated=True).run(
            x2, *gate[:3], None, gate[3], second=up)
    else:
        g = w4a16_matmul(x2, *gate[:3], None, gate[3], group_size, zero_format)
        u = w4a16_matmul(x2, *up[:3], None, up[3], group_size, zero_format)
        y = (torch.nn.functional.silu(g.float()) * u.float()).to(x.dtype)
    return y.reshape(*x.shape[:-1], y.shape[-1])


# The op through torch.library's low-level registration: a schema, one Python kernel for CUDA and CPU, a fake
# for the compiler. torch.library.custom_op would do the same with more Python around each call (measured
# on the lent H100: 139 us an eager call through it against 74 for the function).
_LIB = torch.library.Library("quantlab", "FRAGMENT")
_LIB.define("w4a16_matmul(Tensor x, Tensor qweight, Tensor qzeros, Tensor scales, Tensor? g_idx, Tensor? bias, "
            "int group_size, int zero_format) -> Tensor")


for _key in ("CUDA", "CPU"):
    _LIB.impl("w4a16_matmul", w4a16_matmul, _key)     # the schema's arguments, in its order: no wrapper frame


_LIB.define("w4a16_gated_silu(Tensor x, Tensor qweight, Tensor qzeros, Tensor scales, Tensor? bias, "
            "Tensor up_qweight, Tensor up_qzeros, Tensor up_scales, Tensor? up_bias, int group_size, "
            "int zero_format) -> Tensor")


def _gated_impl(x, qweight, qzeros, scales, bias, up_qweight, up_qzeros, up_scales, up_bias, group_size, zero_format):
    return w4a16_gated_silu(x, (qweight, qzeros, scales, bias), (up_qweight, up_qzeros, up_scales, up_bias),
                            group_size, zero_format)


for _key in ("CUDA", "CPU"):
    _LIB.impl("w4a16_gated_silu", _gated_impl, _key)


@torch.library.register_fake("quantlab::w4a16_gated_silu")
def _gated_fake(x, qweight, qzeros, scales, bias, up_qweight, up_qzeros, up_scales, up_bias, group_size, zero_format):
    torch._check(x.shape[-1] == qweight.shape[0] * 8)
    return x.new_empty((*x.shape[:-1], qweight.shape[1]))


@torch.library.register_fake("quantlab::w4a16_matmul")
def _w4a16_fake(x, qweight, qzeros, scales, g_idx, bias, group_size, zero_format):
    torch._check(x.shape[-1] == qweight.shape[0] * 8)
    return x.new_empty((*x.shape[:-1], qweight.shape[1]))


w4a16_op = torch.ops.quantlab.w4a16_matmul.default   # what torch.compile sees: one node, in its CUDA graphs
w4a16_gated_op = torch.ops.quantlab.w4a16_gated_silu.default

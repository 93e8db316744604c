"""`gptq_backend: quantlab`: a loaded GPTQ model's quantized linear layers run the course's own W4A16 kernel.

Why: the Int4 model should decode faster than BF16 because it reads fewer bytes; that takes a kernel that
reads the packed weight once per call (utils.kernels.w4a16_matmul), not one that unpacks it whole. The
model is loaded as usual through GPTQModel (its torch kernel: no extension to build, the GPTQ layout
kept as is), then each quantized layer is swapped for a QuantlabLinear that holds the very same tensors:
no weight is copied or repacked, so the memory stays what the load took. A gated MLP (Qwen2's and
Llama's down(silu(gate(x)) * up(x))) then runs its gate and up projections in one launch that applies
silu as it writes (QuantlabGatedMLP), checked once per MLP class against the MLP's own forward.
"""
from __future__ import annotations

import warnings

import torch

from . import metrics
from .kernels.w4a16 import ZERO_FORMATS, w4a16_gated_op, w4a16_gated_silu, w4a16_matmul, w4a16_op

QUANTLAB = "quantlab"            # the gptq_backend name
LOADS_WITH = "gptq_torch"        # the GPTQModel kernel the checkpoint is loaded with before the swap


class QuantlabLinear(torch.nn.Module):
    """A GPTQ Int4 linear layer computed by w4a16_matmul, on the tensors of the layer it replaces.

    Eager calls go straight to the kernel's launch plan; under torch.compile the layer calls the custom
    op torch.ops.quantlab.w4a16_matmul, which the compiler keeps whole (no graph break)."""

    def __init__(self, source: torch.nn.Module):
        super().__init__()
        bits, pack = getattr(source, "bits", None), getattr(source, "pack_dtype", torch.int32)
        if bits != 4 or pack != torch.int32:
            raise ValueError(f"gptq_backend='quantlab' runs 4-bit GPTQ packed in int32; this layer has bits={bits}, "
                             f"pack_dtype={pack}: load it with another gptq_backend (gptq_torch)")
        qweight = source.qweight
        self.in_features, self.out_features = qweight.shape[0] * 8, qweight.shape[1]
        if (getattr(source, "in_features", self.in_features), getattr(source, "out_features", self.out_features)) != \
                (self.in_features, self.out_features):
            raise ValueError(f"gptq_backend='quantlab': layer padded ({source.in_features} -> {source.out_features} "
                             f"held as {self.in_features} -> {self.out_features}); use another gptq_backend")
        group = int(source.group_size)
        self.group_size = self.in_features if group in (-1, 0) else group
        self.zero_format = int(source.qzero_format()) if hasattr(source, "qzero_format") else 1
        if self.zero_format not in ZERO_FORMATS:
            raise ValueError(f"gptq_backend='quantlab': unknown qzeros format {self.zero_format}")
        self.register_buffer("qweight", qweight)
        self.register_buffer("qzeros", source.qzeros)
        self.register_buffer("scales", source.scales)
        g_idx = getattr(source, "g_idx", None)
        plain = g_idx is None or torch.equal(
            g_idx.long(), torch.arange(self.in_features, device=g_idx.device) // self.group_size)
        self.register_buffer("g_idx", None if plain else g_idx.to(torch.int32))
        self.register_buffer("bias", getattr(source, "bias", None))
        self.source_class = type(source).__name__

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        args = (x, self.qweight, self.qzeros, self.scales, self.g_idx, self.bias, self.group_size, self.zero_format)
        if torch.compiler.is_compiling():
            return w4a16_op(*args)
        return w4a16_matmul(*args)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}, "
                f"act_order={self.g_idx is not None}, bias={self.bias is not None}, from={self.source_class}")


class QuantlabGatedMLP(torch.nn.Module):
    """A gated MLP, down(silu(gate(x)) * up(x)), whose gate and up projections (QuantlabLinear) run as one
    w4a16_gated_silu launch: x read once, one launch and no separate activation kernel per layer. The three
    projections stay its submodules, on the same tensors; hooks on the MLP see what they saw before."""

    def __init__(self, mlp: torch.nn.Module):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj, self.act_fn = mlp.gate_proj, mlp.up_proj, mlp.down_proj, mlp.act_fn
        self.source_class = type(mlp).__name__

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_proj, self.up_proj
        if torch.compiler.is_compiling():
            h = w4a16_gated_op(x, g.qweight, g.qzeros, g.scales, g.bias, u.qweight, u.qzeros, u.scales, u.bias,
                               g.group_size, g.zero_format)
        else:
            h = w4a16_gated_silu(x, (g.qweight, g.qzeros, g.scales, g.bias), (u.qweight, u.qzeros, u.scales, u.bias),
                                 g.group_size, g.zero_format)
        return self.down_proj(h)


def gated_mlp_fusable(mlp: torch.nn.Module) -> bool:
    """Whether `mlp` looks like a gated SiLU MLP over QuantlabLinear layers that one launch can serve: gate
    and up of one shape, group and zero layout, no act-order (its per-row groups differ per layer)."""
    parts = [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    if not all(isinstance(m, QuantlabLinear) for m in parts) or not _is_silu(getattr(mlp, "act_fn", None)):
        return False
    g, u = parts[0], parts[1]
    return (g.g_idx is None and u.g_idx is None and (g.bias is None) == (u.bias is None)
            and g.qweight.shape == u.qweight.shape and g.scales.dtype == u.scales.dtype
            and (g.group_size, g.zero_format) == (u.group_size, u.zero_format))


def _is_silu(act) -> bool:
    """torch's SiLU, transformers' SiLUActivation or any module computing x * sigmoid(x)."""
    if not isinstance(act, torch.nn.Module):
        return False
    t = torch.linspace(-8, 8, 33)
    with torch.no_grad():
        return torch.allclose(act(t), torch.nn.functional.silu(t))


def agrees_with(mlp: torch.nn.Module, fused: QuantlabGatedMLP) -> bool:
    """One row through the MLP's own forward and through the fused one: a forward that is not
    down(silu(gate(x)) * up(x)) differs by far more than the one rounding the fusion moves."""
    g = mlp.gate_proj
    x = torch.randn(1, g.in_features, generator=torch.Generator().manual_seed(0)).to(g.scales.device, g.scales.dtype)
    with torch.no_grad():
        ref, got = mlp(x), fused(x)
    return metrics.relative_l2(got.float(), ref.float()) <= 1e-2


def swap_gptq_linears(model: torch.nn.Module, fuse_mlp: bool = True) -> list[str]:
    """Replace every GPTQ quantized linear layer of `model` (a module with qweight, qzeros and scales) by a
    QuantlabLinear on the same tensors, in place; returns the names swapped (an error if there are none).
    fuse_mlp: then each gated SiLU MLP over them becomes a QuantlabGatedMLP, once its class is checked."""
    names = [n for n, m in model.named_modules()
             if all(isinstance(getattr(m, a, None), torch.Tensor) for a in ("qweight", "qzeros", "scales"))
             and not isinstance(m, QuantlabLinear)]
    if not names:
        raise ValueError("gptq_backend='quantlab': this model has no GPTQ quantized layer to run")
    for name in names:
        replace_submodule(model, name, QuantlabLinear(model.get_submodule(name)))
    if fuse_mlp:
        checked: dict[type, bool] = {}
        for name, mlp in [(n, m) for n, m in model.named_modules() if gated_mlp_fusable(m)]:
            fused = QuantlabGatedMLP(mlp)
            if type(mlp) not in checked:
                checked[type(mlp)] = agrees_with(mlp, fused)
                if not checked[type(mlp)]:
                    warnings.warn(f"gptq_backend='quantlab': {type(mlp).__name__}'s forward is not "
                                  "down(silu(gate(x)) * up(x)); its projections run one launch each", stacklevel=2)
            if checked[type(mlp)]:
                replace_submodule(model, name, fused)
    return names


def replace_submodule(model: torch.nn.Module, name: str, new: torch.nn.Module) -> None:
    """model's submodule `name` (dotted) becomes `new`."""
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)

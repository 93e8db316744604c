"""`gptq_backend: quantlab`: a loaded GPTQ model's quantized linear layers run the course's own W4A16 kernel.

Why: the Int4 model should decode faster than BF16 because it reads fewer bytes; that takes a kernel that
reads the packed weight once per call (utils.kernels.w4a16_matmul), not one that unpacks it whole. The
model is loaded as usual through GPTQModel (its torch kernel: no extension to build, the GPTQ layout
kept as is), then each quantized layer is swapped for a QuantlabLinear that holds the very same tensors:
no weight is copied or repacked, so the memory stays what the load took.
"""
from __future__ import annotations

import torch

from .kernels.w4a16 import ZERO_FORMATS, w4a16_matmul, w4a16_op

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


def swap_gptq_linears(model: torch.nn.Module) -> list[str]:
    """Replace every GPTQ quantized linear layer of `model` (a module with qweight, qzeros and scales) by a
    QuantlabLinear on the same tensors, in place; returns the names swapped (an error if there are none)."""
    names = [n for n, m in model.named_modules()
             if all(isinstance(getattr(m, a, None), torch.Tensor) for a in ("qweight", "qzeros", "scales"))
             and not isinstance(m, QuantlabLinear)]
    if not names:
        raise ValueError("gptq_backend='quantlab': this model has no GPTQ quantized layer to run")
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, QuantlabLinear(getattr(parent, child)))
    return names

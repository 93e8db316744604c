"""The reference GPTQ unpacker: rebuild a GPTQ linear layer's dequantized weight from its tensors.

Why hand-written: this is the lesson of Lab 02 (what is inside an Int4 checkpoint), and a reference
that depends on no kernel lets Lab 04 tell a kernel's error from the quantization's own error.
Pure PyTorch, any device; checked bit-exact against GPTQModel's own kernel (`check_module`).

A GPTQ linear layer (in_features -> out_features, b bits, pack factor p = 32 / b, group size G) holds:
  qweight [in/p, out]  int32: p b-bit codes packed along the INPUT dim; code k of a word sits at
                        bits k*b .. k*b+b-1 (least significant first), i.e. row i*p + k of the weight;
  qzeros  [groups, out/p] int32: the zero points, packed the same way but along the OUTPUT dim;
  scales  [groups, out] float16: one scale per (group, output column);
  g_idx   [in] int32: the group of each input row (i // G without act-order; a permutation with it).
Dequantized: W[o, i] = scales[g_idx[i], o] * (q[i, o] - z[g_idx[i], o]), returned as [out, in]
(torch.nn.Linear's layout; GPTQModel's kernels build the transpose [in, out]).

The v1 quirk: checkpoints in the `gptq` format (v1: AutoGPTQ, Qwen's published Int4 models, and
GPTQModel's default when saving) store the zero points MINUS ONE (a symmetric 4-bit zero of 8 is
stored as 7). The subtraction is done on the whole int32 word: GPTQModel packs the true zeros, then
subtracts 0x11111111 (4 bits) from each word on save and adds it back on load
(`convert_gptq_v2_to_v1_format_module` / `convert_gptq_v1_to_v2_format_module`). So a zero point of
0 (asymmetric quantization of a group with no negative weight) borrows from the next nibble: zeros
(0, 5) are stored as nibbles (15, 3), not (15, 4). Read nibble by nibble, that word gives zeros 16
and 4; only the whole-word addition gives back 0 and 5, which is what this module does.
"""
from __future__ import annotations

import torch

FORMATS = ("gptq", "gptq_v2")


def _check_bits(bits: int) -> int:
    if bits not in (2, 4, 8):
        raise ValueError(f"bits={bits}: this unpacker handles 2, 4 and 8 bits (32 / bits codes per int32); "
                         "3-bit GPTQ packs codes across words and is not covered.")
    return 32 // bits


def unpack_int32(packed: torch.Tensor, bits: int = 4, dim: int = 0) -> torch.Tensor:
    """Unpack the 32/bits codes in each int32 along `dim` (least significant code first) -> int16 codes."""
    if packed.dtype != torch.int32:
        raise TypeError(f"packed tensor must be int32 (GPTQ packs into int32), got {packed.dtype}")
    p = _check_bits(bits)
    shifts = torch.arange(0, 32, bits, device=packed.device, dtype=torch.int32)
    x = packed.movedim(dim, -1).unsqueeze(-1)                      # [..., n, 1]
    codes = torch.bitwise_and(torch.bitwise_right_shift(x, shifts), (1 << bits) - 1)  # [..., n, p]
    codes = codes.reshape(*x.shape[:-2], x.shape[-2] * p)
    return codes.to(torch.int16).movedim(-1, dim)


def pack_int32(codes: torch.Tensor, bits: int = 4, dim: int = 0) -> torch.Tensor:
    """The inverse of unpack_int32: codes in [0, 2**bits) packed 32/bits per int32 along `dim`."""
    p = _check_bits(bits)
    if codes.shape[dim] % p:
        raise ValueError(f"dim {dim} has {codes.shape[dim]} codes, not a multiple of {p} (32 / bits={bits})")
    c = codes.to(torch.int64)
    if c.numel() and (int(c.min()) < 0 or int(c.max()) >= 1 << bits):
        raise ValueError(f"codes must lie in [0, {1 << bits}) for bits={bits}")
    c = c.movedim(dim, -1)
    c = c.reshape(*c.shape[:-1], c.shape[-1] // p, p)
    shifts = torch.arange(0, 32, bits, device=c.device, dtype=torch.int64)
    word = (c << shifts).sum(-1)                                   # 0 .. 2**32 - 1
    word = torch.where(word >= 2**31, word - 2**32, word)          # the same bits as a signed int32
    return word.to(torch.int32).movedim(-1, dim).contiguous()          # row-major, as a checkpoint stores it


def packed_shapes(n_in: int, n_out: int, bits: int, group_size: int) -> dict[str, tuple[int, ...]]:
    """The shapes a GPTQ layer's tensors have for in_features n_in and out_features n_out (the layout above):
    qweight [in * bits / 32, out], qzeros [groups, out * bits / 32], scales [groups, out], g_idx [in], with
    groups = ceil(in / group_size), one group for group_size -1. What the model check compares headers with."""
    if bits not in (2, 3, 4, 8):
        raise ValueError(f"bits={bits}: GPTQ packs 2, 3, 4 or 8 bits")
    if group_size != -1 and group_size < 1:
        raise ValueError(f"group_size={group_size}: a whole number >= 1, or -1 (one group)")
    groups = 1 if group_size == -1 else -(-n_in // group_size)
    return {"qweight": (n_in * bits // 32, n_out), "qzeros": (groups, n_out * bits // 32), "scales": (groups, n_out),
            "g_idx": (n_in,)}


def _check_format(format: str) -> None:
    if format not in FORMATS:
        raise ValueError(f"format={format!r}: use 'gptq' (v1, zeros stored minus one) or 'gptq_v2'")


def _v1_ones(bits: int) -> int:
    """The int32 word whose every code is 1 (0x11111111 for 4 bits): what v1 subtracts from a word."""
    return sum(1 << s for s in range(0, 32, bits))


def _wrap_int32(x: torch.Tensor) -> torch.Tensor:
    return ((x + 2**31) % 2**32 - 2**31).to(torch.int32)


def zero_points(qzeros: torch.Tensor, bits: int = 4, format: str = "gptq") -> torch.Tensor:
    """The true zero points [groups, out] from packed qzeros; `gptq` (v1) adds back the stored minus one
    to each whole int32 word (mod 2^32, carries crossing codes), as GPTQModel does on load."""
    _check_format(format)
    _check_bits(bits)
    if format == "gptq":
        qzeros = _wrap_int32(qzeros.to(torch.int64) + _v1_ones(bits))
    return unpack_int32(qzeros, bits, dim=1)


def pack_zero_points(zeros: torch.Tensor, bits: int = 4, format: str = "gptq") -> torch.Tensor:
    """The inverse of zero_points: true zeros [groups, out] -> packed qzeros [groups, out / (32 / bits)];
    `gptq` (v1) subtracts one from each whole word (mod 2^32), as GPTQModel does on save."""
    _check_format(format)
    packed = pack_int32(zeros, bits, dim=1)
    if format == "gptq":
        packed = _wrap_int32(packed.to(torch.int64) - _v1_ones(bits))
    return packed


def dequantize(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
               g_idx: torch.Tensor | None = None, bits: int = 4, format: str = "gptq",
               group_size: int | None = None) -> torch.Tensor:
    """The dequantized weight [out, in] in the scales' dtype, computed as scale * (q - z) once rounded.

    g_idx None means the plain grouping i // group_size (group_size None: in / number of groups).
    """
    q = unpack_int32(qweight, bits, dim=0)                         # [in, out]
    z = zero_points(qzeros, bits, format)[:, : scales.shape[1]]    # [groups, out]
    n_in, n_out = q.shape
    if scales.shape[1] != n_out or z.shape != scales.shape:
        raise ValueError(f"inconsistent GPTQ tensors: qweight unpacks to [in={n_in}, out={n_out}], "
                         f"zeros to {tuple(z.shape)}, scales are {tuple(scales.shape)}")
    if g_idx is None:
        group_size = group_size or n_in // scales.shape[0]
        g_idx = torch.arange(n_in, device=q.device) // group_size
    g = g_idx.to(device=q.device, dtype=torch.long)
    if g.shape != (n_in,) or int(g.max()) >= scales.shape[0] or int(g.min()) < 0:
        raise ValueError(f"g_idx must have {n_in} entries in [0, {scales.shape[0]}), got shape {tuple(g.shape)}")
    w = scales[g] * (q - z[g]).to(scales.dtype)                    # [in, out], one rounding
    return w.t().contiguous()


def read_layer(path, name: str) -> dict:
    """One GPTQ layer's tensors as stored in a checkpoint folder (sharded or not), `name` without suffix."""
    import json
    from pathlib import Path

    from safetensors import safe_open

    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        shard = weight_map.get(f"{name}.qweight")
    else:
        shard = "model.safetensors"
    out = {}
    if shard is not None and (path / shard).is_file():
        with safe_open(str(path / shard), framework="pt") as f:
            for key in ("qweight", "qzeros", "scales", "g_idx", "bias"):
                if f"{name}.{key}" in f.keys():
                    out[key] = f.get_tensor(f"{name}.{key}")
    if "qweight" not in out:
        raise KeyError(f"{name}.qweight is not in the checkpoint at {path}: list layers with layer_names(path)")
    return out


def layer_names(path) -> list[str]:
    """The names of every GPTQ layer in a checkpoint folder, in file order."""
    import json
    from pathlib import Path

    from safetensors import safe_open

    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        keys = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    else:
        with safe_open(str(path / "model.safetensors"), framework="pt") as f:
            keys = list(f.keys())
    return sorted({k[: -len(".qweight")] for k in keys if k.endswith(".qweight")},
                  key=lambda n: [int(t) if t.isdigit() else t for t in n.split(".")])


def gptqmodel_reference(tensors: dict, bits: int = 4, group_size: int = 128, sym: bool = True,
                        desc_act: bool = False, format: str = "gptq", device: str = "cpu"):
    """GPTQModel's own pure-torch kernel (TorchLinear) holding one layer's checkpoint tensors.

    It converts v1 zeros to v2 with GPTQModel's own convert_gptq_v1_to_v2_format_module, exactly as a
    model load does. torch.compile of its dequantize path is skipped (same code, eager).
    """
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    from gptqmodel.quantization import FORMAT
    from gptqmodel.utils.model import convert_gptq_v1_to_v2_format_module

    qweight = tensors["qweight"]
    n_in, n_out = qweight.shape[0] * (32 // bits), qweight.shape[1]
    mod = TorchLinear(bits=bits, group_size=group_size, sym=sym, desc_act=desc_act, in_features=n_in,
                      out_features=n_out, bias="bias" in tensors,
                      format=FORMAT.GPTQ if format == "gptq" else FORMAT.GPTQ_V2)
    for key, value in tensors.items():
        getattr(mod, key).data = value.clone().to(device)
    if format == "gptq":
        convert_gptq_v1_to_v2_format_module(mod, bits=bits, pack_dtype=torch.int32)
    mod.optimized = True
    mod.post_init()
    return mod.eval()


def kernel_dequantize(module) -> torch.Tensor:
    """A GPTQModel QuantLinear's own dequantized weight, as [out, in] (its kernels build [in, out])."""
    with torch.no_grad():
        w = module.dequantize_weight()
    return w.t().contiguous()


def gptq_linear_modules(model) -> dict:
    """{name: module} of every GPTQ quantized linear layer of a loaded model (anything with qweight)."""
    return {n: m for n, m in model.named_modules() if hasattr(m, "qweight") and hasattr(m, "qzeros")}


def gptq_kernel_classes(model) -> list[str] | None:
    """The GPTQ layer classes of a loaded model (None for an unquantized one, or no model), with
    QuantlabGatedMLP where gate and up run as one launch: what a run records as its kernels."""
    if model is None or not hasattr(model, "named_modules"):
        return None
    names = {type(m).__name__ for m in gptq_linear_modules(model).values()}
    names |= {type(m).__name__ for m in model.modules() if type(m).__name__ == "QuantlabGatedMLP"}
    return sorted(names) or None


def _gptq_layout(module, qweight: torch.Tensor) -> bool:
    q, z = getattr(module, "qweight", None), getattr(module, "qzeros", None)
    return (isinstance(q, torch.Tensor) and isinstance(z, torch.Tensor) and q.dtype == torch.int32
            and z.dtype == torch.int32 and q.shape == qweight.shape and hasattr(module, "dequantize_weight"))


# Kernels that compute in, or round their activations to, a coarser format by design (not a fault): the
# CPU's ATen int4 kernel casts the activations to bf16 and computes in bf16; GPTQModel's W4AFP8 kernel
# quantizes the activations to FP8 e4m3 per token.
COMPUTE_DTYPE = {"TorchAten": torch.bfloat16}
ACTIVATION_ROUNDING = {"W4AFP8": torch.float8_e4m3fn}


def kernel_tolerance(kernel_name: str, out_dtype: torch.dtype, x_dtype: torch.dtype, k: int) -> float:
    """The bound on a GPTQ kernel's output rel L2 against float64 x @ W.T on the same weight (k = in):
    metrics.matmul_error_bound in the coarsest of the output's, the activations' and the kernel's compute
    dtype, plus one rounding of the activations to it or to what the kernel rounds them to."""
    from .metrics import UNIT_ROUNDOFF, matmul_error_bound

    def coarsest(*dtypes):
        return max(dtypes, key=lambda d: UNIT_ROUNDOFF.get(d, 0.0))

    def by_name(table):
        return tuple(d for name, d in table.items() if kernel_name.startswith(name))

    low = coarsest(out_dtype, x_dtype, *by_name(COMPUTE_DTYPE))
    return matmul_error_bound(low, k, input_dtype=coarsest(low, *by_name(ACTIVATION_ROUNDING)))


def check_layer(tensors: dict, bits: int = 4, group_size: int = 128, sym: bool = True,
                desc_act: bool = False, format: str = "gptq", device: str = "cpu",
                kernel_module=None, dtype: torch.dtype | None = None, n_tokens: int = 4, seed: int = 0) -> dict:
    """Our unpacker on one layer's checkpoint tensors against GPTQModel.

    Weights: ours vs GPTQModel's TorchLinear.dequantize_weight, bit for bit. Outputs: the kernel that
    actually runs the model (`kernel_module`, e.g. the TorchAtenLinear or Marlin layer transformers
    picked; GPTQModel's TorchLinear when None) on random activations in `dtype` (the model's; default
    the scales' dtype), against float64 x @ W_ours.T.
    """
    from .metrics import max_abs_error, relative_l2

    tensors = {k: v.to(device) for k, v in tensors.items()}
    ours = dequantize(tensors["qweight"], tensors["qzeros"], tensors["scales"], tensors.get("g_idx"),
                      bits, format, group_size)
    ref_mod = gptqmodel_reference(tensors, bits, group_size, sym, desc_act, format, device)
    theirs = kernel_dequantize(ref_mod)
    exact = bool(ours.shape == theirs.shape and ours.dtype == theirs.dtype and torch.equal(ours, theirs))
    kernel = kernel_module if kernel_module is not None else ref_mod
    # The loaded kernel's own dequantize path too, while it still holds GPTQ-layout buffers (CPU's
    # TorchAtenLinear until its first forward); None where the kernel repacked them (Marlin, ...).
    model_exact = None
    if kernel_module is not None and _gptq_layout(kernel_module, tensors["qweight"]):
        try:
            mine = kernel_dequantize(kernel_module)
            model_exact = bool(mine.shape == ours.shape and torch.equal(mine.to(ours.dtype), ours))
        except Exception:  # noqa: BLE001 - a kernel without a usable dequantize path: not comparable
            model_exact = None
    if dtype is None:
        scales = getattr(kernel, "scales", None)
        dtype = scales.dtype if scales is not None and scales.is_floating_point() else torch.float16
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n_tokens, ours.shape[1], generator=gen).to(device=device, dtype=dtype)
    with torch.no_grad():
        out = kernel(x)
    ref = x.double() @ ours.double().t()
    if tensors.get("bias") is not None:
        ref = ref + tensors["bias"].double()
    # same weight on both sides (checked bit-exact): only the kernel's arithmetic differs
    rel, tol = relative_l2(out, ref), kernel_tolerance(type(kernel).__name__, out.dtype, x.dtype, ours.shape[1])
    return {"shape_out_in": list(ours.shape), "weight_dtype": str(ours.dtype).replace("torch.", ""),
            "reference_kernel": type(ref_mod).__name__,
            "weight_max_abs_diff": max_abs_error(ours.float(), theirs.float()) if ours.shape == theirs.shape
            else float("inf"), "weight_bit_exact": exact,
            "model_kernel_weight_bit_exact": model_exact, "output_kernel": type(kernel).__name__, "output_dtype": str(out.dtype).replace("torch.", ""),
            "output_rel_l2": rel, "output_tolerance": tol, "output_ok": bool(rel <= tol)}


def pack_gptq_int4(w: torch.Tensor, group_size: int = 128):
    """Quantize w [K, N] (y = x @ w) to GPTQ v1 Int4, symmetric (the course's sym=True): per group of K
    and column, s = 2 max|w| / 15 and zero 8; returns (qweight int32 [K/8, N], qzeros int32 [K/g, N/8]
    holding zero - 1 = 7, scales fp16 [K/g, N]). Round-to-nearest here (GPTQ proper chooses the codes
    with second-order information; the layout is the same, packed by pack_int32)."""
    K, N = w.shape
    if not (K % group_size == 0 and group_size % 8 == 0 and N % 8 == 0):
        raise ValueError(f"need K % group_size == 0, group_size % 8 == 0, N % 8 == 0; got K={K}, N={N}, group_size={group_size}")
    wg = w.detach().float().reshape(K // group_size, group_size, N)   # on w's device: the same IEEE ops
    scales = (wg.abs().amax(1).clamp(min=1e-8) * 2 / 15).half()
    s = scales.float()
    zeros = torch.full_like(s, 8, dtype=torch.int32)
    q = torch.clamp(torch.round(wg / s[:, None, :]) + 8, 0, 15).to(torch.int32).reshape(K, N)
    qweight = pack_int32(q, bits=4, dim=0)
    qzeros = pack_zero_points(zeros, bits=4, format="gptq")   # v1 stores zero - 1 (no borrow: zero is 8)
    return qweight.to(w.device), qzeros.to(w.device), scales.to(w.device)


def dequant_gptq_int4(qweight, qzeros, scales, group_size: int = 128) -> torch.Tensor:
    """The reference: fp32 weights [K, N] = (q - z) * s from the GPTQ v1 layout, z the true zero points
    (this module's unpacker, with the scales in fp32 so the product is not rounded to fp16)."""
    return dequantize(qweight, qzeros, scales.float(), group_size=group_size).t()

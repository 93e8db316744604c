"""Every GPTQ kernel of GPTQModel on one layer's checkpoint tensors, side by side: which run here, how
far each output is from the float64 product on the reference weight, and what a decode call costs.

Why: the kernel is part of the device under test. The same Int4 checkpoint runs through Marlin on an
RTX 4090, Triton or torch on a ROCm box, ATen int4 on a laptop CPU: a student should see which one ran
and how it compares. The kernels and whether each runs here come from GPTQModel itself (its backend
table, each class's own validate), so one that cannot run shows the library's reason, not ours.
"""
from __future__ import annotations

import contextlib
import statistics
from unittest import mock

import torch

from . import gptq
from .metrics import relative_l2
from .timing import time_op

GEMV = "int4_gemv (quant-lab)"   # the row of the project's own Triton GEMV (utils.kernels.int4_gemv)
QUANTLAB = "quantlab"            # the row of the course's W4A16 kernel (utils.kernels.w4a16_matmul, gptq_backend quantlab)
TIMED_ROWS = (1, 16)             # rows of x each running kernel is also timed at: a decode step at batch 1 and 16


class KernelUnavailable(RuntimeError):
    """A GPTQ kernel that cannot be built or run on this machine; `reason` is the library's own words."""

    def __init__(self, backend: str, reason: str):
        super().__init__(f"GPTQ backend {backend!r} cannot run here: {reason}")
        self.backend, self.reason = backend, reason


def kernel_classes(bits: int = 4, sym: bool = True) -> dict:
    """{backend name: QuantLinear class} for GPTQ checkpoints in the `gptq` (v1) format, read from
    GPTQModel's own table (utils.importer), in its order of preference, keeping the kernels whose
    declared SUPPORTS_BITS / SUPPORTS_SYM admit `bits` and `sym`. Whether one runs on this machine
    is not decided here (build_kernel asks the class)."""
    from gptqmodel.quantization import FORMAT, METHOD
    from gptqmodel.utils.importer import BACKEND_TO_METHOD_FORMAT_MAPPING, get_kernel_for_backend

    out = {}
    for backend in BACKEND_TO_METHOD_FORMAT_MAPPING[METHOD.GPTQ][FORMAT.GPTQ]:
        cls = get_kernel_for_backend(backend, METHOD.GPTQ, FORMAT.GPTQ)
        if bits in cls.SUPPORTS_BITS and sym in getattr(cls, "SUPPORTS_SYM", [sym]):
            out[backend.value] = cls
    return out


@contextlib.contextmanager
def compiling(allowed: bool):
    """GPTQModel compiles a CUDA extension it lacks (Marlin, ExLlama v2, ...) with nvcc on first use:
    minutes each (its own reference timings: 35 s to 3 min on a large host). Unless `allowed`, that
    compile is refused: GPTQModel then reports the kernel unavailable with this reason, and keeps it so
    for the rest of the process (restart to compile). An extension already built loads as usual."""
    if allowed:
        yield
        return
    from gptqmodel.utils import cpp

    def refuse(**kwargs):
        raise RuntimeError(f"{kwargs.get('name', 'this extension')} is not built here and is not compiled now "
                           "(nvcc, minutes): compile_extensions=True compiles it")

    with mock.patch.object(cpp, "load", refuse):   # the one call through which GPTQModel compiles
        yield


def build_kernel(backend: str, tensors: dict, device, dtype: torch.dtype | None = None, bits: int = 4,
                 group_size: int = 128, sym: bool = True, desc_act: bool = False, compile_extensions: bool = False):
    """A GPTQModel QuantLinear of `backend` holding one layer's checkpoint tensors (`utils.gptq.read_layer`:
    qweight, qzeros, scales, g_idx, v1 `gptq` format), ready to call, as a model load makes it: the class
    validates the config and device, is built, gets the tensors, converts v1 zeros to v2 with GPTQModel's
    own function when it declares REQUIRES_FORMAT_V2, then GPTQModel's post-init (repacking, scratch
    space). torch.compile of the torch kernel is skipped (same code, eager), as in gptq.gptqmodel_reference;
    a missing CUDA extension is compiled only with compile_extensions (see `compiling`).
    Raises KernelUnavailable with the library's reason when it cannot be built here."""
    from gptqmodel.utils.importer import validate_quant_linear

    classes = kernel_classes(bits, sym)
    if backend not in classes:
        raise ValueError(f"backend={backend!r} is not a GPTQ kernel of GPTQModel for {bits}-bit sym={sym}; "
                         f"use one of {sorted(classes)}")
    cls, device = classes[backend], torch.device(device)
    dtype = dtype or tensors["scales"].dtype
    n_in, n_out = tensors["qweight"].shape[0] * (32 // bits), tensors["qweight"].shape[1]
    with compiling(compile_extensions):
        ok, err = validate_quant_linear(cls, bits=bits, group_size=group_size, desc_act=desc_act, sym=sym,
                                        pack_dtype=torch.int32, dtype=dtype, in_features=n_in, out_features=n_out,
                                        device=device)
        if not ok:
            raise KernelUnavailable(backend, str(err) or type(err).__name__)
        return _built(backend, cls, tensors, device, dtype, bits, group_size, sym, desc_act, n_in, n_out)


def _built(backend, cls, tensors, device, dtype, bits, group_size, sym, desc_act, n_in, n_out):
    """The class built and loaded as a model load does (build_kernel, after the class's validate)."""
    from gptqmodel.nn_modules.qlinear import GPTQQuantLinear
    from gptqmodel.quantization import FORMAT
    from gptqmodel.utils.backend import BACKEND
    from gptqmodel.utils.model import convert_gptq_v1_to_v2_format_module, gptqmodel_post_init

    try:
        extra = {"format": FORMAT.GPTQ} if issubclass(cls, GPTQQuantLinear) else {}
        mod = cls(bits=bits, group_size=group_size, desc_act=desc_act, sym=sym, in_features=n_in,
                  out_features=n_out, pack_dtype=torch.int32, bias="bias" in tensors, dtype=dtype,
                  backend=BACKEND(backend), register_buffers=True, adapter=None, name=backend,
                  lm_head_name=None, **extra).to(device)
        for key, value in tensors.items():   # copies: the v1 -> v2 conversion adds to qzeros in place
            target = getattr(mod, key)
            target.data = value.to(device, target.dtype if value.is_floating_point() else value.dtype, copy=True)
        if getattr(cls, "REQUIRES_FORMAT_V2", False):
            convert_gptq_v1_to_v2_format_module(mod, bits=bits, pack_dtype=torch.int32)
        mod.optimized = True                        # no torch.compile: eager, as gptqmodel_reference
        holder = torch.nn.Module()       # GPTQModel's post-init walks a model (it allocates ExLlama's scratch)
        holder.layer = mod
        gptqmodel_post_init(holder, use_act_order=desc_act)
        # ExLlama's kernel keeps a raw pointer into that scratch: it lives as long as the layer does
        mod.post_init_scratch = getattr(holder, "device_tensors", None)
    except Exception as exc:  # noqa: BLE001 - the library's own refusal (a missing extension, ...)
        raise KernelUnavailable(backend, f"{type(exc).__name__}: {exc}") from exc
    return mod.eval()


def _row(backend, kernel, call, x, ref, device, repeats) -> dict:
    """Run call(x) once against ref, then time it (utils.timing.time_op: CUDA events or perf_counter), and
    at each of TIMED_ROWS rows of x (us_at_rows; None where the kernel refuses that many rows)."""
    with torch.no_grad():
        out = call(x)
        rel = relative_l2(out, ref)
        tol = gptq.kernel_tolerance(kernel, out.dtype, x.dtype, x.shape[-1])
        us = statistics.median(time_op(lambda: call(x), device, warmup=3, repeats=repeats)) * 1e6
        at_rows = {}
        for m in TIMED_ROWS:
            xm = x[:1].expand(m, -1).contiguous()
            try:
                at_rows[m] = statistics.median(time_op(lambda: call(xm), device, warmup=3, repeats=repeats)) * 1e6
            except Exception:  # noqa: BLE001 - a batch-1 kernel at 16 rows: not timed there
                at_rows[m] = None
    return {"backend": backend, "kernel": kernel, "runs": True, "ok": bool(rel <= tol), "rel_l2": rel,
            "tolerance": tol, "us_per_call": us, **{f"us_at_{m}_rows": v for m, v in at_rows.items()}, "reason": None}


def _absent(backend, kernel, reason) -> dict:
    reason = " ".join(str(reason).split())      # one line, cut short: the table shows it whole
    return {"backend": backend, "kernel": kernel, "runs": False, "ok": None, "rel_l2": None, "tolerance": None,
            "us_per_call": None, **{f"us_at_{m}_rows": None for m in TIMED_ROWS}, "reason": reason[:240]}


def _gemv_row(tensors, x, ref, device, group_size, repeats) -> dict:
    """The project's Triton Int4 GEMV on the same tensors: a CUDA kernel for batch 1, v1 zeros, g_idx = i // G."""
    g_idx, name = tensors.get("g_idx"), "utils.kernels.int4_gemv"
    if device.type != "cuda":
        return _absent(GEMV, name, f"the project's int4_gemv is a Triton kernel for a CUDA GPU (decode, batch 1); "
                       f"this device is {device.type}")
    if x.shape[0] != 1:
        return _absent(GEMV, name, f"int4_gemv is a batch-1 GEMV; batch={x.shape[0]}")
    if g_idx is not None and not torch.equal(g_idx.cpu().long(), torch.arange(g_idx.numel()) // group_size):
        return _absent(GEMV, name, "act-order g_idx: int4_gemv reads group i // group_size")
    from .kernels import int4_gemv

    qw, qz, s = (tensors[k].to(device) for k in ("qweight", "qzeros", "scales"))
    bias = tensors["bias"].to(device, x.dtype) if "bias" in tensors else None
    try:
        call = lambda v: int4_gemv(v, qw, qz, s, group_size) + (0 if bias is None else bias)  # noqa: E731
        return _row(GEMV, name, call, x, ref, device, repeats)
    except Exception as exc:  # noqa: BLE001 - kept in the table with its reason
        return _absent(GEMV, name, f"{type(exc).__name__}: {exc}")


def _quantlab_row(tensors, x, ref, device, group_size, repeats) -> dict:
    """The course's W4A16 kernel on the same v1 tensors (gptq_backend quantlab runs it on the loaded ones)."""
    from .kernels import interpreted

    name = "QuantlabLinear (utils.kernels.w4a16_matmul)"
    if device.type != "cuda" and not interpreted():
        return _absent(QUANTLAB, name, f"the W4A16 kernel is a Triton kernel for a GPU; this device is {device.type}")
    from .kernels.w4a16 import w4a16_matmul

    qw, qz, s = (tensors[k].to(device) for k in ("qweight", "qzeros", "scales"))
    g_idx = tensors.get("g_idx")
    n_in = qw.shape[0] * 8
    if g_idx is not None and torch.equal(g_idx.cpu().long(), torch.arange(n_in) // group_size):
        g_idx = None
    g_idx = None if g_idx is None else g_idx.to(device, torch.int32)
    bias = tensors["bias"].to(device) if tensors.get("bias") is not None else None
    try:
        call = lambda v: w4a16_matmul(v, qw, qz, s, g_idx, bias, group_size, 1)  # noqa: E731
        return _row(QUANTLAB, name, call, x, ref, device, repeats)
    except Exception as exc:  # noqa: BLE001 - kept in the table with its reason
        return _absent(QUANTLAB, name, f"{type(exc).__name__}: {exc}")


def compare_kernels(tensors: dict, device, backends=None, dtype: torch.dtype | None = None, batch: int = 1,
                    repeats: int = 20, bits: int = 4, group_size: int = 128, sym: bool = True,
                    desc_act: bool = False, seed: int = 0, compile_extensions: bool = False) -> list[dict]:
    """One row per GPTQ kernel (all of kernel_classes() when backends is None, plus the project's int4_gemv
    and W4A16 kernel, gptq_backend quantlab):
    backend, kernel class, runs, reason (why not, in the library's words), rel_l2 of its output on random
    activations [batch, in] in `dtype` (default the scales') against float64 x @ W.T with W from
    utils.gptq.dequantize, the derived tolerance, ok (rel_l2 <= tolerance; False is a finding, not an
    error), us_per_call (median of `repeats` timed calls) and us_at_<m>_rows for m in TIMED_ROWS. Rows that cannot run are kept, with why.
    compile_extensions: let GPTQModel compile the CUDA extensions it lacks (minutes each; see `compiling`)."""
    classes = kernel_classes(bits, sym)
    names = list(classes) if backends is None else list(backends)
    unknown = [b for b in names if b not in classes]
    if unknown:
        raise ValueError(f"backends: {unknown} are not GPTQ kernels of GPTQModel for {bits}-bit sym={sym}; "
                         f"use names from {sorted(classes)} (or backends=None for all)")
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    device = torch.device(device)
    dtype = dtype or tensors["scales"].dtype
    w = gptq.dequantize(tensors["qweight"], tensors["qzeros"], tensors["scales"], tensors.get("g_idx"), bits,
                        "gptq", group_size)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, w.shape[1], generator=gen).to(device=device, dtype=dtype)
    ref = x.cpu().double() @ w.double().t() + (tensors["bias"].double() if tensors.get("bias") is not None else 0)
    rows = []
    for name in names:
        try:
            mod = build_kernel(name, tensors, device, dtype, bits, group_size, sym, desc_act, compile_extensions)
        except KernelUnavailable as exc:
            rows.append(_absent(name, classes[name].__name__, exc.reason))
            continue
        try:
            with compiling(compile_extensions):     # a kernel may load its extension on the first call
                rows.append(_row(name, classes[name].__name__, mod, x, ref, device, repeats))
        except Exception as exc:  # noqa: BLE001 - built but its forward fails here: kept with the reason
            rows.append(_absent(name, classes[name].__name__, f"forward: {type(exc).__name__}: {exc}"))
    if backends is None:
        rows.append(_gemv_row(tensors, x, ref, device, group_size, repeats))
        rows.append(_quantlab_row(tensors, x, ref, device, group_size, repeats))
    return rows

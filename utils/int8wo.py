"""torchao Int8 weight-only quantization, saved and reloaded as torchao's own test does it.

The test (test/quantization/test_quant_api.py::TestQuantFlow::test_int8_wo_quant_save_load) quantizes
a two-layer toy model with quantize_(model, Int8WeightOnlyConfig()), saves its state dict with
torch.save, loads it into a fresh model (load_state_dict(assign=True)), runs it, and compares with
torch.testing.assert_close's float32 defaults (atol 1e-5, rtol 1.3e-6). On ROCm that failed
(pytorch/ao#2460: 63 of 64 elements off, max abs diff 5.7e-4) and was fixed by loosening the
tolerance for ROCm alone. Here the same round trip runs within one device and across two.
"""
from __future__ import annotations

import io
import logging
import math
import tempfile
import warnings
from pathlib import Path

import torch

from .metrics import matmul_error_bound, max_abs_error, relative_l2, sqnr_db

ASSERT_CLOSE_FP32 = {"atol": 1e-5, "rtol": 1.3e-6}   # torch.testing.assert_close defaults for float32


class ToyLinearModel(torch.nn.Module):
    """torchao's test model: Linear(m, n) then Linear(n, k), no bias; input [1, m]."""

    def __init__(self, m: int = 64, n: int = 32, k: int = 64):
        super().__init__()
        self.linear1 = torch.nn.Linear(m, n, bias=False)
        self.linear2 = torch.nn.Linear(n, k, bias=False)

    def forward(self, x):
        return self.linear2(self.linear1(x))


def quantized_toy(device: str, seed: int = 0) -> ToyLinearModel:
    """A ToyLinearModel made on the CPU from `seed`, moved to `device`, then quantize_'d there."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    torch.manual_seed(seed)
    model = ToyLinearModel().eval().to(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_(model, Int8WeightOnlyConfig())
    return model


def _reload_torch_save(model) -> dict:
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def _reload_safetensors(model) -> dict:
    from safetensors.torch import load_file, save_file
    from torchao.prototype.safetensors.safetensors_support import (flatten_tensor_state_dict,
                                                                   unflatten_tensor_state_dict)

    data, meta = flatten_tensor_state_dict(model.state_dict())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        save_file(data, str(path), metadata=meta)
        loaded = load_file(str(path))
        from safetensors import safe_open
        with safe_open(str(path), framework="pt") as fh:
            meta2 = fh.metadata()
    sd, _ = unflatten_tensor_state_dict(loaded, meta2)
    return sd


def round_trip(quant_device: str, run_device: str, fmt: str = "torch.save", seed: int = 0) -> dict:
    """Quantize on quant_device and run there (the reference), save + reload, run on run_device.

    Returns both outputs (CPU tensors) and the checks: bit-identical, torch.testing.assert_close as
    the test wrote it, SQNR, and relative L2 against a bound derived from fp32 and the reduction length.
    """
    if fmt not in ("torch.save", "safetensors"):
        raise ValueError(f"fmt must be 'torch.save' or 'safetensors', got {fmt!r}")
    logging.getLogger("torchao").setLevel(logging.ERROR)
    model = quantized_toy(quant_device, seed)
    torch.manual_seed(seed + 1)
    x = torch.randn(1, 64)
    with torch.no_grad():
        ref = model(x.to(quant_device)).cpu()
    sd = _reload_torch_save(model) if fmt == "torch.save" else _reload_safetensors(model)
    fresh = ToyLinearModel().eval()
    fresh.load_state_dict(sd, assign=True)
    fresh = fresh.to(run_device)
    with torch.no_grad():
        res = fresh(x.to(run_device)).cpu()
    try:
        torch.testing.assert_close(res, ref)
        assert_close = "passed"
    except AssertionError as exc:
        assert_close = "FAILED: " + " ".join(str(exc).split("\n")[1:3]).strip()
    # principled: two fp32 layers (K = 64 and 32), each within metrics.matmul_error_bound of exact;
    # both runs are held to it, so their difference to twice that
    bound = 2 * 2 * matmul_error_bound(torch.float32, 64)
    diff = (res - ref).abs()
    return {"quantized_on": quant_device, "run_on": run_device, "format": fmt,
            "bit_identical": bool(torch.equal(res, ref)), "max_abs_diff": max_abs_error(res, ref),
            "elements_off_at_default_tol": int((diff > ASSERT_CLOSE_FP32["atol"] + ASSERT_CLOSE_FP32["rtol"] * ref.abs()).sum()),
            "elements": ref.numel(), "assert_close_default": assert_close, "sqnr_db": sqnr_db(res, ref),
            "relative_l2": relative_l2(res, ref), "derived_bound": bound,
            "derived_bound_passes": relative_l2(res, ref) <= bound,
            "output": res, "reference": ref}


def summary_row(r: dict) -> dict:
    """round_trip's result without the tensors, for a table."""
    return {k: (round(v, 2) if isinstance(v, float) and math.isfinite(v) and k == "sqnr_db" else v)
            for k, v in r.items() if k not in ("output", "reference")}

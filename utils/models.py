"""Loading the golden and the quantized model the same way, wherever they came from.

Why: every lab after Lab 02 receives two folders (a modelscope snapshot or the embedded fixture)
and must not care which. GPTQ checkpoints load through transformers' own GPTQ integration
(optimum + GPTQModel), exactly as a student's notebook would.
"""
from __future__ import annotations

import json
from pathlib import Path


def _config(path: str | Path) -> dict:
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        raise FileNotFoundError(
            f"{path} is not a model folder (no config.json): give the folder of a transformers "
            "checkpoint, e.g. the one Lab 02 fetched or fixtures/tiny-qwen2-gsm/bf16."
        )
    return json.loads(cfg.read_text(encoding="utf-8"))


def is_gptq(path: str | Path) -> bool:
    """True when the checkpoint's config declares a GPTQ quantization_config."""
    q = _config(path).get("quantization_config") or {}
    return str(q.get("quant_method", "")).lower() == "gptq"


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    _config(path)
    return AutoTokenizer.from_pretrained(str(path))


def default_dtype(path: str | Path, device: str):
    """float32 on CPU (the reference), bfloat16 for BF16 checkpoints on a GPU, float16 for GPTQ on a GPU
    (GPTQ kernels are written for fp16 activations)."""
    import torch

    if str(device).startswith("cpu"):
        return torch.bfloat16 if is_gptq(path) else torch.float32
    return torch.float16 if is_gptq(path) else torch.bfloat16


def gptq_backend(device: str) -> str:
    """Which GPTQModel kernel to ask for: $QUANTLAB_GPTQ_BACKEND if set, else "auto" on CPU and
    "gptq_triton" on a GPU.

    Why not "auto" on a GPU: on Hopper (H100/H200) GPTQModel 7.6's auto choice is its Machete kernel,
    which downloads CUTLASS and compiles it at load time; offline that fails with a URLError (measured
    on the device machine). The Triton kernel needs only Triton and runs on NVIDIA and ROCm alike.
    """
    import os

    chosen = os.environ.get("QUANTLAB_GPTQ_BACKEND", "").strip().lower()
    return chosen or ("auto" if str(device).startswith("cpu") else "gptq_triton")


def gptq_loading_config(path: str | Path, device: str):
    """The quantization_config to pass to from_pretrained for a GPTQ checkpoint (None otherwise)."""
    if not is_gptq(path):
        return None
    from transformers import GPTQConfig

    q = _config(path)["quantization_config"]
    return GPTQConfig(bits=q["bits"], group_size=q.get("group_size", 128), backend=gptq_backend(device))


def load_model(path: str | Path, device: str = "cpu", dtype=None, param: str = "model"):
    """A causal LM in eval mode on `device`; GPTQ checkpoints through transformers' GPTQ integration.

    A damaged weight file fails naming `param`, the file and what to do (not safetensors' bare error).
    """
    from transformers import AutoModelForCausalLM

    from .fetch import check_weight_files

    check_weight_files(path, param)

    dtype = dtype or default_dtype(path, device)
    kwargs = {"dtype": dtype}
    if is_gptq(path):
        kwargs["device_map"] = str(device)
        kwargs["quantization_config"] = gptq_loading_config(path, device)
    model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    if not is_gptq(path):
        model = model.to(device)
    return model.eval()

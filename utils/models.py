"""Loading the golden and the quantized model the same way, wherever they came from.

Why: every lab after Lab 02 receives two folders (a modelscope snapshot or the embedded fixture)
and must not care which. GPTQ checkpoints load through transformers' own GPTQ integration
(optimum + GPTQModel), exactly as a student's notebook would.
"""
from __future__ import annotations

import os
from pathlib import Path

from .model_check import check_model, read_json  # noqa: F401 - check_model: the labs call models.check_model


def _config(path: str | Path, param: str = "model") -> dict:
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        raise FileNotFoundError(
            f"{param}: {path} is not a model folder (no config.json): give the folder of a transformers "
            "checkpoint, e.g. the one Lab 02 fetched or fixtures/tiny-qwen2-gsm/bf16."
        )
    return read_json(cfg, param)


def is_gptq(path: str | Path) -> bool:
    """True when the checkpoint's config declares a GPTQ quantization_config."""
    q = _config(path).get("quantization_config") or {}
    return str(q.get("quant_method", "")).lower() == "gptq"


def load_tokenizer(path: str | Path, param: str = "model"):
    """The folder's tokenizer, once check_model found its files present, loadable and matching the embedding."""
    from transformers import AutoTokenizer

    check_model(path, param)
    return AutoTokenizer.from_pretrained(str(path))


def default_dtype(path: str | Path, device: str):
    """float32 on CPU (the reference), bfloat16 for BF16 checkpoints on a GPU, float16 for GPTQ on a GPU
    (GPTQ kernels are written for fp16 activations)."""
    import torch

    if str(device).startswith("cpu"):
        return torch.bfloat16 if is_gptq(path) else torch.float32
    return torch.float16 if is_gptq(path) else torch.bfloat16


# GPTQModel 7.6's kernels that work on ROCm (torch's "cuda" device on AMD). Its source decides:
# TorchQuantLinear declares every device (nn_modules/qlinear/torch.py:128, SUPPORTS_DEVICES = [DEVICE.ALL]);
# TritonV2QuantLinear runs wherever Triton does, ROCm included, but is marked unvalidated there
# (tritonv2.py:67-68). Marlin and Machete raise on ROCm (marlin.py:316, machete.py:202), ExLlama v2
# is "broken accuracies" on ROCm (exllamav2.py:51) and would still be picked by "auto" (the torch
# device is "cuda" on ROCm, so its CUDA-only declaration passes): never "auto" on ROCm.
ROCM_SAFE_GPTQ = ("gptq_torch", "gptq_triton")
GPTQ_ENV = "QUANTLAB_GPTQ_BACKEND"
# Every name gptq_backend accepts, and where the kernel comes from: the one list every check reads. GPTQModel's
# are its kernels for GPTQ (v1) checkpoints and its own choosers (tests/test_model_check.py checks them against
# GPTQModel's table); a kernel of this project joins by adding its name here with "quant-lab".
GPTQ_KERNELS = {name: "gptqmodel" for name in (
    "auto", "auto_trainable", "gptq_torch", "gptq_torch_aten", "gptq_torch_fused", "gptq_torch_int8", "gptq_triton",
    "gptq_marlin", "gptq_machete", "gptq_exllama_v2", "gptq_bitblas", "gptq_swordfish", "gptq_w4afp8",
    "gptq_w4a_nvfp4", "mlx")}
QUANTLAB = "quantlab"   # the course's own W4A16 kernel: loaded through gptq_torch, then swapped (utils.quantlab_linear)
GPTQ_KERNELS[QUANTLAB] = "quant-lab"


def kernel_name(requested="auto", environ=None) -> tuple[str, str]:
    """(the kernel asked for, where it was set): $QUANTLAB_GPTQ_BACKEND if set, else `requested` (empty: auto).
    An unknown name is a ValueError naming the variable or the parameter and the valid kernels, before any
    loading. environ: the environment to read (default os.environ; the chain checks a profile's env with it)."""
    env = (os.environ if environ is None else environ).get(GPTQ_ENV, "").strip()
    raw = env or str(requested if requested is not None else "").strip() or "auto"
    source = f"${GPTQ_ENV}" if env else "gptq_backend"
    chosen = raw.lower()
    if chosen not in GPTQ_KERNELS:
        fix = (f"set {GPTQ_ENV} to one of them or unset it (it overrides the labs' gptq_backend parameter)" if env
               else "set gptq_backend to one of them (auto lets the course choose)")
        raise ValueError(f"{source}={raw!r} is not a GPTQ kernel: the kernels are {', '.join(GPTQ_KERNELS)}; {fix}")
    return chosen, source


def gptq_backend(device: str, requested: str = "auto", *, record=None, rocm_safe: bool = True) -> str:
    """Which GPTQModel kernel to ask for: $QUANTLAB_GPTQ_BACKEND if set (an override), else `requested`
    (a lab's gptq_backend parameter); "auto" means "auto" on CPU, "gptq_torch" on ROCm, "quantlab" on an
    NVIDIA GPU, "gptq_triton" on another. "quantlab" is the course's own W4A16 kernel (utils.quantlab_linear:
    loaded through gptq_torch, then swapped), refused on a CPU outside Triton's interpreter. record:
    utils.platform's PlatformRecord (detected when None). With rocm_safe, a kernel that does not work on ROCm
    is refused there (ValueError naming the parameter).

    Why quantlab on an NVIDIA GPU: measured on the H100 (docs/kernels.md), it decodes the Int4 model faster
    than BF16 and than GPTQModel's Triton kernel, generates what gptq_torch generates on the trained
    fixture, and needs only Triton. Not GPTQModel's own "auto": on Hopper its choice is Machete, which
    downloads CUTLASS and compiles it at load time; offline that fails with a URLError.
    """
    chosen, source = kernel_name(requested)
    on_cpu = str(device).startswith("cpu")
    rocm = False
    if not on_cpu:
        if record is None:
            from .platform import detect_platform
            record = detect_platform()
        rocm = getattr(record, "backend", "") == "rocm"
    if chosen == "auto":
        if on_cpu:
            return "auto"
        return "gptq_torch" if rocm else (QUANTLAB if getattr(record, "backend", "") == "cuda" else "gptq_triton")
    if chosen == QUANTLAB and on_cpu and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(f"{source}={chosen!r} is a Triton kernel for a GPU; on a CPU use auto or gptq_torch")
    if rocm and rocm_safe and chosen not in ROCM_SAFE_GPTQ:
        raise ValueError(f"{source}={chosen!r} is not a GPTQ kernel that works on ROCm (GPTQModel 7.6: "
                         f"Marlin, Machete raise there, ExLlama v2 gives wrong results); use one of "
                         f"{list(ROCM_SAFE_GPTQ)} or auto, or set rocm_safe_kernels=False to try it anyway")
    return chosen


def checkpoint_kernel(path: str | Path, device: str, backend: str = "auto") -> str:
    """gptq_backend for this checkpoint: "auto" does not pick quantlab, which runs 4-bit codes only, for a
    checkpoint of other bits (gptq_triton then); quantlab asked for by name is kept, and its layers say why
    they refuse such a checkpoint."""
    kernel = gptq_backend(device, backend)
    if kernel == QUANTLAB and kernel_name(backend)[0] == "auto" and \
            _config(path).get("quantization_config", {}).get("bits") != 4:
        return "gptq_triton"
    return kernel


def gptq_loading_config(path: str | Path, kernel: str):
    """The quantization_config to pass to from_pretrained for a GPTQ checkpoint loaded for `kernel`
    (checkpoint_kernel's choice)."""
    from transformers import GPTQConfig

    q = _config(path)["quantization_config"]
    if kernel == QUANTLAB:
        from .quantlab_linear import LOADS_WITH as kernel
    return GPTQConfig(bits=q["bits"], group_size=q.get("group_size", 128), backend=kernel)


def load_model(path: str | Path, device: str = "cpu", dtype=None, backend: str = "auto", param: str = "model",
               shard: bool = False, max_memory_per_gpu: str | None = None):
    """A causal LM in eval mode on `device`; GPTQ checkpoints through transformers' GPTQ integration,
    with the GPTQModel kernel `backend` (see gptq_backend; ignored for an unquantized model). shard: a GPTQ
    model split over the visible GPUs by accelerate's device map (device_map="auto", at most max_memory_per_gpu,
    e.g. "18.0GiB", on each), with the same kernel choice as on one card.

    Before anything loads: the kernel name (kernel_name), the weight files (a damaged one fails naming `param`,
    the file and what to do), and config.json against the weights' shapes (check_model).
    """
    from transformers import AutoModelForCausalLM

    from .fetch import check_weight_files

    kernel_name(backend)
    check_weight_files(path, param)
    check_model(path, param, tokenizer=False)

    dtype = dtype or default_dtype(path, device)
    kwargs = {"dtype": dtype}
    kernel = checkpoint_kernel(path, device, backend) if is_gptq(path) else None     # resolved once
    if shard and kernel is None:
        raise ValueError(f"{param}: load_model(shard=True) splits a GPTQ checkpoint; {path} is not one "
                         "(an unquantized model is sharded by lm-eval's parallelize)")
    if kernel is not None:
        kwargs["device_map"] = "auto" if shard else str(device)
        if shard and max_memory_per_gpu:
            import torch
            kwargs["max_memory"] = {i: max_memory_per_gpu for i in range(torch.cuda.device_count())}
        kwargs["quantization_config"] = gptq_loading_config(path, kernel)
    model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    if kernel is None:
        model = model.to(device)
    elif kernel == QUANTLAB:
        from .quantlab_linear import swap_gptq_linears
        swap_gptq_linears(model)
    return model.eval()

"""Which of the course's packages are installed, at which version, and what a missing one disables."""
from __future__ import annotations

from importlib import metadata

# distribution name -> what the course uses it for (shown when it is missing: what that disables)
COURSE_PACKAGES: dict[str, str] = {
    "torch": "everything: tensors, models, device detection",
    "triton": "Lab 05's GEMM, grouped GEMM and Int4 GEMV kernels (CPU: TRITON_INTERPRET=1)",
    "transformers": "loading the golden and Int4 models (Labs 02-04)",
    "accelerate": "device placement of large models (Labs 02-04)",
    "lm-eval": "GSM8K evaluation with lm-evaluation-harness (Lab 03)",
    "datasets": "the GSM8K data files that lm-eval reads (Lab 03)",
    "optimum": "transformers' GPTQ integration (Lab 02)",
    "gptqmodel": "GPTQ-Int4 quantization and kernels (Lab 02)",
    "modelscope": "fetching Qwen2.5-7B-Instruct and its GPTQ-Int4 twin (Lab 02, online profiles)",
    "torchao": "the field's MX / FP8 / int8 weight-only references (Lab 05)",
    "safetensors": "model weights and golden captures (Labs 02, 04)",
    "tokenizers": "the fixture model's tokenizer (Lab 02)",
    "papermill": "running the lab chain headless (ci/)",
    "ipykernel": "the notebook kernel papermill starts (ci/)",
    "jupyterlab": "opening the labs interactively",
    "ipywidgets": "live widgets (GPU monitor) in JupyterLab",
    "matplotlib": "every figure",
    "pandas": "every table",
    "tqdm": "progress bars on long work",
    "numpy": "array helpers",
    "pytest": "the test suite (tests/)",
}


def version_of(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def package_table(packages: dict[str, str] | None = None) -> list[dict]:
    """One row per course package: its version, or 'missing' and what that disables."""
    rows = []
    for dist, used_for in (packages or COURSE_PACKAGES).items():
        ver = version_of(dist)
        rows.append({"package": dist, "version": ver or "missing", "used_for": used_for,
                     "status": "ok" if ver else f"missing: disables {used_for}"})
    return rows

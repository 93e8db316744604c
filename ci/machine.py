"""Settings a profile asks for that this machine cannot honour: a device torch does not see, Triton compiled
for a GPU that is not there, a Jupyter kernel that is not installed. Each problem says what to set instead."""
from __future__ import annotations

import os
from pathlib import Path

from ci.profile_schema import lab_params


def machine_problems(profile: dict, to_run: list[str], labs: dict[str, Path]) -> list[str]:
    """Settings this machine cannot honour (a device it lacks, compiled Triton without a GPU, a kernel that is
    not installed), each with what to set instead; torch is asked only when a setting needs it."""
    from utils import platform as plat

    problems = []
    devices = {}
    for lab in to_run:
        if "device" in lab_params(labs[lab]):
            own = (profile.get("labs") or {}).get(lab) or {}
            if "device" in own:
                devices[f"labs.{lab}.device"] = own["device"]
            elif "device" in (profile.get("params") or {}):
                devices["params.device"] = profile["params"]["device"]
    triton = (profile.get("env") or {}).get("TRITON_INTERPRET")
    triton = None if triton is None else str(triton)
    record = None
    if any(str(v).split(":")[0] not in ("auto", "", "cpu") for v in devices.values()) or triton not in (None, "1"):
        record = plat.detect_platform()
    for key, value in devices.items():
        if record is None:
            continue
        try:
            plat.resolve_device(str(value), record)
        except (ValueError, RuntimeError) as exc:
            problems.append(f"{key}: {value!r} cannot work on this machine ({exc}); set device: auto (it picks "
                            f"{record.device} here), or device: {record.device}")
    if record is not None and triton not in (None, "1") and record.backend not in ("cuda", "rocm", "xpu"):
        problems.append(f"env.TRITON_INTERPRET: {triton!r} compiles Triton kernels for a GPU, and this machine has "
                        f"none (torch sees {record.backend}); set TRITON_INTERPRET: \"1\" (Triton's CPU "
                        "interpreter), as ci/profiles/cpu-tiny.yaml does")
    problems += env_problems(profile)
    kernel = profile.get("kernel")
    if kernel:
        from jupyter_client.kernelspec import KernelSpecManager

        installed = sorted(KernelSpecManager().find_kernel_specs())
        if kernel not in installed:
            problems.append(f"kernel: {kernel!r} is not an installed Jupyter kernel (installed: "
                            f"{', '.join(installed) or 'none'}); e.g. kernel: python3, or remove the key")
    return problems


FOLDER_ENV = {"QUANTLAB_RUNS": "where run folders go", "QUANTLAB_MODELS": "where model snapshots go",
              "QUANTLAB_PEAKS_DIR": "where each lab kernel's peak memory is written"}


def env_problems(profile: dict, environ=None) -> list[str]:
    """The course's QUANTLAB_* variables, from the profile's env or this shell's, checked before any lab runs:
    inside a lab kernel a bad one fails late, or (the memory cap, read in sitecustomize, where Python prints
    the error and goes on) is dropped without a word."""
    from utils.gpu_cap import CAP_ENV, parse_cap
    from utils.models import GPTQ_ENV, kernel_name

    own = {k: str(v) for k, v in (profile.get("env") or {}).items()}
    env = {**(os.environ if environ is None else environ), **own}
    where = lambda k: f"env.{k}" if k in own else f"${k} (this shell's environment)"  # noqa: E731
    problems = []
    if env.get(CAP_ENV, "").strip():
        try:
            parse_cap(env[CAP_ENV])
        except ValueError as exc:
            problems.append(f"{where(CAP_ENV)}: {exc}")
    try:
        kernel_name(environ=env)
    except ValueError as exc:
        problems.append(f"{where(GPTQ_ENV)}: {exc}")
    for name, what in FOLDER_ENV.items():
        value = env.get(name, "").strip()
        if value and Path(value).expanduser().exists() and not Path(value).expanduser().is_dir():
            problems.append(f"{where(name)}: {value} is a file, not a folder ({what}); give a folder, or remove it")
    return problems

"""Settings a profile asks for that this machine cannot honour: a device torch does not see, Triton compiled
for a GPU that is not there, a Jupyter kernel that is not installed. Each problem says what to set instead."""
from __future__ import annotations

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
    kernel = profile.get("kernel")
    if kernel:
        from jupyter_client.kernelspec import KernelSpecManager

        installed = sorted(KernelSpecManager().find_kernel_specs())
        if kernel not in installed:
            problems.append(f"kernel: {kernel!r} is not an installed Jupyter kernel (installed: "
                            f"{', '.join(installed) or 'none'}); e.g. kernel: python3, or remove the key")
    return problems

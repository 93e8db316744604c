"""Which platform is this? One record for CUDA, ROCm, MUSA, XPU, MPS or CPU.

Every result the course writes carries this record, so a number can always be traced to the
machine, driver and library versions that produced it (the first rule of post-silicon validation).
"""
from __future__ import annotations

import os
import platform as _py_platform
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from typing import Any

BACKENDS = ("cuda", "rocm", "musa", "xpu", "mps", "cpu")


@dataclass
class PlatformRecord:
    backend: str                     # cuda | rocm | musa | xpu | mps | cpu
    vendor: str                      # NVIDIA, AMD, Moore Threads, Intel, Apple, or the CPU's vendor
    device_name: str
    device: str                      # the torch device string to use: cuda, musa, xpu, mps, cpu
    device_count: int = 0
    arch: str = ""                   # sm_90, gfx942, mp_22, ...
    memory_bytes: int | None = None  # accelerator memory (host RAM on CPU)
    driver_version: str = ""
    runtime_version: str = ""        # CUDA / HIP / MUSA runtime that torch was built with
    torch_version: str = ""
    triton_version: str = ""
    python_version: str = field(default_factory=_py_platform.python_version)
    os: str = field(default_factory=lambda: f"{_py_platform.system()} {_py_platform.release()}")
    cpu: str = ""
    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 0)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def is_gpu(self) -> bool:
        return self.backend in ("cuda", "rocm", "musa", "xpu")


def _run(cmd: list[str], timeout: float = 10.0) -> str:
    """stdout of a command, or '' when it is absent or fails (detection must never crash)."""
    if not shutil.which(cmd[0]):
        return ""
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return res.stdout.strip() if res.returncode == 0 else ""


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _py_platform.processor() or _py_platform.machine()


def _host_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _triton_version() -> str:
    try:
        import triton
        return triton.__version__
    except Exception:  # noqa: BLE001 - absent or broken, both mean "no triton"
        return ""


def _nvidia_driver() -> str:
    out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return out.splitlines()[0].strip() if out else ""


def _rocm_driver() -> str:
    out = _run(["rocm-smi", "--showdriverversion"])
    for line in out.splitlines():
        if "Driver version" in line:
            return line.split(":", 1)[1].strip()
    return ""


def _musa_torch():
    """torch_musa registers torch.musa; import it only if it is installed."""
    try:
        import torch_musa  # noqa: F401
        import torch
        return torch.musa if torch.musa.is_available() else None
    except Exception:  # noqa: BLE001
        return None


def detect_platform(torch_module=None) -> PlatformRecord:
    """Detect the accelerator torch can use, in the order CUDA/ROCm, MUSA, XPU, MPS, CPU."""
    try:
        torch = torch_module or __import__("torch")
    except ImportError:
        return PlatformRecord(backend="cpu", vendor="", device_name=_cpu_name(), device="cpu",
                              memory_bytes=_host_memory_bytes(), cpu=_cpu_name(),
                              notes=["torch is not installed"])
    common = dict(torch_version=torch.__version__, triton_version=_triton_version(), cpu=_cpu_name())

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        hip = getattr(torch.version, "hip", None)
        if hip:  # ROCm builds reuse the torch.cuda API
            return PlatformRecord(
                backend="rocm", vendor="AMD", device_name=props.name, device="cuda",
                device_count=torch.cuda.device_count(),
                arch=getattr(props, "gcnArchName", "").split(":")[0],
                memory_bytes=props.total_memory, driver_version=_rocm_driver(),
                runtime_version=f"HIP {hip}", **common)
        return PlatformRecord(
            backend="cuda", vendor="NVIDIA", device_name=props.name, device="cuda",
            device_count=torch.cuda.device_count(), arch=f"sm_{props.major}{props.minor}",
            memory_bytes=props.total_memory, driver_version=_nvidia_driver(),
            runtime_version=f"CUDA {torch.version.cuda}", **common)

    musa = _musa_torch() if torch_module is None else getattr(torch, "musa", None)
    if musa is not None and musa.is_available():
        props = musa.get_device_properties(0)
        return PlatformRecord(
            backend="musa", vendor="Moore Threads", device_name=props.name, device="musa",
            device_count=musa.device_count(),
            arch=f"mp_{getattr(props, 'major', '')}{getattr(props, 'minor', '')}",
            memory_bytes=props.total_memory,
            driver_version=_run(["musa-smi", "--version"]).splitlines()[0] if shutil.which("musa-smi") else "",
            runtime_version=f"MUSA {getattr(getattr(torch, 'version', None), 'musa', '')}", **common)

    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        props = xpu.get_device_properties(0)
        return PlatformRecord(
            backend="xpu", vendor="Intel", device_name=props.name, device="xpu",
            device_count=xpu.device_count(), memory_bytes=getattr(props, "total_memory", None),
            driver_version=str(getattr(props, "driver_version", "")), **common)

    mps = getattr(getattr(torch, "backends", None), "mps", None)
    if mps is not None and mps.is_available():
        return PlatformRecord(backend="mps", vendor="Apple", device_name="Apple GPU (MPS)", device="mps",
                              device_count=1, memory_bytes=_host_memory_bytes(), **common)

    return PlatformRecord(backend="cpu", vendor="", device_name=_cpu_name(), device="cpu",
                          memory_bytes=_host_memory_bytes(),
                          notes=["no accelerator visible to torch: GPU ceilings need a GPU"], **common)


def resolve_device(requested: str = "auto", record: PlatformRecord | None = None) -> str:
    """Turn a notebook's `device` parameter into a torch device string, with a clear error if absent."""
    record = record or detect_platform()
    if requested in ("", "auto"):
        return record.device
    kind = requested.split(":")[0]
    if kind == "cpu":
        return requested
    aliases = {"cuda": ("cuda", "rocm"), "rocm": ("rocm",), "musa": ("musa",), "xpu": ("xpu",), "mps": ("mps",)}
    if kind not in aliases:
        raise ValueError(f"device={requested!r} is not one of auto, cpu, cuda, rocm, musa, xpu, mps")
    if record.backend not in aliases[kind]:
        raise RuntimeError(
            f"device={requested!r} was asked for, but this machine's torch sees {record.backend} "
            f"({record.device_name}); set device='auto' or use a profile for this machine.")
    return record.device + requested[len(kind):]

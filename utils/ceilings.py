"""Measured ceilings: matmul TFLOP/s per dtype and memory bandwidth, the two numbers a roofline needs.

Datasheet numbers are leads, not facts: a roofline (屋顶模型) drawn from what this device really
reaches is the yardstick Lab 05 holds its kernels against. Every measurement warms up first, times
with utils.timing.time_op (device events; host clock after a synchronize on CPU), uses random data
(zeros run faster on some GPUs), and reports the median of repeats.
"""
from __future__ import annotations

import contextlib
import statistics

import torch

from .timing import synchronize, time_op  # noqa: F401  (the course's one timer)

MATMUL_DTYPES = ("fp32", "tf32", "fp16", "bf16", "int8")
_TORCH_DTYPE = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
                "bf16": torch.bfloat16, "int8": torch.int8}


def _device_type(device: str) -> str:
    return torch.device(device).type


@contextlib.contextmanager
def fp32_matmul_mode(mode: str):
    """Temporarily set CUDA fp32 matmuls to 'tf32' or 'ieee' (full fp32), restoring the old setting."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def support(dtype: str, device: str) -> tuple[bool, str]:
    """Whether this device can run a matmul in `dtype`, and if not, why (shown in the lab)."""
    if dtype not in MATMUL_DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {MATMUL_DTYPES}")
    kind = _device_type(device)
    if dtype == "tf32":
        if kind != "cuda" or torch.version.hip:
            return False, "TF32 is a mode of NVIDIA tensor cores (Ampere and later); this device computes fp32 as fp32"
        major, _ = torch.cuda.get_device_capability(device)
        if major < 8:
            return False, f"TF32 needs compute capability 8.0+, this GPU is {major}.x"
    if dtype == "bf16" and kind == "cuda" and not torch.cuda.is_bf16_supported():
        return False, "this GPU has no bf16 matmul support"
    if dtype == "int8":
        try:  # the one reliable test: try the real op on a legal tiny shape
            a = torch.ones(32, 32, dtype=torch.int8, device=device)
            torch._int_mm(a, a)
        except Exception as exc:  # noqa: BLE001
            return False, f"torch._int_mm is not available here: {type(exc).__name__}: {str(exc)[:120]}"
    return True, ""


def matmul_ceiling(dtype: str, n: int, device: str, warmup: int = 3, repeats: int = 10) -> dict:
    """TFLOP/s (TOP/s for int8) of an n x n x n matmul in `dtype`: 2*n^3 operations per call."""
    ok, reason = support(dtype, device)
    record = {"op": "matmul", "dtype": dtype, "n": n, "device": device}
    if not ok:
        return {**record, "status": "skipped", "reason": reason}
    gen = torch.Generator(device="cpu").manual_seed(0)
    if dtype == "int8":
        a = torch.randint(-128, 128, (n, n), generator=gen, dtype=torch.int8).to(device)
        b = torch.randint(-128, 128, (n, n), generator=gen, dtype=torch.int8).to(device)
        fn = lambda: torch._int_mm(a, b)  # noqa: E731
    else:
        a = torch.randn(n, n, generator=gen).to(device=device, dtype=_TORCH_DTYPE[dtype])
        b = torch.randn(n, n, generator=gen).to(device=device, dtype=_TORCH_DTYPE[dtype])
        fn = lambda: torch.mm(a, b)  # noqa: E731
    mode = "tf32" if dtype == "tf32" else "ieee"
    with fp32_matmul_mode(mode):
        times = time_op(fn, device, warmup, repeats)
    med = statistics.median(times)
    return {**record, "status": "measured", "seconds_median": med, "seconds_min": min(times),
            "repeats": repeats, "tflops": 2 * n**3 / med / 1e12, "tflops_best": 2 * n**3 / min(times) / 1e12}


def copy_bandwidth(nbytes: int, device: str, warmup: int = 3, repeats: int = 10) -> dict:
    """GB/s of a device-to-device copy, counting bytes read plus bytes written (2 * nbytes)."""
    n = nbytes // 4
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)
    times = time_op(lambda: dst.copy_(src), device, warmup, repeats)
    med = statistics.median(times)
    moved = 2 * n * 4
    if not torch.equal(dst, src):  # correct is the floor: a copy that loses data is not a bandwidth
        raise RuntimeError("device copy returned different data: the bandwidth measurement is void")
    return {"op": "copy", "bytes_moved": moved, "device": device, "status": "measured",
            "seconds_median": med, "repeats": repeats, "gbps": moved / med / 1e9,
            "gbps_best": moved / min(times) / 1e9}


def measure_ceilings(device: str, matmul_n: int, copy_bytes: int, dtypes=MATMUL_DTYPES,
                     repeats: int = 10, progress: bool = True) -> dict:
    """All of Lab 01's ceilings; the dict Lab 05's roofline reads from results.json."""
    from tqdm.auto import tqdm

    rows = []
    for dtype in tqdm(list(dtypes), desc="matmul ceilings", disable=not progress):
        rows.append(matmul_ceiling(dtype, matmul_n, device, repeats=repeats))
    bw = copy_bandwidth(copy_bytes, device, repeats=repeats)
    peak = {r["dtype"]: r["tflops"] for r in rows if r["status"] == "measured"}
    return {"device": device, "matmul": rows, "copy": bw, "peak_tflops": peak, "bandwidth_gbps": bw["gbps"]}


def matmul_correctness(dtype: str, n: int, device: str, seed: int = 0) -> dict:
    """Correct is the floor: the relative L2 error of this device's matmul in `dtype` against fp64 on
    the same (already rounded) inputs, and whether it stays within metrics.matmul_error_bound."""
    from .metrics import matmul_error_bound, relative_l2

    ok, reason = support(dtype, device)
    if not ok:
        return {"dtype": dtype, "n": n, "status": "skipped", "reason": reason}
    gen = torch.Generator(device="cpu").manual_seed(seed)
    if dtype == "int8":
        a = torch.randint(-128, 128, (n, n), generator=gen, dtype=torch.int8)
        b = torch.randint(-128, 128, (n, n), generator=gen, dtype=torch.int8)
        out = torch._int_mm(a.to(device), b.to(device)).cpu()
        ref = a.double() @ b.double()
    else:
        a = torch.randn(n, n, generator=gen).to(_TORCH_DTYPE[dtype])
        b = torch.randn(n, n, generator=gen).to(_TORCH_DTYPE[dtype])
        with fp32_matmul_mode("tf32" if dtype == "tf32" else "ieee"):
            out = torch.mm(a.to(device), b.to(device)).cpu()
        ref = a.double() @ b.double()
    err = relative_l2(out, ref)
    bound = matmul_error_bound("tf32" if dtype == "tf32" else _TORCH_DTYPE[dtype], n)
    return {"dtype": dtype, "n": n, "status": "pass" if err <= bound else "FAIL",
            "relative_l2": err, "bound": bound}

"""Which kernels the GEMM baselines of issue 8 launch on this GPU (a probe, not a test): cuBLAS names its
sm_90 kernels by tile, cluster shape and schedule, which says what our Triton GEMM is up against.

    python scripts/gemm_baseline_kernels.py      # GPU; prints shape | kernel | launches | us per launch

Runs torch.matmul at 8192^3 and at one group of the grouped row (2048 x 4096 x 4096), and
torch._grouped_mm at G=8 x (2048 x 4096 x 4096), bf16, under torch.profiler, after a warm-up.
"""
from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile


def kernels_of(fn, repeats: int = 5) -> list[tuple[str, int, float]]:
    """(kernel name, launches, microseconds per launch) of the GPU kernels fn launches, profiled."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    return [(e.key, e.count, e.device_time_total / e.count) for e in prof.key_averages()
            if e.device_time_total > 0 and e.count]


def main():
    if not torch.cuda.is_available():
        raise SystemExit("gemm_baseline_kernels.py profiles GPU kernels: run it on the device, e.g. "
                         "run(kind='nvidia-h200', command='python3 scripts/gemm_baseline_kernels.py')")
    dt = torch.bfloat16
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    a, b = torch.randn(8192, 8192, device="cuda", dtype=dt), torch.randn(8192, 8192, device="cuda", dtype=dt)
    cases = {"matmul 8192^3": lambda: a @ b}
    a2, b2 = torch.randn(2048, 4096, device="cuda", dtype=dt), torch.randn(4096, 4096, device="cuda", dtype=dt)
    cases["matmul 2048x4096x4096"] = lambda: a2 @ b2
    ag = torch.randn(8 * 2048, 4096, device="cuda", dtype=dt)
    bg = torch.randn(8, 4096, 4096, device="cuda", dtype=dt).transpose(1, 2).contiguous().transpose(1, 2)
    offs = torch.arange(1, 9, device="cuda", dtype=torch.int32) * 2048
    cases["_grouped_mm 8 x 2048x4096x4096"] = lambda: torch._grouped_mm(ag, bg, offs=offs)
    print("| shape | kernel | launches | us per launch |\n|---|---|---|---|")
    for name, fn in cases.items():
        try:
            rows = kernels_of(fn)
        except Exception as exc:  # noqa: BLE001 - a baseline that does not run here is reported
            print(f"| {name} | did not run: {type(exc).__name__}: {str(exc)[:100]} | | |")
            continue
        for kernel, count, us in rows:
            print(f"| {name} | `{kernel}` | {count} | {us:.1f} |")


if __name__ == "__main__":
    main()

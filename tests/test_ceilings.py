import torch

from utils import ceilings


def test_cpu_matmul_ceiling_measured():
    rec = ceilings.matmul_ceiling("fp32", 128, "cpu", warmup=1, repeats=3)
    assert rec["status"] == "measured" and rec["tflops"] > 0 and rec["seconds_median"] > 0
    assert rec["tflops_best"] >= rec["tflops"]


def test_tf32_skipped_with_reason_on_cpu():
    rec = ceilings.matmul_ceiling("tf32", 128, "cpu")
    assert rec["status"] == "skipped" and "NVIDIA" in rec["reason"]


def test_copy_bandwidth_counts_read_and_write():
    rec = ceilings.copy_bandwidth(1 << 20, "cpu", warmup=1, repeats=3)
    assert rec["bytes_moved"] == 2 * (1 << 20)
    assert rec["gbps"] > 0


def test_correctness_passes_on_cpu_and_catches_a_broken_matmul(monkeypatch):
    for dt in ("fp32", "fp16", "bf16", "int8"):
        assert ceilings.matmul_correctness(dt, 64, "cpu")["status"] == "pass", dt
    real_mm = torch.mm

    def broken_mm(a, b):  # an operator with silent data corruption in one element
        out = real_mm(a, b)
        out[3, 5] += 1.0
        return out

    monkeypatch.setattr(ceilings.torch, "mm", broken_mm)
    assert ceilings.matmul_correctness("fp32", 64, "cpu")["status"] == "FAIL"


def test_fp32_mode_restored():
    before = torch.backends.cuda.matmul.allow_tf32
    with ceilings.fp32_matmul_mode("tf32"):
        assert torch.backends.cuda.matmul.allow_tf32
    assert torch.backends.cuda.matmul.allow_tf32 == before


def test_measure_ceilings_shape():
    res = ceilings.measure_ceilings("cpu", 64, 1 << 20, repeats=2, progress=False)
    assert set(res["peak_tflops"]) == {"fp32", "fp16", "bf16", "int8"}
    assert res["bandwidth_gbps"] == res["copy"]["gbps"]

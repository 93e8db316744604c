"""scripts/bench_decode_attention.py: its kernels agree with the float32 reference on the CPU, its table, and
the refusals made before any GPU work (the timing itself runs on the GPU machine)."""
import importlib.util
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("bench_decode_attention", REPO / "scripts" / "bench_decode_attention.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_both_kernels_compute_the_reference_attention():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, bench.HEADS, 1, 16, generator=g)
    k, v = torch.randn(2, bench.KV_HEADS, 64, 16, generator=g), torch.randn(2, bench.KV_HEADS, 64, 16, generator=g)
    mask = torch.ones(2, 1, 1, 64, dtype=torch.bool)
    mask[1, ..., :5] = False
    mask[..., 48:] = False
    ref = bench.reference(q, k, v, mask)
    for name, fn in bench.KERNELS.items():
        torch.testing.assert_close(fn(q, k, v, mask), ref, rtol=1e-5, atol=1e-5, msg=name)


def test_markdown_flags_a_kernel_that_is_not_repeatable():
    meta = {"device": "H100", "date": "today", "torch": "2.x", "command": "python scripts/bench_decode_attention.py"}
    rows = [{"batch": 16, "cache": 2048, "kernel": "flex", "us": 13.0, "gb_per_s": 2580.0, "max_abs_diff": 2e-3,
             "same_bits_twice": True},
            {"batch": 16, "cache": 2048, "kernel": "sdpa (grouped rows)", "us": 50.0, "gb_per_s": 671.0,
             "max_abs_diff": 2e-3, "same_bits_twice": False}]
    md = bench.markdown(meta, rows)
    assert "| 16 | 2048 | flex | 13.0 | 2580 | 2.0e-03 | yes |" in md and md.rstrip().endswith("| NO |")


def test_refusals_come_before_any_gpu_work(tmp_path):
    (tmp_path / "bench_decode_attention.json").write_text("{}")
    with pytest.raises(SystemExit, match="already holds bench_decode_attention.json"):
        bench.main(["--out", str(tmp_path)])
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="torch sees no GPU"):
            bench.main(["--out", str(tmp_path / "new")])
        assert not (tmp_path / "new").exists()

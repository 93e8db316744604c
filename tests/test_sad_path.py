"""The sad path: extreme but legal operator inputs against float64, and the bit-for-bit determinism check."""
import math

import pytest
import torch

from utils import sad_path as sp


def rows_by(rows):
    return {(r["op"], r["case"], r["dtype"]): r for r in rows}


def test_known_failures_and_fixes_are_classified():
    rows = rows_by(sp.run_cases("cpu"))
    # fp16: x^2 overflows inside the naive RMSNorm (output collapses to 0); the fp32-variance one is fine
    assert rows[("rmsnorm (in dtype)", "activations ~ 1000", "float16")]["status"] == "overflow inside (output 0)"
    assert rows[("rmsnorm (fp32 variance)", "activations ~ 1000", "float16")]["status"] == "ok"
    assert rows[("rmsnorm (in dtype)", "activations ~ 1000", "bfloat16")]["status"] == "ok"  # bf16 range
    for dt in ("float16", "bfloat16"):
        assert rows[("softmax (no max shift)", "logits ~ 100", dt)]["status"] == "NaN"
        assert rows[("softmax (torch)", "logits ~ 100", dt)]["status"] == "ok"
        assert rows[("softmax (torch)", "fully masked row", dt)]["status"] == "NaN"
        assert rows[("softmax (safe)", "fully masked row", dt)]["status"] == "ok"
        assert rows[("gemm", "sums ~ 50 (K=4096)", dt)]["status"] == "ok"
    gemm16 = rows[("gemm", "sums near fp16 max (K=4096)", "float16")]
    assert gemm16["status"] == "overflow (Inf)" and gemm16["inf"] > 0 and gemm16["ref_max_abs"] > sp.FP16_MAX
    assert rows[("gemm", "sums near fp16 max (K=4096)", "bfloat16")]["status"] == "ok"
    assert rows[("rotary cos(pos*freq)", "positions up to 131k", "bfloat16")]["status"] == "precision loss"
    assert rows[("rotary cos(pos*freq)", "positions up to 131k", "float16")]["status"] == "NaN"  # 131k > 65504


def test_classify():
    ref = torch.tensor([1.0, 2.0], dtype=torch.float64)
    assert sp.classify(torch.tensor([1.0, 2.0]), ref, torch.float16, 1e-3)[0] == "ok"
    assert sp.classify(torch.tensor([1.0, 2.5]), ref, torch.float16, 1e-3)[0] == "precision loss"
    assert sp.classify(torch.tensor([1.0, math.inf]), ref, torch.float16, 1e-3)[0] == "overflow (Inf)"
    assert sp.classify(torch.tensor([math.nan, 2.0]), ref, torch.float16, 1e-3)[0] == "NaN"
    assert sp.classify(torch.zeros(2), ref, torch.float16, 1e-3)[0] == "overflow inside (output 0)"


def test_softmax_safe_matches_torch_on_normal_rows():
    x = torch.randn(3, 10, dtype=torch.float64)
    torch.testing.assert_close(sp.softmax_safe(x), torch.softmax(x, -1))
    assert torch.equal(sp.softmax_safe(torch.full((1, 4), -math.inf)), torch.zeros(1, 4))


def test_determinism_check_flags_differences():
    x = torch.randn(64, 64)
    same = sp.determinism_check(lambda: x @ x, runs=4)
    assert same["identical"] and same["distinct_outputs"] == 1 and same["max_abs_diff"] == 0.0
    calls = iter(range(100))
    flaky = sp.determinism_check(lambda: x + 1e-6 * (next(calls) % 2), runs=4)
    assert not flaky["identical"] and flaky["runs_differing"] == 2 and flaky["distinct_outputs"] == 2
    assert flaky["max_abs_diff"] > 0
    zero_sign = iter([torch.tensor([0.0]), torch.tensor([-0.0])])
    assert not sp.determinism_check(lambda: next(zero_sign), runs=2)["identical"]  # bit for bit, not ==
    with pytest.raises(ValueError, match="runs"):
        sp.determinism_check(lambda: x, runs=1)


@pytest.mark.parametrize("bad", [torch.int8, torch.float8_e4m3fn])
def test_bad_dtype_named(bad):
    with pytest.raises(ValueError, match=f"dtypes: {bad} is not a dtype the elementwise ops compute in"):
        sp.run_cases("cpu", dtypes=(bad,))

import math

import pytest
import torch

from utils import metrics


def test_hand_computed_values():
    ref = torch.tensor([3.0, 4.0])
    out = torch.tensor([3.0, 4.5])
    assert metrics.relative_l2(out, ref) == pytest.approx(0.1)
    assert metrics.sqnr_db(out, ref) == pytest.approx(20.0)
    assert metrics.max_abs_error(out, ref) == 0.5
    assert metrics.sqnr_db(ref, ref) == math.inf
    assert metrics.cosine_similarity(ref, 2 * ref) == pytest.approx(1.0)


def test_nan_is_never_averaged_away():
    ref = torch.ones(4)
    out = torch.tensor([1.0, float("nan"), 1.0, 1.0])
    assert math.isnan(metrics.relative_l2(out, ref))
    assert math.isnan(metrics.sqnr_db(out, ref))
    assert math.isnan(metrics.max_abs_error(out, ref))


def test_shape_mismatch():
    with pytest.raises(ValueError, match="shape mismatch"):
        metrics.relative_l2(torch.ones(3), torch.ones(4))


def test_error_bound_grows_with_k_and_precision():
    b32 = metrics.matmul_error_bound(torch.float32, 1024)
    assert metrics.matmul_error_bound(torch.float32, 4096) > b32
    assert metrics.matmul_error_bound(torch.bfloat16, 1024) > metrics.matmul_error_bound(torch.float16, 1024) > b32
    assert metrics.matmul_error_bound("tf32", 1024) > b32
    assert metrics.matmul_error_bound("int8", 1024) == 0.0


def test_the_one_bound_relative_and_elementwise():
    """matmul_error_bound is the one bound; its forms agree with the closed forms they replaced."""
    u32, u16, ubf, utf = 2.0**-24, 2.0**-11, 2.0**-8, 2.0**-11
    for k in (1, 64, 4096):
        assert metrics.matmul_error_bound(torch.float16, k) == 4 * (u16 + math.sqrt(k) * u32)
        assert metrics.matmul_error_bound("tf32", k) == 4 * (u32 + utf + math.sqrt(k) * u32)
        # activations rounded to bf16 before a bf16-output kernel (the GPTQ output check)
        assert metrics.matmul_error_bound(torch.bfloat16, k, input_dtype=torch.bfloat16) == 4 * (2 * ubf + math.sqrt(k) * u32)
    a = torch.tensor([[3.0, -1.0]], dtype=torch.float64)
    b = torch.tensor([[2.0], [4.0]], dtype=torch.float64)
    e = metrics.matmul_error_bound(torch.float16, 2, out_abs=(a @ b).abs(), sums_abs=a.abs() @ b.abs())
    assert e.item() == 4 * (u16 * 2 + math.sqrt(2) * u32 * 10)
    with pytest.raises(ValueError, match="k"):
        metrics.matmul_error_bound(torch.float16, 0)


def test_tf32_elementwise_bound_counts_the_inputs_rounding():
    """tf32 rounds the fp32 inputs to 10 mantissa bits: under cancellation that is the whole error."""
    a = torch.tensor([[1 + 2.0**-12, -1.0]], dtype=torch.float64)
    b = torch.tensor([[1.0], [1.0]], dtype=torch.float64)
    a_tf32 = torch.tensor([[1.0, -1.0]], dtype=torch.float64)      # 1 + 2^-12 is a quarter ULP of tf32 above 1
    err = ((a_tf32 @ b) - (a @ b)).abs()                            # 2^-12: all of C
    bound = metrics.matmul_error_bound("tf32", 2, out_abs=(a @ b).abs(), sums_abs=a.abs() @ b.abs())
    assert err.item() == 2.0**-12 and bool((err <= bound).all())

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

"""torchao Int8 weight-only save/load round trip (the CPU part; cross-device needs a GPU)."""
import pytest
import torch

from utils import int8wo


@pytest.mark.parametrize("fmt", ["torch.save", "safetensors"])
def test_cpu_round_trip_is_bit_identical(fmt):
    r = int8wo.round_trip("cpu", "cpu", fmt)
    assert r["bit_identical"] and r["assert_close_default"] == "passed" and r["derived_bound_passes"]
    assert r["elements"] == 64 and r["max_abs_diff"] == 0.0
    row = int8wo.summary_row(r)
    assert "output" not in row and row["format"] == fmt


def test_quantized_weights_are_int8_and_close():
    m = int8wo.quantized_toy("cpu")
    torch.manual_seed(0)
    ref = int8wo.ToyLinearModel().eval()
    x = torch.randn(4, 64)
    with torch.no_grad():
        rel = (m(x) - ref(x)).norm() / ref(x).norm()
    assert 0 < rel < 0.02                                        # quantized, and only slightly off
    with pytest.raises(ValueError, match="fmt"):
        int8wo.round_trip("cpu", "cpu", fmt="pickle")

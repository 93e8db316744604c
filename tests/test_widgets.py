"""utils.widgets: what each lab's widget shows, computed and checked without a browser."""
import math

import pytest
import torch

from utils import gptq, roofline, widgets
from utils.fixture import fixture_paths


# ---------------------------------------------------------------- Lab 02
def test_rtn_quantize_hand_case_on_gptq_grid():
    # 2 bits: maxq 3, scale 2*1/3, zero 2; w/scale = -1.5 -0.75 0 0.75 1.5 -> codes 0 1 2 3 3 (4 clamped)
    w = torch.tensor([[-1.0, -0.5, 0.0, 0.5, 1.0]])
    got = widgets.rtn_quantize(w, 2, widgets.PER_ROW)
    torch.testing.assert_close(got, torch.tensor([[-4 / 3, -2 / 3, 0.0, 2 / 3, 2 / 3]]))


def test_rtn_quantize_matches_gptq_int4_packer():
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))        # [out, in]
    ours = widgets.rtn_quantize(w, 4, 128)
    packed = gptq.dequant_gptq_int4(*gptq.pack_gptq_int4(w.t().contiguous(), 128), 128).t()
    # same grid; the packer rounds its scales to fp16, so a code at a tie (a group's -max at -7.5 steps)
    # may land one step away: at most one step, on at most 1 % of the weights
    step = 2 * w.abs().max() / 15
    diff = (ours - packed).abs()
    assert diff.max() <= step * 1.001 and (diff > 1e-3).float().mean() < 0.01
    assert widgets.error_point(w, ours, 4, 128)["SQNR dB"] == pytest.approx(
        widgets.error_point(w, packed, 4, 128)["SQNR dB"], abs=0.2)


def test_error_falls_with_bits_and_smaller_groups():
    w = torch.randn(32, 512, generator=torch.Generator().manual_seed(1))
    by_bits = [widgets.quant_point(w, b, 128)["SQNR dB"] for b in (2, 3, 4, 8)]
    assert by_bits == sorted(by_bits) and by_bits[-1] - by_bits[2] > 20    # ~6 dB per bit
    by_group = [widgets.quant_point(w, 4, g)["SQNR dB"] for g in (32, 128, widgets.PER_ROW)]
    assert by_group == sorted(by_group, reverse=True)


def test_layer_bytes_matches_roofline_int4_bytes():
    k, n = 1024, 4096
    assert widgets.layer_bytes(n, k, 4, 128) == roofline.int4_weight_bytes(k, n, 128)
    assert widgets.quant_point(torch.ones(8, 256), 4, widgets.PER_ROW)["bytes/weight"] == pytest.approx(
        0.5 + 2.5 / 256)


def test_bad_group_size_and_bits_name_the_parameter():
    with pytest.raises(ValueError, match="group_size=100"):
        widgets.rtn_quantize(torch.ones(4, 256), 4, 100)
    with pytest.raises(ValueError, match="bits=1"):
        widgets.rtn_quantize(torch.ones(4, 256), 1, 128)
    assert widgets.group_choices(3584) == [32, 64, 128, 256, widgets.PER_ROW]
    assert widgets.group_choices(96) == [32, widgets.PER_ROW]
    assert widgets.group_choices(256) == [32, 64, 128, widgets.PER_ROW]     # 256 would be the whole row


def test_save_static_writes_and_closes(tmp_path):
    import matplotlib.pyplot as plt

    fig = widgets.plot_quant_sweep(widgets.quant_sweep(torch.randn(8, 64), bits=(2, 4), group_sizes=(32,)))
    path = widgets.save_static(fig, tmp_path / "figures" / "x.png")
    assert open(path, "rb").read(4) == b"\x89PNG" and not plt.fignum_exists(fig.number)


def test_read_weight_of_the_fixture_golden_model():
    golden = fixture_paths()["golden"]
    w = widgets.read_weight(golden, "model.layers.0.self_attn.q_proj")
    assert w.dtype == torch.float32 and tuple(w.shape) == (256, 256) and w.abs().max() > 0
    with pytest.raises(KeyError, match="model.layers.0.nothing.weight"):
        widgets.read_weight(golden, "model.layers.0.nothing")


def test_quant_explorer_updates_when_a_slider_moves():
    w = torch.randn(16, 256, generator=torch.Generator().manual_seed(2))
    box = widgets.quant_explorer(w, "toy")
    (bits, group), table, image = box.children[0].children, box.children[1], box.children[2]
    before_t, before_i = table.value, image.value
    assert "SQNR dB" in before_t and image.value[:4] == b"\x89PNG"
    bits.value = 2
    assert table.value != before_t and image.value != before_i
    expect = widgets.quant_point(w, 2, 128)
    assert f"{expect['SQNR dB']:.4g}" in table.value
    group.value = widgets.PER_ROW
    assert "per row" in table.value


# ---------------------------------------------------------------- Lab 04
def _rows():
    rows = []
    for mode, drop in (("propagated", 1.0), ("isolated", 0.0)):
        for layer in range(4):
            for part in ("layer", "mlp"):
                sq = 40.0 - drop * 5 * layer - (15 if (layer, part, mode) == (2, "layer", "isolated") else 0)
                rows.append({"module": f"model.layers.{layer}" + ("" if part == "layer" else ".mlp"), "layer": layer,
                             "part": part, "mode": mode, "cosine": 1 - 10 ** (-sq / 10), "rel_l2": 10 ** (-sq / 20),
                             "sqnr_db": sq, "max_abs": 10 ** (-sq / 20)})
        for name, part in (("model.embed_tokens", "embed"), ("model.norm", "final_norm"), ("logits", "logits")):
            rows.append({"module": name, "layer": None, "part": part, "mode": mode, "cosine": 0.999,
                         "rel_l2": 0.01, "sqnr_db": 40.0, "max_abs": 0.1})
    return rows


def test_module_view_and_default_pick():
    rows = _rows()
    assert widgets.module_choices(rows) == ([0, 1, 2, 3], ["layer", "mlp"])
    assert widgets.default_module(rows) == (2, "layer")              # lowest isolated SQNR
    view = widgets.module_view(rows, 2, "layer", threshold=0.99)
    assert [v["mode"] for v in view] == ["propagated", "isolated"]
    assert view[1]["SQNR dB"] == 25.0 and view[1]["verdict"] == "healthy"
    assert widgets.module_view(rows, 3, "layer", threshold=0.9999)[0]["verdict"] == "degraded"
    with pytest.raises(ValueError, match="layer=9"):
        widgets.module_view(rows, 9, "layer")


def test_layer_picker_updates_and_survives_bit_identical_rows():
    rows = _rows()
    box = widgets.layer_picker(rows)
    (layer, part, metric), table, image = box.children[0].children, box.children[1], box.children[2]
    assert "model.layers.2" in table.value and "model.layers.3" not in table.value
    before = image.value
    layer.value, part.value = 3, "mlp"
    assert "model.layers.3.mlp" in table.value and image.value != before
    metric.value = "cosine"
    rows[0]["sqnr_db"], rows[0]["rel_l2"] = math.inf, 0.0                 # a bit-identical module
    widgets.png_bytes(widgets.plot_module(rows, 0, "layer"))


# ---------------------------------------------------------------- Lab 05
def test_tolerance_rows_fixed_atol_fails_one_ulp_where_derived_passes():
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(64, 1024, generator=g).half(), torch.randn(1024, 64, generator=g).half()
    y = (a.float() @ b.float()).half()
    up = torch.nextafter(y, torch.full_like(y, math.inf))
    derived = {"rtol": 4 * 2.0**-11, "atol": 4 * (2.0**-11 * 32 + 32 * 2.0**-24 * 1024 * 2 / math.pi)}
    rows = widgets.tolerance_rows({"same": (y, y), "+1 ULP": (up, y)}, 1e-2, 0.0, derived)
    assert rows[0]["fixed says"] == "pass" and rows[0]["derived says"] == "pass"
    assert rows[1]["fixed says"] == "FAIL" and rows[1]["derived says"] == "pass"
    big = (y.float().abs() >= 16).sum()          # one fp16 ULP at |y| >= 16 is >= 2^-6 > 1e-2
    assert rows[1]["fail atol=1e-02 rtol=0e+00"] >= big
    loose = widgets.tolerance_rows({"+1 ULP": (up, y)}, 1.0, 0.0, derived)
    assert loose[0]["fixed says"] == "pass"


def test_tolerance_explorer_updates():
    y = torch.linspace(-40, 40, 256).half()
    up = torch.nextafter(y, torch.full_like(y, math.inf))
    box = widgets.tolerance_explorer({"+1 ULP": (up, y)}, {"rtol": 2e-3, "atol": 0.2})
    (atol, rtol), table, image = box.children[0].children, box.children[1], box.children[2]
    assert "FAIL" in table.value
    before = image.value
    atol.value = 1.0
    assert "FAIL" not in table.value and image.value != before
    rtol.value = 1e-2
    assert "rtol=1e-02" in table.value

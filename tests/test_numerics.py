"""Lab 05's references against hand-computed cases, and the MX cast / FP8 scale against torchao's."""
import math
import warnings

import pytest
import torch

from utils import numerics as nm

warnings.filterwarnings("ignore")


def test_ulp_distance_hand_cases():
    one = torch.tensor([1.0], dtype=torch.float16)
    assert nm.ulp_distance(one, nm.next_up(one)).item() == 1
    assert nm.next_up(one).item() == 1 + 2**-10           # fp16 has 10 mantissa bits
    a = torch.tensor([0.0, -0.0, 1.0, -1.0], dtype=torch.float32)
    b = torch.tensor([-0.0, 0.0, 1.0, 1.0], dtype=torch.float32)
    d = nm.ulp_distance(a, b)
    assert d[:3].tolist() == [0, 0, 0]
    assert d[3].item() == 2 * torch.tensor(1.0).view(torch.int32).item()   # across zero: both halves
    bf = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    assert nm.ulp_distance(bf[:1], bf[1:]).item() == 128   # one binade of bf16 has 2^7 values
    n = torch.tensor([float("nan")], dtype=torch.float16)
    assert nm.ulp_distance(n, one).item() == nm.NAN_DISTANCE
    with pytest.raises(ValueError, match="share a float dtype"):
        nm.ulp_distance(one, one.float())


def test_fixed_atol_fails_one_ulp_derived_tolerance_passes():
    torch.manual_seed(0)
    k = 1024
    a, b = torch.randn(16, k).half(), torch.randn(k, 16).half()
    c = (a.float() @ b.float()).half()
    c1 = nm.next_up(c)                                      # every element one ULP off
    big = c.float().abs() >= 16                             # fp16 ULP there >= 2^-6 > 1e-2
    assert big.any()
    with pytest.raises(AssertionError):
        torch.testing.assert_close(c1, c, atol=1e-2, rtol=0)
    torch.testing.assert_close(c, c, atol=1e-2, rtol=0)      # passes only when bit-identical
    tol = nm.gemm_tolerance(torch.float16, k)
    torch.testing.assert_close(c1, c, **tol)
    bound = nm.elementwise_bound(a, b, torch.float16)
    assert bool(((c1.double() - a.double() @ b.double()).abs() <= bound).all())
    assert not bool(((c1.double() + 1 - a.double() @ b.double()).abs() <= bound).all())


def test_accumulators_wrap_and_saturate_hand_cases():
    p = torch.tensor([[30000, 30000, -30000]])
    assert nm.accumulate(p, 16, "wrap").item() == 30000      # 60000 wraps to -5536, then -35536 wraps back
    assert nm.accumulate(p, 16, "saturate").item() == 32767 - 30000
    assert nm.accumulate(p, 32, "wrap").item() == 30000
    assert nm.wrap_int(torch.tensor([2**31]), 32).item() == -(2**31)
    a = torch.full((1, 300), 127, dtype=torch.int8)
    b = torch.full((300,), 127, dtype=torch.int8)
    exact = 127 * 127 * 300
    assert nm.int_dot(a, b, 32, "wrap").item() == exact
    assert nm.int_dot(a, b, 16, "saturate").item() == 32767
    assert nm.int_dot(a, b, 16, "wrap").item() == (exact + 2**15) % 2**16 - 2**15
    q = torch.full((1, 8), 7)
    assert nm.int_dot(q, torch.full((8,), -8), 8, "saturate", in_bits=4).item() == -128
    with pytest.raises(ValueError, match="int4"):
        nm.int_dot(torch.full((1, 2), 8), torch.ones(2, dtype=torch.int64), 16, "wrap", in_bits=4)
    with pytest.raises(ValueError, match="mode"):
        nm.accumulate(p, 16, "clip")


def test_wrap_is_order_free_saturate_is_not():
    torch.manual_seed(0)
    p = torch.randint(-16384, 16384, (4, 64))
    flip = p.flip(-1)
    assert torch.equal(nm.accumulate(p, 16, "wrap"), nm.accumulate(flip, 16, "wrap"))
    assert torch.equal(nm.accumulate(p, 16, "wrap"), nm.wrap_int(p.sum(-1), 16))
    big = torch.tensor([[32000, 32000, -32000, -32000]])
    assert nm.accumulate(big, 16, "saturate").item() != nm.accumulate(big.flip(-1), 16, "saturate").item()


def test_round_to_format_hand_cases_and_torch_casts():
    x = torch.tensor([0.0, 460.0, 470.0, 1000.0, -1000.0, 0.3, 2.0**-9, 2.0**-10])
    sat = nm.round_to_format(x, nm.E4M3, saturate=True)
    assert sat.tolist()[:5] == [0.0, 448.0, 448.0, 448.0, -448.0]
    non = nm.round_to_format(x, nm.E4M3, saturate=False)
    assert non[1].item() == 448.0 and math.isnan(non[2].item()) and math.isnan(non[3].item())
    assert sat[6].item() == 2.0**-9 and sat[7].item() == 0.0   # smallest subnormal; half of it ties to 0
    e2m1 = nm.round_to_format(torch.tensor([0.25, 0.75, 1.25, 2.5, 3.5, 5.0, 7.0]), nm.E2M1)
    assert e2m1.tolist() == [0.0, 1.0, 1.0, 2.0, 4.0, 4.0, 6.0]   # ties to even mantissa
    e5 = nm.round_to_format(torch.tensor([1e5]), nm.E5M2, saturate=False)
    assert e5.item() == math.inf
    torch.manual_seed(0)
    r = torch.randn(20000) * torch.logspace(-8, 2, 20000)
    for fmt, dt in ((nm.E4M3, torch.float8_e4m3fn), (nm.E5M2, torch.float8_e5m2)):
        assert torch.equal(nm.round_to_format(r, fmt), r.to(dt).double())


def test_naive_fp8_scale_gives_nan_and_fix_matches_torchao():
    from torchao.float8.float8_utils import amax_to_scale

    h = torch.tensor([0.0, 0.0, 0.1, 0.1], dtype=torch.float16)
    naive = nm.naive_fp8_quantize(h, torch.float8_e5m2)
    assert naive["inv_scale"] == math.inf                    # 57344 / 0.1 > 65504: fp16 overflows
    assert torch.isnan(naive["scaled"][:2]).all()            # 0 * inf
    tiny = torch.tensor([0.0, 0.0, 1e-3, 1e-3], dtype=torch.float16)
    assert torch.isnan(nm.naive_fp8_quantize(tiny, torch.float8_e4m3fn)["scaled"][:2]).all()
    for dt in (torch.float8_e4m3fn, torch.float8_e5m2):
        fixed = nm.fp8_quantize(h, dt)
        assert not torch.isnan(fixed["dequant"]).any()
        assert fixed["dequant"][:2].tolist() == [0.0, 0.0]
        assert abs(fixed["dequant"][2].item() - 0.1) < 0.1 * 2**-2
    torch.manual_seed(0)
    for amax in [torch.tensor(0.0), torch.tensor(1e-20), *torch.rand(50) * 10.0 ** torch.randint(-8, 8, (50,))]:
        for dt in (torch.float8_e4m3fn, torch.float8_e5m2):
            assert torch.equal(nm.fp8_scale(amax, dt), amax_to_scale(amax, dt))
    assert nm.fp8_scale(torch.tensor(0.0), torch.float8_e4m3fn).item() == pytest.approx(448e12)
    with pytest.raises(ValueError, match="eps"):
        nm.fp8_scale(torch.tensor(1.0), torch.float8_e4m3fn, eps=0)


def test_mx_cast_hand_block():
    x = torch.zeros(32)
    x[0], x[1], x[2] = 6.0, 1.0, -0.3
    m = nm.mx_cast(x, "mxfp4")
    assert m.scale_code.item() == 127                        # floor(log2 6) = 2, minus emax 2 -> 2^0
    assert m.values[:3].tolist() == [6.0, 1.0, -0.5] and m.codes[:3].tolist() == [7, 2, 8 | 1]
    y = torch.full((32,), 500.0)
    m8 = nm.mx_cast(y, "mxfp8")
    assert m8.scale_code.item() == 127 + 8 - 8               # 2^8 <= 500: scale 2^0
    assert m8.values[0].item() == 448.0                      # floor scaling then saturation
    z = nm.mx_cast(torch.zeros(64), "mxfp8")
    assert z.scale_code.tolist() == [0, 0] and z.dequant.abs().sum() == 0
    with pytest.raises(ValueError, match="multiple of block"):
        nm.mx_cast(torch.zeros(33), "mxfp8")


def _nonfinite_cases() -> dict:
    """Blocks of 32 holding NaN, +Inf, -Inf, mixtures with finite values, all zeros, and ordinary ones."""
    nan, inf = math.nan, math.inf
    gen = torch.Generator().manual_seed(3)
    t = torch.randn(8, 128, generator=gen)                  # 8 rows x 4 blocks
    t[0, 5] = nan                                           # NaN among finite values
    t[0, 40], t[0, 41] = inf, -3e38                         # +Inf beside a huge finite value
    t[0, 70] = -inf                                         # -Inf alone
    t[0, 100], t[0, 101] = inf, nan                         # Inf and NaN in one block
    t[1, :32] = nan                                         # all NaN
    t[1, 32:64] = inf                                       # all +Inf
    t[1, 64:96] = -inf                                      # all -Inf
    t[1, 96:] = 0.0                                         # all zero
    t[2, 0:32:2] = inf                                      # Inf and -Inf alternating with zeros
    t[2, 1:32:2] = -inf
    t[2, 32:64] = 0.0
    t[2, 33] = -nan                                         # a negative NaN among zeros
    return {"mixed": t}


def test_mx_cast_non_finite_hand_blocks():
    inf, nan = math.inf, math.nan
    x = torch.zeros(32)
    x[0], x[1], x[2] = inf, 1.0, -2.0
    spec = nm.mx_cast(x, "mxfp8")
    assert spec.scale_code.item() == 255                    # floor(log2 Inf) fits no E8M0 code but NaN
    assert torch.isnan(spec.dequant).all()
    ao = nm.mx_cast(x, "mxfp8", rules="torchao")
    assert ao.scale_code.item() == 128 - 8 + 127            # Inf's exponent field read as 2^128
    assert ao.values[0].item() == 448.0 and ao.values[1:3].tolist() == [0.0, -0.0]
    assert ao.dequant[0].item() == inf                      # 448 * 2^120 overflows fp32
    a4 = nm.mx_cast(-x, "mxfp4", rules="torchao")
    assert a4.scale_code.item() == 128 - 2 + 127 and a4.codes[0].item() == 8 | 7   # -6, saturated
    x[3] = nan
    for rules in nm.MX_RULES:
        m = nm.mx_cast(x, "mxfp8", rules=rules)
        assert m.scale_code.item() == 255 and torch.isnan(m.dequant).all()
        assert m.codes[1].item() == 0x00 and m.codes[2].item() == 0x80   # x / +Inf: signed zeros
    with pytest.raises(ValueError, match="rules"):
        nm.mx_cast(x, "mxfp8", rules="ieee")


@pytest.mark.parametrize("elem", ["mxfp8", "mxfp4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mx_cast_bit_exact_vs_torchao(elem, dtype):
    torch.manual_seed(0)
    cases = {"randn": torch.randn(32, 128),
             "wide": torch.randn(32, 128) * torch.logspace(-30, 30, 32)[:, None],
             "zero": torch.zeros(4, 64),
             "huge": torch.randn(4, 64).clamp(-3, 3) * 1.1e38,
             "tiny": torch.randn(4, 64) * 1e-39,            # blocks whose scale is E8M0 code 0
             **_nonfinite_cases()}
    for name, t in cases.items():
        t = t.to(dtype)
        r = nm.compare_mx(t, elem, rules="torchao")
        assert r["scale_mismatches"] == 0 and r["code_mismatches"] == 0 and r["decoded_mismatches"] == 0, (name, r)
        spec = nm.compare_mx(t, elem)
        if name in ("randn", "wide", "zero", "huge"):       # no rule differs here
            assert spec == r, (name, spec)
        if name == "tiny" and dtype == torch.float32:       # spec 2^-127 vs torchao's 2^-126
            assert spec["scale_mismatches"] == 0 and spec["code_mismatches"] > 0
    r = nm.compare_mx(_nonfinite_cases()["mixed"].to(dtype), elem)
    inf_only = 5                                            # blocks with an Inf and no NaN: spec says NaN
    assert r["non_finite_blocks"] == 9 and r["scale_mismatches"] == inf_only, r


def test_mx_linear_axes_and_sqnr_anchors():
    torch.manual_seed(0)
    x, w, gy = torch.randn(64, 128), torch.randn(96, 128) * 0.05, torch.randn(64, 96)
    g = nm.mx_linear_grads(x, w, gy, "mxfp8")
    assert g["output"].shape == (64, 96) and g["grad_input"].shape == (64, 128) and g["grad_weight"].shape == (96, 128)
    exact = nm.mx_cast(x, "mxfp8").dequant                   # already on the MX grid along K
    ge = nm.mx_linear_grads(exact, w, gy, "mxfp8")
    assert torch.equal(ge["output"], nm.mx_fake(exact, "mxfp8", -1) @ nm.mx_fake(w, "mxfp8", -1).T)
    gw = nm.mx_fake(gy, "mxfp8", 0).T @ nm.mx_fake(x, "mxfp8", 0)
    assert torch.equal(g["grad_weight"], gw)
    s8 = nm.mx_linear_sqnr(x, w, gy, "mxfp8")
    s4 = nm.mx_linear_sqnr(x, w, gy, "mxfp4")
    assert s8["output_db"] > 15 and s8["grad_input_db"] >= 25 and s8["grad_weight_db"] >= 25
    assert s4["output_db"] > 15 and s4["output_db"] < s8["output_db"]
    with pytest.raises(ValueError, match="recipe"):
        nm.mx_linear_grads(x, w, gy, "mxfp8", recipe="once")


def test_error_report_and_chunked_accumulation():
    r = nm.error_report(torch.tensor([1.0, 2.5, 0.0]), torch.tensor([1.0, 2.0, 0.0]))
    assert r["max_abs"] == 0.5 and r["max_rel"] == 0.25
    a = torch.ones(1, 4096)
    b = torch.ones(4096, 1)
    assert nm.chunked_matmul(a, b, torch.float32).item() == 4096
    assert nm.chunked_matmul(a, b, torch.float16, chunk=1).item() == 2048   # 2048 + 1 rounds back to 2048
    assert nm.chunked_matmul(a, b, torch.float16, chunk=32).item() == 4096  # exact: multiples of 32 stay representable


def test_gemm_tolerance_and_elementwise_bound_read_the_one_bound():
    from utils.metrics import matmul_error_bound

    u16, u32, k = 2.0**-11, 2.0**-24, 1024
    tol = nm.gemm_tolerance(torch.float16, k)                # unchanged numbers for fp16
    assert tol["rtol"] == 4 * u16
    assert tol["atol"] == pytest.approx(4 * (u16 * math.sqrt(k) + math.sqrt(k) * u32 * k * 2 / math.pi), rel=1e-12)
    assert tol["rtol"] == matmul_error_bound(torch.float16, k, sums_abs=0.0)
    a = torch.tensor([[1 + 2.0**-12, -1.0]])
    b = torch.tensor([[1.0], [1.0]])
    # tf32 rounds a to [1, -1]: the product is 0, off by 2^-12; the bound must cover the inputs' rounding
    assert nm.elementwise_bound(a, b, "tf32").item() >= 2.0**-12
    with pytest.raises(ValueError, match="k"):
        nm.gemm_tolerance(torch.float16, 0)

"""utils.operator_checks: Lab 05's experiments, on the CPU (Triton through its interpreter) at small sizes."""
import math

import pytest
import torch

from utils import metrics, numerics
from utils import operator_checks as checks


@pytest.fixture(scope="module")
def gemm():
    gen = torch.Generator().manual_seed(0)
    A, B = torch.randn(32, 256, generator=gen), torch.randn(256, 32, generator=gen)
    rows, outs = checks.gemm_precision(A, B, "cpu")
    return A, B, {r["case"]: r for r in rows}, outs


def test_gemm_precision_runs_what_the_interpreter_can_and_says_why_not(gemm):
    _, _, rows, outs = gemm
    assert list(rows) == [c for c, _, _ in checks.GEMM_CASES]
    assert rows["bf16"]["status"] == "skipped: the interpreter has no bfloat16" and "bf16" not in outs
    assert rows["fp32 tf32"]["status"] == "ran as ieee: the interpreter ignores input_precision"
    assert rows["fp16"]["status"] == "ran"


def test_gemm_precision_measures_against_float64_of_the_rounded_inputs(gemm):
    A, B, rows, outs = gemm
    ours, theirs, ref = outs["fp16"]
    assert torch.equal(ref, A.half().double() @ B.half().double())
    assert rows["fp16"]["ours rel_l2"] == metrics.relative_l2(ours, ref)
    assert rows["fp16"]["ours rel_l2"] <= checks.case_bound("fp16", 256)
    assert rows["fp16"]["ULPs ours vs torch (max)"] == int(numerics.ulp_distance(ours, theirs).max())


def test_case_bound_gives_tf32_its_own_bound():
    assert checks.case_bound("fp32 tf32", 1024) == metrics.matmul_error_bound("tf32", 1024)
    assert checks.case_bound("fp32 tf32x3", 1024) == metrics.matmul_error_bound(torch.float32, 1024)
    assert checks.case_bound("bf16", 64) == metrics.matmul_error_bound(torch.bfloat16, 64)
    assert checks.case_bound("fp32 tf32", 1024) > checks.case_bound("fp32 ieee", 1024)


def test_a_fixed_atol_fails_one_ulp_that_the_derived_tolerance_passes():
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(16, 1024, generator=gen).half(), torch.randn(1024, 16, generator=gen).half()
    c = (a.float() @ b.float()).half()
    ref = a.double() @ b.double()
    tol = numerics.gemm_tolerance(torch.float16, 1024)
    rows = checks.tolerance_rows(c, c, ref, numerics.elementwise_bound(a, b, torch.float16), tol)
    assert rows["torch vs itself"] == {"max ULPs": 0, "atol=1e-2": "pass", "derived tolerance": "pass",
                                       "within bound of fp64": True}
    one_up = rows["torch vs torch + 1 ULP"]
    assert (one_up["max ULPs"], one_up["atol=1e-2"], one_up["derived tolerance"]) == (1, "FAIL", "pass")


def test_accumulation_sweep_fp16_accumulator_loses_more_as_k_grows():
    rows = checks.accumulation_sweep([64, 4096], "cpu", rows=8)
    assert [(r["dist"], r["K"]) for r in rows] == [("rand", 64), ("rand", 4096), ("randn", 64), ("randn", 4096)]
    rand = [r for r in rows if r["dist"] == "rand"]
    assert rand[1]["emulated float16 acc"] > 4 * rand[0]["emulated float16 acc"]
    assert all(r["emulated float32 acc"] < 2**-10 for r in rows)       # only the fp16 output's rounding
    fig = checks.plot_accumulation(rows)
    assert [ax.get_title() for ax in fig.axes] == ["fp16 inputs, rand", "fp16 inputs, randn"]


def test_grouped_errors_every_kernel_within_the_bound_an_empty_group_included():
    table, _ = checks.grouped_errors([8, 0, 5], "cpu", torch.Generator().manual_seed(0), k=64, n=16)
    assert "ours (pointers)" in table and "torch.matmul loop" in table
    assert all(r["rel_l2"] <= r["bound (rel_l2)"] for r in table.values())


def test_int_accumulator_cases_wrap_and_saturate():
    rows = {(r["inputs"], r["K"]): r for r in checks.int_accumulator_cases(ks=(4, 1024))}
    r = rows[("int8 all 127", 4)]
    assert r["exact"] == 4 * 127 * 127 == 64516
    assert (r["int16 saturate"], r["int16 wrap"], r["int32 wrap"]) == (32767, 64516 - 65536, 64516)
    assert rows[("int8 all -128", 1024)]["exact"] == 1024 * 128 * 128


def test_int8_overflow_names_what_the_kernel_did():
    k = 140_000                                     # 127 * 127 * k passes 2**31 - 1
    row = checks.int8_overflow("torch._int_mm", 127, k, "cpu")
    exact = 127 * 127 * k
    assert (row["exact"], row["int32 saturate"], row["int32 wrap"]) == (exact, 2**31 - 1, exact - 2**32)
    assert row["behaviour"] in ("exact", "wrapped", "saturated", "other") or row["behaviour"].startswith("error:")
    if row["got"] is not None:
        assert row["behaviour"] == {exact: "exact", exact - 2**32: "wrapped", 2**31 - 1: "saturated"}.get(row["got"], "other")


def test_fp8_scaling_the_naive_fp16_scale_makes_nan_of_zeros_the_fixed_one_matches_torchao():
    rows = checks.fp8_scaling_rows()
    tiny = [r for r in rows if r["x (fp16)"] == [0.0, 0.0, 1e-3, 1e-3]]
    assert any(r["NaNs naive"] > 0 for r in tiny)               # 1/scale overflows fp16: 0 * inf
    assert all(r["== torchao amax_to_scale"] for r in rows)
    assert all(not any(math.isnan(v) for v in r["fixed dequant"]) for r in rows)
    assert checks.fp8_scale_matches_torchao(torch.tensor([0.0, 1e-30, 3.5, 1e5]))


def test_e4m3_cast_reads_saturating_or_not():
    xs = torch.tensor([300.0, 448.0, 470.0, 500.0, float("inf"), float("nan")])
    columns, mode = checks.e4m3_cast(xs, "cpu")
    assert columns["e4m3fn saturating (ref)"][3] == 448.0
    assert math.isnan(columns["e4m3fn non-saturating (ref)"][3])
    got = columns[f"torch {torch.__version__} .to() on cpu"]
    expected = "saturating" if got[3] == 448.0 else "non-saturating" if math.isnan(got[3]) else "neither"
    assert mode == expected


def test_mx_comparison_is_bit_exact_under_torchao_rules_and_names_where_the_spec_differs():
    cases = checks.mx_cases(2, torch.Generator().manual_seed(0))
    assert all(t.shape == (2, 256) for t in cases.values())
    assert math.isnan(cases["a NaN in every block"][0, 5]) and cases["+Inf in every block"][1, 41] == math.inf
    rows = checks.mx_comparison({k: cases[k] for k in ("random", "+Inf in every block")})
    verdict = {(r["case"], r["elem"]): r["bit-exact vs torchao"] for r in rows}
    assert verdict[("random", "mxfp8")] == "under both rules"
    assert verdict[("+Inf in every block", "mxfp8")] == "under torchao rules"


def test_platform_tolerance_rows_end_with_the_reported_rocm_case():
    trip = {"quantized_on": "cpu", "run_on": "cpu", "format": "torch.save", "max_abs_diff": 0.0,
            "assert_close_default": "passed", "relative_l2": 0.0, "derived_bound": 1e-5, "derived_bound_passes": True}
    rows = checks.platform_tolerance_rows([trip], 100.0)
    assert rows[0]["pair"] == "cpu -> cpu (torch.save)" and rows[0]["derived check"] == "pass"
    assert rows[-1]["max abs diff"] == checks.ROCM_REPORTED_MAX_ABS and rows[-1]["derived bound (rel L2)"] == 1e-5


# planted faults: the verdict must fail and name the place ------------------------------------------

def _fp16_acc(a, b, **kw):
    return numerics.chunked_matmul(a, b, torch.float16 if a.dtype == torch.float16 else torch.float32).to(a.dtype)


def _edit(fn):
    def faulty(a, b, **kw):
        c = REAL_MATMUL(a, b, **kw)
        fn(c, a, b, kw)
        return c
    return faulty


REAL_MATMUL = checks.kernels.matmul
GEMM_FAULTS = {  # name: (the faulty matmul, what the verdict must name)
    "transposed B (square)": (lambda a, b, **kw: REAL_MATMUL(a, b.t().contiguous(), **kw), "elements outside"),
    "last tile misses the K tail": (_edit(lambda c, a, b, kw: c[-32:, -32:].copy_(
        REAL_MATMUL(a[-32:, :-8].contiguous(), b[:-8, -32:].contiguous(), **kw))), "tiles (row, col) of 32x32: (1, 1)"),
    "one element 1% off": (_edit(lambda c, a, b, kw: c[7, 9].mul_(1.01)), "first [7, 9]"),
    "a NaN in one element": (_edit(lambda c, a, b, kw: c[3, 5].fill_(float("nan"))), "first [3, 5] (not finite)"),
    "one row 1% off": (_edit(lambda c, a, b, kw: c[5].mul_(1.01)), "rows 5,"),
    "+1 ULP on every element": (lambda a, b, **kw: numerics.next_up(REAL_MATMUL(a, b, **kw)), "systematic"),
    "an fp16 accumulator": (_fp16_acc, "elements outside"),
}


@pytest.fixture(scope="module")
def square():
    gen = torch.Generator().manual_seed(3)
    return torch.randn(64, 64, generator=gen), torch.randn(64, 64, generator=gen)


def test_the_gemm_verdict_passes_the_kernel_as_it_is(square):
    A, B = square
    _, outs = checks.gemm_precision(A, B, "cpu")
    assert checks.gemm_verdict(A, B, outs)["verdict"] == "ok"


@pytest.mark.parametrize("fault", list(GEMM_FAULTS))
def test_a_planted_gemm_fault_fails_the_verdict_naming_where(square, monkeypatch, fault):
    """Faults a global relative L2 averages away (one element, one row, one ULP of bias, an fp16 accumulator)
    fail the element-by-element verdict, which names the case, element, rows, columns and tile."""
    A, B = square
    matmul, named = GEMM_FAULTS[fault]
    monkeypatch.setattr(checks.kernels, "matmul", matmul)
    _, outs = checks.gemm_precision(A, B, "cpu")
    verdict = checks.gemm_verdict(A, B, outs)
    assert verdict["verdict"] == "fail" and verdict["detail"].startswith("fp16: ") and named in verdict["detail"], verdict


def test_a_planted_grouped_fault_names_the_group(monkeypatch):
    groups, real = [8, 0, 12, 4], checks.kernels.grouped_matmul
    assert checks.grouped_verdict(groups, "cpu", torch.Generator().manual_seed(0), k=64, n=16)["verdict"] == "ok"

    def wrong_weights(a, b, offs, **kw):               # group 2 multiplied by group 3's matrix
        c = real(a, b, offs, **kw)
        c[8:20] = a[8:20] @ b[3]
        return c
    monkeypatch.setattr(checks.kernels, "grouped_matmul", wrong_weights)
    verdict = checks.grouped_verdict(groups, "cpu", torch.Generator().manual_seed(0), k=64, n=16)
    assert verdict["verdict"] == "fail" and "rows 8, 9" in verdict["detail"] and "groups 2" in verdict["detail"], verdict


def test_where_wrong_reads_unbiased_rounding_as_clean_and_a_small_scale_as_systematic():
    gen = torch.Generator().manual_seed(4)
    a, b = torch.randn(64, 256, generator=gen).half(), torch.randn(256, 64, generator=gen).half()
    ref, bound = a.double() @ b.double(), numerics.elementwise_bound(a, b, torch.float16)
    assert checks.where_wrong((a.float() @ b.float()).half(), ref, bound)["ok"]
    scaled = checks.where_wrong((ref * (1 + 2**-11)).half(), ref, bound)   # half an fp16 ULP: every element within
    assert scaled["bad"] == 0 and not scaled["ok"] and "systematic scale" in scaled["detail"]


def test_the_mean_error_test_is_kept_for_additions_that_round_to_nearest(monkeypatch):
    """On a GPU, tensor cores truncate inside their accumulation: a bias toward zero that is the hardware's,
    not a fault. Only the interpreter and fp32 "ieee" (vector FMA) are judged by the mean-error test there."""
    assert checks.rounds_to_nearest(None) and checks.rounds_to_nearest("tf32")        # the interpreter: numpy
    monkeypatch.setattr(checks.kernels, "interpreted", lambda: False)
    assert [checks.rounds_to_nearest(prec) for _, _, prec in checks.GEMM_CASES] == [False, False, True, False, False]


def test_groups_that_are_all_empty_are_refused_by_name():
    """No row to multiply would make every error 0, a verdict of ok that checked nothing."""
    from bad_input_table import record

    with pytest.raises(ValueError) as err:
        checks.grouped_errors([0, 0], "cpu", torch.Generator().manual_seed(0), k=16, n=8)
    msg = record("lab parameters cell", "05_kernels: groups = [0, 0] (every group empty)", str(err.value))
    assert msg.startswith("groups=[0, 0]: every group is empty") and "e.g. groups = [48, 0, 80, 16]" in msg

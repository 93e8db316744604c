"""utils.exercises (the self-check runner) and utils.formulas (references the exercises fall back to)."""
import functools
import math

import pytest
import torch

from utils import exercises, formulas, roofline
from utils.exercises import Case, ExerciseFailed


def double(x):
    return 2 * x


def not_done(x):
    raise NotImplementedError()


def times_two(x):
    return x + x


def test_mismatch_says_how_a_tensor_differs():
    e = torch.tensor([1.0, 2.0, 3.0])
    assert exercises.mismatch(e.clone(), e) is None
    assert "shape (2,)" in exercises.mismatch(e[:2], e)
    assert "dtype torch.float16" in exercises.mismatch(e.half(), e)
    why = exercises.mismatch(torch.tensor([1.0, 2.5, 3.0]), e)
    assert "1 of 3 elements differ" in why and "index 1" in why and "2.5" in why
    assert exercises.mismatch([1, 2, 3], e) == "expected a torch.Tensor, got list"
    assert exercises.mismatch(torch.tensor([float("nan")]), torch.tensor([float("nan")])) is None
    assert exercises.mismatch(torch.tensor([1], dtype=torch.int32), torch.tensor([1]), same_dtype=False) is None
    assert "dtype" in exercises.mismatch(torch.tensor([1.0]), torch.tensor([1]), same_dtype=False)


def test_mismatch_numbers_strings_dicts():
    assert exercises.mismatch(0.1 + 0.2, 0.3) is None
    assert "off by" in exercises.mismatch(0.31, 0.3)
    assert exercises.mismatch(math.inf, math.inf) is None and exercises.mismatch(1e300, math.inf)
    assert exercises.mismatch(float("nan"), float("nan")) is None
    assert "expected a number" in exercises.mismatch("3", 3)
    assert exercises.mismatch(torch.tensor(2.0), 2.0) is None
    assert exercises.mismatch(None, None) is None and "expected None" in exercises.mismatch(0, None)
    assert exercises.mismatch("18", "18") is None and exercises.mismatch(18, "18")
    assert exercises.mismatch(True, True) is None and "True or False" in exercises.mismatch(1, True)
    assert "missing key(s) ['label']" in exercises.mismatch({"drop_rel": 0.1}, {"drop_rel": 0.1, "label": "x"})
    assert "['label']" in exercises.mismatch({"drop_rel": 0.1, "label": "y"}, {"drop_rel": 0.1, "label": "x"})
    assert exercises.mismatch({"a": 1, "extra": 2}, {"a": 1}) is None
    assert "2 items" in exercises.mismatch([1], (1, 2))


def test_self_check_passes_returns_the_students_function(capsys):
    assert exercises.self_check(times_two, [Case((2,), 4), Case((0.5,), 1.0)], reference=double) is times_two
    out = capsys.readouterr()
    assert "times_two: self-check passed on 2 hand-made cases." in out.out and out.err == ""


def test_not_done_says_so_never_passed_and_falls_back(capsys):
    assert exercises.self_check(not_done, [Case((2,), 4)], reference=double) is double
    out = capsys.readouterr()
    assert "not_done: not done yet" in out.out and "test_exercises.double meanwhile" in out.out
    assert "passed" not in out.out and out.err == ""
    with pytest.raises(ExerciseFailed, match="not_done: not done yet"):
        exercises.grade(not_done, [Case((2,), 4)])


def test_wrong_answer_names_the_case_and_the_hint():
    with pytest.raises(ExerciseFailed, match=r"wrong on case two: got 3, expected 4 \(off by -1\). Hint: add one more"):
        exercises.self_check(lambda x: x + 1, [Case((1,), 2), Case((2,), 4, "two", hints=((3, "add one more"),))])
    with pytest.raises(ExerciseFailed, match=r"raised ZeroDivisionError: .* on case \(0\)"):
        exercises.grade(lambda x: 1 / x, [Case((0,), 1.0)])


def test_cases_that_fail_the_reference_are_the_exercises_bug():
    with pytest.raises(RuntimeError, match="own cases fail for the reference .*test_exercises.double"):
        exercises.self_check(double, [Case((2,), 5)], reference=double)


def test_grade_returns_none_so_no_partial_credit_is_read():
    assert exercises.grade(double, exercises.against(double, [(1,), (2.5,)])) is None
    with pytest.raises(ValueError, match="cases is empty"):
        exercises.grade(double, [])


def test_reference_name_of_a_partial():
    from utils import numerics
    name = exercises.reference_name(functools.partial(numerics.accumulate, bits=16, mode="saturate"))
    assert name == "utils.numerics.accumulate(bits=16, mode='saturate')"


def test_formulas_agree_with_the_roofline_and_torch():
    peak, bw = 989.0, 3350.0
    r = formulas.ridge_point(peak, bw)
    assert roofline.bound({"intensity": r * 0.99}, peak, bw) == "memory"
    assert roofline.bound({"intensity": r * 1.01}, peak, bw) == "compute"
    m, n, k = 16, 4096, 4096
    assert formulas.gemm_intensity(m, n, k, 2) == pytest.approx(2 * m * n * k / roofline.gemm_bytes(m, n, k, 2, 2, 2))
    assert formulas.gptq_bytes_per_parameter(4, 128) == pytest.approx(roofline.int4_weight_bytes(4096, 4096) / 4096**2)
    g, t = torch.randn(50, dtype=torch.float64), torch.randn(50, dtype=torch.float64)
    kl = torch.nn.functional.kl_div(torch.log_softmax(t, -1), torch.log_softmax(g, -1), log_target=True,
                                    reduction="sum")
    assert formulas.kl_divergence(g, t) == pytest.approx(float(kl), rel=1e-12)
    with pytest.raises(ValueError, match="bandwidth_gbps"):
        formulas.ridge_point(1.0, 0.0)
    with pytest.raises(ValueError, match="shape"):
        formulas.kl_divergence(torch.zeros(3), torch.zeros(4))


def test_mx_scale_code_is_the_blocks_code_in_mx_cast():
    from utils import numerics
    x = torch.randn(4, 64) * torch.tensor([[1e-3], [1.0], [7.0], [0.0]])
    codes = numerics.mx_cast(x, "mxfp8", block=32).scale_code
    assert [formulas.mx_scale_code(x[r, 32 * b:32 * (b + 1)]) for r in range(4) for b in range(2)] == codes.flatten().tolist()
    assert formulas.mx_scale_code(torch.ones(32)) == 119 and formulas.mx_scale_code(torch.ones(32), "mxfp4") == 125
    assert formulas.mx_scale_code(torch.zeros(32)) == 0


# --- the answer key is not an answer, in JupyterLab too ------------------------------------------------------

def test_self_check_refuses_a_function_that_calls_the_reference_under_any_name():
    import inspect
    cases = [Case((100.0, 1000.0), 100.0), Case((0.5, 20.0), 25.0)]

    def direct(p, b):
        return formulas.ridge_point(p, b)

    def default_arg(p, b, _f=formulas.ridge_point):
        return _f(p, b)
    ns = {}
    exec(inspect.getsource(formulas.ridge_point).replace("def ridge_point", "def copied"), ns)

    def copy_of_source(p, b):
        return ns["copied"](p, b)
    for fn in (direct, default_arg, copy_of_source):
        with pytest.raises(exercises.ReferenceCalled, match=rf"{fn.__name__} calls the course's reference "
                                                             r"utils.formulas.ridge_point: .* scores 0 when graded"):
            exercises.self_check(fn, cases, reference=formulas.ridge_point)

    def own(p, b):
        return p * 1e12 / (b * 1e9)
    assert exercises.self_check(own, cases, reference=formulas.ridge_point) is own
    partial_ref = functools.partial(numerics_accumulate(), bits=16, mode="saturate")
    with pytest.raises(exercises.ReferenceCalled, match="numerics.accumulate"):
        exercises.self_check(lambda p: partial_ref(p), [Case((torch.tensor([1, 2]),), torch.tensor(3))],
                             reference=partial_ref)


def numerics_accumulate():
    from utils import numerics
    return numerics.accumulate


def test_recording_keeps_cases_and_runs_nothing():
    calls = []

    def student(x):
        calls.append(x)
        return 2 * x
    with exercises.recording() as rec:
        assert exercises.self_check(student, [Case((2,), 4)], reference=double) is student
        assert exercises.grade(student, exercises.against(double, [(3,), (5,)])) is None
    assert calls == [] and exercises._RECORDING is None
    assert [c.expected for c in rec["student"]["hidden"]] == [6, 10] and rec["student"]["reference"] is double
    assert [c.args for c in rec["student"]["visible"]] == [(2,)]


def test_in_the_grading_sandbox_the_check_does_not_run_the_reference(monkeypatch, capsys):
    def stub(x):
        raise exercises.ReferenceCalled("stub")
    monkeypatch.setenv(exercises.GRADING_ENV, "1")
    assert exercises.self_check(double, [Case((2,), 4)], reference=stub) is double
    with pytest.raises(exercises.ReferenceCalled, match="calls the course's reference"):
        exercises.self_check(lambda x: stub(x), [Case((2,), 4)], reference=stub)


def test_answers_cross_the_sandbox_wall_as_plain_json():
    import json
    values = [1, 2.5, float("nan"), None, True, "x", (torch.float16, torch.tensor([1.5, 2.0], dtype=torch.bfloat16)),
              {"drop_rel": 0.1, "label": "expected"}, torch.zeros(0, 3), torch.tensor([1.0]).to(torch.float8_e4m3fn)]
    back = exercises.decode(json.dumps(exercises.encode(values)))
    assert exercises.mismatch(back, values) is None and isinstance(back[6], tuple)
    odd = exercises.decode(json.dumps(exercises.encode([object()])))[0]
    assert "expected a number, got object" in exercises.mismatch(odd, 1.0)
    for bad in ('{"__tensor__": ["float32", [2], "AAAA"]}', '{"__dtype__": "complex32"}', '{"__tensor__": 1}'):
        with pytest.raises(ValueError):
            exercises.decode(bad)


def test_harvest_writes_answers_and_errors_and_drops_what_the_function_prints(tmp_path, capsys):
    import json

    def student(x):
        print("the hidden input is", x)
        if x == 0:
            raise ZeroDivisionError("x is 0")
        if x == 1:
            raise NotImplementedError
        return torch.tensor([x])
    (tmp_path / "in.json").write_text(json.dumps(exercises.encode([[(5,), {}], [(0,), {}], [(1,), {}]])))
    exercises.harvest("student", {"student": student}, str(tmp_path / "in.json"), str(tmp_path / "out.json"))
    got = exercises.decode((tmp_path / "out.json").read_text())["answers"]
    assert exercises.mismatch(got[0]["value"], torch.tensor([5])) is None
    assert got[1] == {"error": "ZeroDivisionError", "message": "x is 0"}
    assert got[2] == {"error": "NotImplementedError", "message": "not done yet"}
    assert "hidden input" not in capsys.readouterr().out
    exercises.harvest("gone", {}, str(tmp_path / "in.json"), str(tmp_path / "out.json"))
    assert "no function named gone" in (tmp_path / "out.json").read_text()

"""The grader's parts without a round: the stubbed references, the cells a submission runs, its score."""
import json
import subprocess
import sys

import nbformat
import pytest

from ci import grade, grade_key, sandbox
from tests.grading_helpers import add_helper, lab01, set_solution


@pytest.fixture(scope="module")
def key01():
    return grade_key.answer_key("01_env", grade.graded_labs()["01_env"])


@pytest.fixture(scope="module")
def release01(tmp_path_factory):
    out = tmp_path_factory.mktemp("rel") / "out"
    grade.make_release(out, ["01_env"])
    return nbformat.read(out / "course/release/01_env/01_env.ipynb", as_version=4)


def test_the_sandboxs_utils_has_no_answer_key(tmp_path, key01):
    """Every reference is a stub in the copy (under any import name), the rest of utils works as before."""
    work = tmp_path / "w"
    work.mkdir()
    code = sandbox.prepare(work, {t for e in key01.values() if (t := e.reference_target())})
    probe = ("import inspect\nfrom utils import formulas, metrics, numerics, exercises\n"
             "for f in (formulas.ridge_point, metrics.matmul_error_bound, numerics.matmul_error_bound):\n"
             "    try:\n        f(1.0, 2.0)\n    except exercises.ReferenceCalled as e:\n        print('STUB', e)\n"
             "print('1e12' in inspect.getsource(formulas.ridge_point), 'SOURCE'\n"
             "      if 'finfo' in inspect.getsource(metrics.matmul_error_bound) else 'NO SOURCE')\n"
             "print(formulas.gptq_bytes_per_parameter(4, 128))")
    r = subprocess.run([sys.executable, "-c", probe], cwd=work, capture_output=True, text=True,
                       env={"PYTHONPATH": str(code), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "STUB formulas.ridge_point is the course's reference for this exercise: not available while grading; write your own"
    assert lines[1].startswith("STUB metrics.matmul_error_bound") and lines[2].startswith("STUB metrics.matmul_error_bound")
    assert lines[3] == "False NO SOURCE"           # the body is gone: inspect.getsource copies a stub
    assert float(lines[4]) == pytest.approx(0.51953125)
    assert (grade.REPO_ROOT / "utils/formulas.py").read_text().count("ReferenceCalled") == 0


def test_a_reference_that_is_not_a_top_level_function_is_refused(tmp_path):
    (tmp_path / "utils").mkdir()
    (tmp_path / "utils" / "m.py").write_text("class C:\n    def f(self):\n        return 1\n")
    with pytest.raises(sandbox.SandboxError, match=r"reference\(s\) \['f'\] are not top-level functions of m.py"):
        sandbox.stub_references(tmp_path, {("utils.m", "f")})


def test_cells_to_run_keeps_helpers_drops_the_lesson_and_restores_checks(key01, release01):
    nb = add_helper(lab01(), "def _helper():\n    return 1")
    set_solution(nb, "ridge_point", "def ridge_point(p, b):\n    return _helper()")
    check = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "ridge_point_tests")
    check.source = "pass  # the student's own check"
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") != "gemm_intensity_tests"]
    nb.cells[0].metadata["nbgrader"] = ["not", "a", "dict"]          # damaged metadata: tolerated
    ran, notes = grade_key.cells_to_run(nb, release01, key01)
    roles = [c.metadata["quantlab"]["role"] for c in ran.cells]
    assert roles == ["setup", "helper", "solution", "check", "solution", "check", "solution", "check"]
    assert "def _helper" in ran.cells[1].source and "return _helper()" in ran.cells[2].source
    checks = [c.source for c in ran.cells if c.metadata["quantlab"]["role"] == "check"]
    assert all("HIDDEN" not in s and "exercises.self_check(" in s for s in checks)
    assert "ridge_point: check cell edited; the course's copy ran" in notes
    assert "gemm_intensity: check cell deleted; the course's copy ran (no points lost)" in notes
    lesson = {c.source for c in release01.cells if c.cell_type == "code" and "nbgrader" not in c.metadata}
    assert not lesson & {c.source for c in ran.cells}


def test_score_names_what_happened(tmp_path, key01):
    e = key01["ridge_point"]
    n = len(e.visible) + len(e.hidden)
    cases = {"not done yet": [{"error": "NotImplementedError", "message": "not done yet"}] * n,
             "calls the course's reference utils.formulas.ridge_point": [{"value": 1.0}] + [
                 {"error": "ReferenceCalled", "message": "x"}] * (n - 1),
             "wrong on hidden case 1 of 5 (the hand-made cases pass)":
                 [{"value": c.expected} for c in e.visible] + [{"value": -1.0}] * len(e.hidden),
             "its answers are incomplete": [{"value": 1.0}],
             "solution missing: no function named ridge_point": {"missing": "no function named ridge_point"}}
    for why, answers in cases.items():
        (tmp_path / "a.json").write_text(json.dumps({"answers": answers}))
        pts, got = grade_key.score(e, tmp_path / "a.json")
        assert pts == 0.0 and why in got, (why, got)
    (tmp_path / "a.json").write_text(json.dumps({"answers": [{"value": c.expected} for c in e.visible + e.hidden]}))
    assert grade_key.score(e, tmp_path / "a.json") == (1.0, "")
    (tmp_path / "a.json").write_text("not json")
    assert "could not be read" in grade_key.score(e, tmp_path / "a.json")[1]
    assert grade_key.score(e, tmp_path / "none.json", "cut at the 300 s submission limit") == (
        0.0, "cut at the 300 s submission limit")


def test_a_pasted_copy_of_the_reference_scores_zero_as_at_home(key01, release01):
    """Students have utils/ at home: its source pasted whole is what the home check already refuses
    (same bytecode); graded, the sandbox's reference is a stub, so only the grader's own look finds it."""
    import inspect

    from utils import exercises, formulas

    src = inspect.getsource(formulas.ridge_point)
    ns = {}
    exec(src, ns)                                                # as the student's kernel at home would
    with pytest.raises(exercises.ReferenceCalled):
        exercises.self_check(ns["ridge_point"], key01["ridge_point"].visible, reference=formulas.ridge_point)
    nb = set_solution(lab01(), "ridge_point", src)
    nb = add_helper(nb, "%load_ext autoreload\n" + inspect.getsource(formulas.gemm_bytes))   # a magic, a helper
    ran, _ = grade_key.cells_to_run(nb, release01, key01)
    found = grade_key.copied_references(ran, key01)
    assert set(found) == {"ridge_point"}, found
    assert "calls the course's reference utils.formulas.ridge_point" in found["ridge_point"]
    assert "a copy of its code is in the notebook" in found["ridge_point"]
    assert grade_key.copied_references(grade_key.cells_to_run(lab01(), release01, key01)[0], key01) == {}

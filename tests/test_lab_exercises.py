"""The labs' exercise cells as a student meets them: blank, they say "not done yet" and never "passed"."""
import contextlib
import io
import re

import nbformat
import pytest
import torch

from tests.conftest import ROOT

HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", re.S)


def released(source: str) -> str:
    """A test cell as the student release has it: the hidden-test region removed."""
    return HIDDEN.sub("", source)


def test_lab02_unpacker_not_done_says_not_done_yet():
    from utils import gptq
    nb = nbformat.read(ROOT / "labs/02_models/02_models.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    setup = [c.source for c in code if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "setup_02"]
    graded = [c.source for c in code if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "student_dequantize_tests"]
    check = graded[0] if graded else next(c.source for c in code if "student_dequantize(" in c.source
                                          and "def student_dequantize" not in c.source)
    after = [c.source for c in code if c.get("id") == "ex02-apply"]   # the check on the real layer
    path = ROOT / "fixtures/tiny-qwen2-gsm/gptq-int4"
    layer = next(n for n in gptq.layer_names(path) if n.endswith("q_proj"))
    ns = {"torch": torch, "gptq": gptq, "t": gptq.read_layer(path, layer), "layer": layer}

    def student_dequantize(qweight, qzeros, scales, g_idx, bits=4):
        raise NotImplementedError

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for src in setup:
            exec(src, ns)
        ns["student_dequantize"] = student_dequantize
        exec(released(check), ns)
        for src in after:
            exec(src, ns)
    text = out.getvalue()
    assert "not done yet" in text, text
    assert "passed" not in text, text


SOLUTION = re.compile(r"### BEGIN SOLUTION.*?### END SOLUTION", re.S)
LABS = ["01_env", "02_models", "03_eval", "04_divergence", "05_kernels"]


def graded_cells(lab):
    nb = nbformat.read(ROOT / "labs" / lab / f"{lab}.ipynb", as_version=4)
    return [c for c in nb.cells if c.cell_type == "code" and "nbgrader" in c.metadata]


def run_graded(lab, blank: bool, hidden: bool) -> dict:
    """Run a lab's nbgrader cells alone, in order (as the grader does): {grade_id: (stdout, error or None)}."""
    ns, seen = {}, {}
    for c in graded_cells(lab):
        src = SOLUTION.sub("raise NotImplementedError()", c.source) if blank else c.source
        src = src if hidden else released(src)
        out, err = io.StringIO(), None
        try:
            with contextlib.redirect_stdout(out):
                exec(src, ns)
        except Exception as e:  # noqa: BLE001 - recorded and asserted on below
            err = e
        seen[c.metadata.nbgrader["grade_id"]] = (out.getvalue(), err)
    return seen


@pytest.mark.parametrize("lab", LABS)
def test_every_lab_has_three_exercises_with_points_and_hidden_tests(lab):
    cells = graded_cells(lab)
    tests = [c for c in cells if c.metadata.nbgrader["grade"]]
    solutions = [c for c in cells if c.metadata.nbgrader["solution"]]
    assert len(tests) >= 3 and len(solutions) == len(tests)
    for t in tests:
        assert t.metadata.nbgrader["points"] > 0 and t.metadata.nbgrader["locked"]
        assert "### BEGIN HIDDEN TESTS" in t.source and "exercises.self_check(" in t.source
    for s in solutions:
        assert "### BEGIN SOLUTION" in s.source
    ids = [c.metadata.nbgrader["grade_id"] for c in cells]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("lab", LABS)
def test_exercise_cells_run_alone_solutions_pass_blanks_say_not_done(lab):
    for gid, (out, err) in run_graded(lab, blank=False, hidden=True).items():
        assert err is None, f"{lab} {gid}: {err}"
        if gid.endswith("_tests"):
            assert "self-check passed" in out
    for gid, (out, err) in run_graded(lab, blank=True, hidden=False).items():   # the release, blank
        assert err is None, f"{lab} {gid}: {err}"
        if gid.endswith("_tests"):
            assert "not done yet" in out and "passed" not in out
    for gid, (out, err) in run_graded(lab, blank=True, hidden=True).items():    # graded, blank
        if gid.endswith("_tests"):
            assert err is not None and "not done yet" in str(err), f"{lab} {gid}: {err}"


@pytest.mark.parametrize("lab", LABS)
def test_every_exercise_check_refuses_the_reference_itself(lab):
    """In JupyterLab: a solution that hands the work to the reference fails its check, naming it, as grading does."""
    from ci.grade_key import answer_key
    from utils import exercises
    for ex, e in answer_key(lab, ROOT / "labs" / lab / f"{lab}.ipynb").items():
        ref = e.reference

        def cheat(*args, **kwargs):
            return ref(*args, **kwargs)
        with pytest.raises(exercises.ReferenceCalled, match=r"calls the course's reference utils\."):
            exercises.self_check(cheat, e.visible, reference=ref)
        assert e.hidden and e.reference_target(), ex


def test_how_you_are_graded_is_in_every_lab():
    for lab in LABS:
        nb = nbformat.read(ROOT / "labs" / lab / f"{lab}.ipynb", as_version=4)
        text = next(c.source for c in nb.cells if c.get("id") == f"ex{lab[:2]}-graded")
        for rule in (f"`{lab}.ipynb`", "helpers are kept", "deleting one changes nothing", "scores 0",
                     "stderr cost nothing", "30 s", "300 s", "Instructor's copy"):
            assert rule in text, (lab, rule)

"""The instructor's round (ci.grade) end to end: release, sandboxed runs, gradebook, CSV, summary.

One round over five students runs once for the module, in the strongest sandbox this machine has
(bubblewrap; `none`, asked for by name, where it is not installed): `complete` (every lab's source
notebook), `blank` (the student release of Lab 01, untouched), `wrong` (Lab 01 with one planted wrong
answer), `loop` (Lab 01 whose first exercise never returns) and `crash` (Lab 01 whose second exercise
kills the kernel when called).
"""
import csv
import html
import json
import os
import re
import subprocess
import sys
import time

import nbformat
import pytest

from bad_input_table import record
from ci import grade, sandbox
from tests.conftest import ROOT
from tests.grading_helpers import SANDBOX, assert_one_record

CELL_TIMEOUT = 20


def _edit_solution(nb, grade_id, new_source):
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    cell.source = new_source
    return nb


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """Every lab's student release, made by nbgrader generate_assignment (what students get)."""
    out = tmp_path_factory.mktemp("release") / "out"
    assert grade.main(["--release-only", "--out", str(out)]) == 0
    return out / "course" / "release"


@pytest.fixture(scope="module")
def graded(tmp_path_factory, release):
    base = tmp_path_factory.mktemp("round")
    subs = base / "submissions"
    labs = grade.graded_labs()
    for lab, nb_path in labs.items():
        (subs / "complete").mkdir(parents=True, exist_ok=True)
        (subs / "complete" / f"{lab}.ipynb").write_bytes(nb_path.read_bytes())
    (subs / "blank" / "01_env").mkdir(parents=True)                       # nbgrader's own layout
    (subs / "blank" / "01_env" / "01_env.ipynb").write_bytes((release / "01_env" / "01_env.ipynb").read_bytes())
    source = nbformat.read(labs["01_env"], as_version=4)
    wrong = _edit_solution(nbformat.from_dict(source), "gemm_intensity", re.sub(
        r"return 2 \* m", "return m", next(c.source for c in source.cells
                                           if c.metadata.get("nbgrader", {}).get("grade_id") == "gemm_intensity")))
    (subs / "wrong").mkdir()
    nbformat.write(wrong, subs / "wrong" / "01_env.ipynb")
    loop = _edit_solution(nbformat.from_dict(source), "ridge_point", "while True:\n    pass")
    (subs / "loop").mkdir()
    nbformat.write(loop, subs / "loop" / "01_env.ipynb")
    crash = _edit_solution(nbformat.from_dict(source), "gemm_intensity",
                           "import os\ndef gemm_intensity(m, n, k, bytes_per_element):\n    os._exit(1)")
    (subs / "crash").mkdir()
    nbformat.write(crash, subs / "crash" / "01_env.ipynb")
    out = base / "out"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "ci.grade", "--submissions", str(subs), "--out", str(out),
                        "--cell-timeout", str(CELL_TIMEOUT), "--sandbox", SANDBOX], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(out / "grades.csv") as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    return {"rows": rows, "summary": json.loads((out / "summary.json").read_text()), "out": out,
            "seconds": time.perf_counter() - t0, "stdout": r.stdout}


def _solution_lines():
    for lab, nb_path in grade.graded_labs().items():
        for c in nbformat.read(nb_path, as_version=4).cells:
            for region in re.findall(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", c.source, re.S):
                yield lab, [ln.strip() for ln in region.splitlines() if len(ln.strip()) > 12]


def test_release_has_no_solution_code_and_no_hidden_tests(release):
    for lab, lines in _solution_lines():
        nb = nbformat.read(release / lab / f"{lab}.ipynb", as_version=4)
        text = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text and "exercises.grade(" not in text
        for line in lines:
            assert line not in text, f"{lab}: solution line in the release: {line}"
        assert "### How you are graded" in text_md(nb) and "Instructor's copy" not in text_md(nb)
        stubs = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")]
        assert stubs and all("raise NotImplementedError()" in c.source for c in stubs)
        assert nb.cells[[c.cell_type for c in nb.cells].index("code")].metadata.get("tags") == ["parameters"]


def text_md(nb):
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def test_source_notebooks_say_they_are_the_instructors_copy():
    for nb_path in grade.graded_labs().values():
        assert "> **Instructor's copy:** this notebook holds the solutions" in text_md(nbformat.read(nb_path, as_version=4))


def test_source_notebooks_score_full_marks(graded):
    row, exs = graded["rows"]["complete"], graded["summary"]["exercises"]
    assert len(exs) >= 15
    for col, e in exs.items():
        assert float(row[col]) == e["points"], col
    assert float(row["total"]) == sum(e["points"] for e in exs.values())


def test_blank_release_scores_zero_on_every_exercise(graded):
    row = graded["rows"]["blank"]
    cols = [c for c in graded["summary"]["exercises"] if c.startswith("01_env/")]
    assert cols and all(float(row[c]) == 0.0 for c in cols)
    ridge = graded["summary"]["exercises"]["01_env/ridge_point"]
    assert ridge["pass_rate"] == 0.6 and ridge["submitted"] == 5         # `complete`, `wrong`, `crash` pass it
    assert "not done yet" in ridge["most_common_failure"][0] or "cut at" in ridge["most_common_failure"][0]
    assert graded["summary"]["exercises"]["02_models/unpack_zeros"]["submitted"] == 1   # only `complete` sent Lab 02


def test_planted_wrong_answer_loses_exactly_that_exercise(graded):
    row, exs = graded["rows"]["wrong"], graded["summary"]["exercises"]
    assert float(row["01_env/gemm_intensity"]) == 0.0
    assert float(row["01_env/ridge_point"]) == exs["01_env/ridge_point"]["points"]
    assert float(row["01_env/matmul_error_bound"]) == exs["01_env/matmul_error_bound"]["points"]
    failure = exs["01_env/gemm_intensity"]["most_common_failure"]
    assert "not done yet" in failure[0] or "a multiply-add is 2 FLOPs" in failure[0]
    assert assert_one_record(graded, "wrong")["gemm_intensity"] == 0.0


def test_endless_loop_is_cut_and_the_rest_still_scores(graded):
    row, exs = graded["rows"]["loop"], graded["summary"]["exercises"]
    assert float(row["01_env/ridge_point"]) == 0.0
    assert float(row["01_env/gemm_intensity"]) == exs["01_env/gemm_intensity"]["points"]
    loop = next(s for s in graded["summary"]["submissions"] if s["student"] == "loop")
    assert loop["status"].startswith("graded (") and "cut at 20 s" in loop["status"] and loop["seconds"] >= CELL_TIMEOUT
    nb = nbformat.read(graded["out"] / "course/autograded/loop/01_env/01_env.ipynb", as_version=4)
    cut = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "ridge_point")
    assert any(o.output_type == "error" and "Timeout" in o.ename for o in cut.outputs)
    assert "cut at the 20 s cell limit in its solution cell" in nb.cells[0].source
    assert_one_record(graded, "loop")


def test_a_kernel_that_dies_costs_only_that_exercise(graded):
    row, exs = graded["rows"]["crash"], graded["summary"]["exercises"]
    assert float(row["01_env/gemm_intensity"]) == 0.0
    assert float(row["01_env/ridge_point"]) == exs["01_env/ridge_point"]["points"]
    assert float(row["01_env/matmul_error_bound"]) == exs["01_env/matmul_error_bound"]["points"]
    crash = next(s for s in graded["summary"]["submissions"] if s["student"] == "crash")
    assert "kernel died" in crash["status"]
    assert assert_one_record(graded, "crash") == {"ridge_point": 1.0, "gemm_intensity": 0.0, "matmul_error_bound": 1.0}
    nb = nbformat.read(graded["out"] / "course/autograded/crash/01_env/01_env.ipynb", as_version=4)
    assert any("os._exit(1)" in c.source for c in nb.cells)           # the student's own code, handed back


def test_round_writes_csv_and_summary_and_grades_fast(graded):
    assert set(graded["rows"]) == {"complete", "blank", "wrong", "loop", "crash"}
    assert (graded["out"] / "summary.md").read_text().startswith("# Grading round: 5 students")
    assert graded["summary"]["sandbox"].startswith(SANDBOX)
    for s in graded["summary"]["submissions"]:
        if s["student"] not in ("loop", "crash"):
            assert s["status"] == "graded" and s["seconds"] < 60, s
    for lab in grade.graded_labs():
        assert_one_record(graded, "complete", lab)
    print(f"round of 9 submissions: {graded['seconds']:.0f} s", graded["summary"]["submissions"])


def test_bad_input_is_named(tmp_path, capsys):
    assert grade.main(["--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--submissions is required (or --release-only" in err
    record("grading round", "neither --submissions nor --release-only", err)
    with pytest.raises(grade.GradeError, match="--submissions .* is not a folder") as e:
        grade.grade_round(tmp_path / "nothing", tmp_path / "out", sandbox_mode="none")
    record("grading round", "--submissions is not a folder", str(e.value))
    (tmp_path / "subs").mkdir(parents=True)
    with pytest.raises(grade.GradeError, match="no submissions in") as e:
        grade.grade_round(tmp_path / "subs", tmp_path / "out", sandbox_mode="none")
    record("grading round", "an empty submissions folder", str(e.value))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("earlier round")
    with pytest.raises(grade.GradeError, match="exists and is not empty") as e:
        grade.grade_round(tmp_path / "subs", tmp_path / "full", sandbox_mode="none")
    record("grading round", "--out holds an earlier round", str(e.value))
    with pytest.raises(grade.GradeError, match="not a lab with exercises") as e:
        grade.grade_round(tmp_path / "subs", tmp_path / "out2", labs=["09_nothing"], sandbox_mode="none")
    record("grading round", "--labs names no lab with exercises", str(e.value))
    with pytest.raises(sandbox.SandboxError, match="--sandbox 'docker': choose one of auto, bwrap, none") as e:
        sandbox.choose("docker")
    record("grading round", "--sandbox names no sandbox this grader runs", str(e.value))


def test_auto_never_falls_back_to_no_sandbox(monkeypatch):
    """Without bubblewrap, `auto` refuses and says how to go on; only `none` by name runs unsandboxed."""
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with pytest.raises(sandbox.SandboxError, match="apt-get install -y bubblewrap.*--sandbox none") as e:
        sandbox.choose("auto")
    record("grading round", "--sandbox auto where bubblewrap is missing", str(e.value))
    assert sandbox.choose("none") == "none"


def test_blank_release_of_lab01_runs_end_to_end_on_the_references(release, tmp_path):
    """The student release executes with every exercise blank: the lab goes on with utils' references.
    Lab 01 stands for the five (the cheapest to run whole); every lab's exercise cells are run blank,
    alone, in tests/test_lab_exercises.py."""
    import papermill

    from ci.run import kernel_manager_class

    out, km = tmp_path / "01_env.ipynb", kernel_manager_class()
    papermill.execute_notebook(str(release / "01_env" / "01_env.ipynb"), str(out), cwd=str(ROOT),
                               **({"kernel_manager_class": km} if km else {}),
                               parameters={"device": "cpu", "run_dir": str(tmp_path / "run"), "matmul_n": 128,
                                           "copy_mib": 16, "repeats": 2, "check_n": 128}, progress_bar=False)
    nb = nbformat.read(out, as_version=4)
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert text.count("not done yet") == 3 and "self-check passed" not in text
    apply = next(c for c in nb.cells if c.get("id") == "ex01-apply")
    assert "ridge FLOP/byte" in apply.outputs[0]["data"]["text/plain"]
    assert (tmp_path / "run" / "01_env" / "results.json").is_file()


def test_nbgrader_feedback_reads_the_same_scores(graded):
    """nbgrader's own hand-back (generate_feedback) over the round: the gradebook's scores on the student's code."""
    course = graded["out"] / "course"
    r = subprocess.run([sys.executable, "-m", "nbgrader", "generate_feedback", "01_env", "--student", "wrong"],
                       cwd=course, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])))
    assert r.returncode == 0, r.stderr[-2000:]
    page = re.sub(r"<style.*?</style>|<script.*?</script>", "", (course / "feedback/wrong/01_env/01_env.html").read_text(), flags=re.S)
    text = re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))
    assert "01_env (Score: 2.0 / 3.0)" in text
    assert "return m * n * k" in text                       # the student's own (wrong) code

"""Submissions that try to win without doing the exercise, and folders full of bad files: none gains anything.

Two rounds over Lab 01, each run once for the module:
- `named_none`, on every machine (CI's may lack bubblewrap): `--sandbox none`, asked for by name. What
  `none` still guarantees: the points are computed outside the student's kernel (a solution that calls
  the reference, or rebinds the checks, scores 0 and says why), the course's rules (helpers kept,
  stderr free, a deleted check cell costs nothing), one record after a crash and a cut cell, a row for
  every bad file, and a summary that says it ran unsandboxed.
- `in_bwrap`, where bubblewrap is installed: the same two cheats, plus submissions that read the source
  notebook, the gradebook and another student's notebook, write outside their folder, edit the code on
  their import path and change another student's score.
"""
import hashlib
import json

import nbformat
import pytest

from bad_input_table import record
from ci import grade, grade_report, sandbox
from tests.conftest import ROOT
from tests.grading_helpers import (add_helper, assert_one_record, handback, lab01, outputs_text, run_round, save,
                                   set_solution)

CELL = "15"
RIDGE = "def ridge_point(peak_tflops, bandwidth_gbps):\n    return {body}\n"
RIGHT_RIDGE = "peak_tflops * 1e12 / (bandwidth_gbps * 1e9)"


def imports_reference():
    nb = lab01()
    set_solution(nb, "ridge_point", RIDGE.format(body="formulas.ridge_point(peak_tflops, bandwidth_gbps)"))
    add_helper(nb, "from utils.formulas import gemm_intensity as _gi   # an alias under another name")
    set_solution(nb, "gemm_intensity", "def gemm_intensity(m, n, k, bytes_per_element, _f=_gi):\n"
                                       "    return _f(m, n, k, bytes_per_element)\n")
    add_helper(nb, "import inspect\nimport utils.metrics\n"
                   "exec(inspect.getsource(utils.metrics.matmul_error_bound).replace('def matmul_error_bound', "
                   "'def _copied'), globals())   # a copy of the reference's source")
    set_solution(nb, "matmul_error_bound", "def matmul_error_bound(dtype, k, safety=4.0):\n"
                                           "    return _copied(dtype, k, safety)\n")
    return nb


def rebinds_checks():
    nb = lab01()
    add_helper(nb, "import utils.exercises as E\n"
                   "E.grade = lambda *a, **k: None\n"
                   "E.self_check = lambda fn, cases, reference=None: fn\n"
                   "E.run_cases = lambda fn, cases: len(cases)\n"
                   "E.mismatch = lambda *a, **k: None\n"
                   "exercises.self_check = E.self_check")
    set_solution(nb, "ridge_point", "exercises.grade = lambda *a, **k: None   # in a solution cell too\n"
                                    "exercises.self_check = lambda fn, cases, reference=None: fn\n"
                                    + RIDGE.format(body="0.0"))
    set_solution(nb, "gemm_intensity", "def gemm_intensity(m, n, k, bytes_per_element):\n    return 1.0\n")
    set_solution(nb, "matmul_error_bound", "def matmul_error_bound(dtype, k, safety=4.0):\n    return 0.0\n")
    return nb


def rules():
    """A helper cell, output on stderr, a deleted check cell: as the release's rules say, all free."""
    nb = lab01()
    add_helper(nb, "def _per_second(tera, giga):\n    return tera * 1e12, giga * 1e9\n", after="ridge_point")
    set_solution(nb, "ridge_point", "def ridge_point(peak_tflops, bandwidth_gbps):\n"
                                    "    flops, bytes_ = _per_second(peak_tflops, bandwidth_gbps)\n"
                                    "    return flops / bytes_\n")
    src = next(c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "gemm_intensity")
    set_solution(nb, "gemm_intensity", "import sys\nprint('debugging', file=sys.stderr)\n"
                 + src.replace("    ### BEGIN SOLUTION", "    print('called', m, file=sys.stderr)\n    ### BEGIN SOLUTION"))
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") != "matmul_error_bound_tests"]
    return nb


def crash_and_loop():
    nb = lab01()
    set_solution(nb, "ridge_point", "def ridge_point(peak_tflops, bandwidth_gbps):\n"
                                    "    while peak_tflops == 1.0:   # a hidden case never returns\n        pass\n"
                                    f"    return {RIGHT_RIDGE}\n")
    set_solution(nb, "gemm_intensity", "import os\nos._exit(1)\n")
    return nb


@pytest.fixture(scope="module")
def named_none(tmp_path_factory):
    base = tmp_path_factory.mktemp("none")
    subs = base / "subs"
    save(imports_reference(), subs, "imports_ref")
    save(rebinds_checks(), subs, "rebinds_checks")
    save(rules(), subs, "rules")
    save(crash_and_loop(), subs, "crash_loop")
    save(lab01(), subs, "--foo", "01_env (1).ipynb")              # a name nbgrader misreads; a misnamed notebook
    (subs / "-x").mkdir()                                           # a name nbgrader misreads; an empty folder
    (subs / "textfile").mkdir()
    (subs / "textfile" / "01_env.ipynb").write_text("my answers: 100, 25, 0.0004")
    (subs / "textfile" / "notes.txt").write_text("hello")
    save(nbformat.read(grade.graded_labs()["02_models"], as_version=4), subs, "wronglab", "01_env.ipynb")
    (subs / "README.txt").write_text("collected on Monday")
    return run_round(subs, base / "out", "--labs", "01_env", "--sandbox", "none", "--cell-timeout", CELL)


def test_none_named_is_said_at_the_top(named_none):
    assert named_none["summary"]["sandbox"].startswith("none (asked for by name)")
    md = (named_none["out"] / "summary.md").read_text().splitlines()
    assert md[2].startswith("**Sandbox: none (asked for by name)")


def _full():
    return {ex: 1.0 for ex in ("ridge_point", "gemm_intensity", "matmul_error_bound")}


def check_reference_cheat(graded):
    assert assert_one_record(graded, "imports_ref") == {ex: 0.0 for ex in _full()}
    text = handback(graded["out"], "imports_ref").cells[0].source
    for ref in ("utils.formulas.ridge_point", "utils.formulas.gemm_intensity", "utils.metrics.matmul_error_bound"):
        assert f"calls the course's reference {ref}" in text, text


def check_rebind_cheat(graded):
    assert assert_one_record(graded, "rebinds_checks") == {ex: 0.0 for ex in _full()}
    text = handback(graded["out"], "rebinds_checks").cells[0].source
    assert "wrong on case 100 TFLOP/s over 1000 GB/s: got 0.0, expected 100.0" in text, text


def test_a_solution_calling_the_reference_scores_zero_and_says_why(named_none):
    check_reference_cheat(named_none)


def test_rebinding_the_checks_changes_nothing(named_none):
    check_rebind_cheat(named_none)


def test_helpers_kept_stderr_free_deleted_check_cell_costs_nothing(named_none):
    assert assert_one_record(named_none, "rules") == _full()
    assert "matmul_error_bound: check cell deleted; the course's copy ran (no points lost)" in named_none["rows"]["rules"]["notes"]


def test_crash_and_cut_cost_only_their_exercise_and_every_record_agrees(named_none):
    assert assert_one_record(named_none, "crash_loop") == {"ridge_point": 0.0, "gemm_intensity": 0.0,
                                                           "matmul_error_bound": 1.0}
    first = handback(named_none["out"], "crash_loop").cells[0].source
    assert f"cut at the {CELL} s cell limit while its function ran on the cases" in first
    assert "the kernel died (a crash such as os._exit) in its solution cell" in first
    sub = next(s for s in named_none["summary"]["submissions"] if s["student"] == "crash_loop")
    assert "kernel died" in sub["status"] and "cut" in sub["status"]
    back = handback(named_none["out"], "crash_loop")
    assert any("os._exit(1)" in c.source for c in back.cells)            # the student's own code, handed back
    assert "raise NotImplementedError()" not in "\n".join(c.source for c in back.cells)


def test_every_entry_gets_a_row_with_its_reason(named_none):
    rows = named_none["rows"]
    assert set(rows) == {"imports_ref", "rebinds_checks", "rules", "crash_loop", "--foo", "-x", "textfile",
                         "wronglab", "README.txt"}
    assert assert_one_record(named_none, "--foo") == _full()
    assert "01_env (1).ipynb: holds Lab 01_env's exercises, graded as 01_env" in rows["--foo"]["notes"]
    for who in ("--foo", "-x"):
        assert "would be read as an option by nbgrader's command line" in rows[who]["notes"]
    cases = {"textfile": "01_env.ipynb: not a notebook (cannot be read as one",
             "-x": "empty folder: nothing submitted",
             "wronglab": "01_env.ipynb: Lab 02_models, not graded in this round",
             "README.txt": "a file, not a student's folder"}
    for who, reason in cases.items():
        assert reason in rows[who]["notes"], (who, rows[who])
        assert rows[who]["01_env/ridge_point"] == "" and rows[who]["total"] in ("", "0", "0.0")
        record("grading round", f"submissions entry {who!r}", rows[who]["notes"])
    assert "notes.txt: not a notebook, not graded" in rows["textfile"]["notes"]
    assert "a file, not a student's folder" in json.dumps(named_none["summary"]["rows_without_a_grade"])


def test_pass_rates_count_only_submitted_labs(named_none):
    ridge = named_none["summary"]["exercises"]["01_env/ridge_point"]
    assert ridge["submitted"] == 5                     # the five folders that held a Lab 01 notebook
    assert ridge["pass_rate"] == pytest.approx(2 / 5)  # rules, --foo
    matmul = named_none["summary"]["exercises"]["01_env/matmul_error_bound"]
    assert matmul["most_common_failure"][0]


# --- in bubblewrap -----------------------------------------------------------------------------------------

def _probe(paths: dict) -> str:
    """A helper cell that tries each path and prints what it could do: READ/WROTE or BLOCKED."""
    return ("import os, sqlite3\n"
            f"PATHS = {paths!r}\n"
            "def _try(label, fn):\n"
            "    try:\n        fn(); print('GOT', label)\n        return True\n"
            "    except Exception as e:\n        print('BLOCKED', label, type(e).__name__)\n        return False\n")


@pytest.fixture(scope="module")
def in_bwrap(tmp_path_factory):
    if not sandbox.bwrap_path():
        pytest.skip("bubblewrap is not installed here (apt-get install -y bubblewrap); the named-none round ran")
    base = tmp_path_factory.mktemp("bwrap")
    subs, out = base / "subs", base / "out"
    course = out / "course"
    canary = f"_canary_{base.name}.py"
    paths = {"source": str(ROOT / "labs/01_env/01_env.ipynb"), "course_source": str(course / "source/01_env/01_env.ipynb"),
             "gradebook": str(course / "gradebook.db"), "other": str(subs / "aa_honest" / "01_env.ipynb"),
             "outside": str(base / "outside.txt"), "repo_utils": str(ROOT / "utils" / canary),
             "csv": str(out / "grades.csv")}
    save(lab01(), subs, "aa_honest")
    save(imports_reference(), subs, "imports_ref")
    save(rebinds_checks(), subs, "rebinds_checks")
    # every file it can read outside the system's and Python's own trees (pruned from the walk: within the cell
    # limit on a loaded machine too)
    nb = add_helper(lab01(), _probe(paths) + "import sys\nskip = ('/proc', '/sys', '/usr', '/dev', '/etc', sys.prefix, sys.base_prefix)\n"
                    "found = []\nfor r, ds, fs in os.walk('/'):\n"
                    "    ds[:] = [d for d in ds if not os.path.join(r, d).startswith(skip)]\n"
                    "    found += [p for p in [os.path.join(r, f) for f in fs] if not r.startswith(skip)\n"
                    "              and os.path.getsize(p) < 10**6 and ('20' + '39.0') in open(p, errors='ignore').read()]\n"
                    "print('HIDDEN INPUTS FOUND' if found else 'no hidden inputs anywhere', found)\n"
                    "print('INTERFACES', sorted(ln.split(':')[0].strip() for ln in open('/proc/net/dev').readlines()[2:]))")
    set_solution(nb, "ridge_point", RIDGE.format(body="open(PATHS['source']).read().count('SOLUTION') and " + RIGHT_RIDGE))
    set_solution(nb, "gemm_intensity", "def gemm_intensity(m, n, k, bytes_per_element):\n"
                 "    sqlite3.connect(f\"file:{PATHS['gradebook']}?mode=ro\", uri=True).execute('select * from grade').fetchall()\n"
                 "    return 2 * m * n * k / (bytes_per_element * (m * k + k * n + m * n))\n")
    set_solution(nb, "matmul_error_bound", "def matmul_error_bound(dtype, k, safety=4.0):\n"
                 "    open(PATHS['other']).read()\n"
                 "    return safety * (torch.finfo(dtype).eps / 2 + math.sqrt(k) * torch.finfo(torch.float32).eps / 2)\n")
    save(nb, subs, "reads_secrets")
    nb = add_helper(lab01(), _probe(paths) + "import utils.formulas\n"
                    "for label in ('outside', 'repo_utils'):\n"
                    "    _try(label, lambda: open(PATHS[label], 'w').write('ridge_point = lambda *a: 0.0\\n'))\n"
                    "_try('import path', lambda: open(utils.formulas.__file__, 'a').write('\\nridge_point = lambda *a: 0.0\\n'))\n"
                    "_try('new module', lambda: open(os.path.join(os.path.dirname(utils.formulas.__file__), 'x.py'), 'w').write('1'))\n"
                    "_try('gradebook', lambda: sqlite3.connect(PATHS['gradebook']).execute('update grade set auto_score = 0'))\n"
                    "_try('other', lambda: open(PATHS['other'], 'w').write('{}'))\n"
                    "_try('csv', lambda: open(PATHS['csv'], 'w').write('aa_honest,0\\n'))")
    save(nb, subs, "writes_outside")         # and edits its import path, and changes another student's score
    save(lab01(), subs, "zz_honest")
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in [subs / "aa_honest/01_env.ipynb", *sorted((ROOT / "utils").glob("*.py"))]}
    try:
        graded = run_round(subs, out, "--labs", "01_env", "--sandbox", "bwrap", "--cell-timeout", "20")
    finally:
        leaked = [p for p in (ROOT / "utils" / canary, base / "outside.txt") if p.exists()]
        for p in leaked:
            p.unlink()
    graded.update(before=before, leaked=leaked)
    return graded


def test_bwrap_cheats_on_the_checks_gain_nothing(in_bwrap):
    assert in_bwrap["summary"]["sandbox"].startswith("bwrap")
    check_reference_cheat(in_bwrap)
    check_rebind_cheat(in_bwrap)


def test_bwrap_a_submission_cannot_read_the_answers_the_gradebook_or_others(in_bwrap):
    assert assert_one_record(in_bwrap, "reads_secrets") == {ex: 0.0 for ex in _full()}
    text = outputs_text(handback(in_bwrap["out"], "reads_secrets"))
    assert "no hidden inputs anywhere []" in text and "HIDDEN INPUTS FOUND" not in text
    assert "INTERFACES ['lo']" in text                                  # no network: loopback only
    first = handback(in_bwrap["out"], "reads_secrets").cells[0].source
    assert first.count("FileNotFoundError") + first.count("OperationalError") >= 3, first


def test_bwrap_a_submission_cannot_write_outside_or_edit_the_code(in_bwrap):
    text = outputs_text(handback(in_bwrap["out"], "writes_outside"))
    assert "GOT" not in text and text.count("BLOCKED") == 7, text
    assert in_bwrap["leaked"] == []
    assert assert_one_record(in_bwrap, "writes_outside") == _full()
    assert assert_one_record(in_bwrap, "zz_honest") == _full()          # graded after it: untouched
    for p, digest in in_bwrap["before"].items():
        assert hashlib.sha256(p.read_bytes()).hexdigest() == digest, p


def test_bwrap_a_submission_cannot_change_another_students_score(in_bwrap):
    text = outputs_text(handback(in_bwrap["out"], "writes_outside"))
    assert "BLOCKED gradebook" in text and "BLOCKED other" in text and "BLOCKED csv" in text, text
    assert assert_one_record(in_bwrap, "aa_honest") == _full()
    assert grade_report.read_gradebook(in_bwrap["out"] / "course", "01_env", "aa_honest") == _full()
    assert float(in_bwrap["rows"]["aa_honest"]["total"]) == 3.0

"""Submissions that reach past the sandbox through what the grader reads back, in bubblewrap.

One round over Lab 01, run once for the module: honest solutions each, plus one trick per student:
- `links_executed` makes its executed notebook a link to another lab's source notebook (through the
  grader's own /proc/self/cwd) and kills the driver so the link stays: the grader must not follow it.
- `links_answers` makes an answers file a link to a file of the grader's machine.
- `reads_stdin` reads the hidden cases from the driver's stdin in its first cell and prints them.
- `shows_cases` prints each hidden call into an earlier cell's output (a display id) while graded.
- `floods_outputs` displays 40 MB in one cell: the hand-back stays readable.
- `remounts` tries to make its read-only system writable and looks at the kernel's settings: when the
  grader runs as root, the sandbox's root must hold no capability and see /proc/sys read-only.
- `pastes_ref` pastes the reference's source (students have utils/ at home) as its solution.
`zz_honest`, graded last, scores full marks: the round goes on.
"""
import inspect
import json

import pytest

from ci import sandbox
from utils import formulas
from tests.grading_helpers import (add_helper, assert_one_record, handback, lab01, outputs_text, run_round, save,
                                   set_solution)

HIDDEN_INPUT = "2039"        # a hidden case of ridge_point: (312.0, 2039.0); no visible case holds it
OTHER_LAB = "unpack_zeros"   # an exercise of Lab 02: never in a Lab 01 hand-back

WRAP = ("import os, utils.exercises as _E\n"
        "_real = _E.harvest\n"
        "def _harvest(name, ns, inputs, out):\n"
        "    _real(name, ns, inputs, out)\n"
        "{after}"
        "_E.harvest = _harvest\n")


def _full():
    return {ex: 1.0 for ex in ("ridge_point", "gemm_intensity", "matmul_error_bound")}


@pytest.fixture(scope="module")
def escapes(tmp_path_factory):
    if not sandbox.bwrap_path():
        pytest.skip("bubblewrap is not installed here (apt-get install -y bubblewrap)")
    base = tmp_path_factory.mktemp("escapes")
    subs = base / "subs"
    secret = base / "secret.json"
    secret.write_text(json.dumps({"answers": {"missing": "SECRET-OF-THE-GRADER"}}))
    save(add_helper(lab01(), WRAP.format(after=(
        "    if name == 'matmul_error_bound':\n"
        "        os.unlink('/submission/out/executed.ipynb')\n"
        "        os.symlink('/proc/self/cwd/labs/02_models/02_models.ipynb', '/submission/out/executed.ipynb')\n"
        "        os.kill(os.getppid(), 9)\n"))), subs, "links_executed")
    save(add_helper(lab01(), WRAP.format(after=(
        "    if name == 'ridge_point':\n"
        "        os.unlink(out)\n"
        f"        os.symlink({str(secret)!r}, out)\n"))), subs, "links_answers")
    save(add_helper(lab01(), "import os\nfound = b''\nfor pid in (os.getppid(), 1):\n"
                             "    try:\n"
                             "        fd = os.open(f'/proc/{pid}/fd/0', os.O_RDONLY | os.O_NONBLOCK)\n"
                             "        got = os.read(fd, 1 << 20)\n"
                             "        os.close(fd)\n"
                             "        found += got\n"
                             "        if got:                                 # put back, for the driver\n"
                             "            w = os.open(f'/proc/{pid}/fd/0', os.O_WRONLY)\n"
                             "            os.write(w, got)\n            os.close(w)\n"
                             "    except OSError as e:\n        print('blocked', pid, type(e).__name__)\n"
                             "print('STDIN', found.decode())"), subs, "reads_stdin")
    save(set_solution(lab01(), "ridge_point",
                 "from IPython.display import display, update_display\n"
                 "display('no call yet', display_id='calls')\n"
                 "def ridge_point(peak_tflops, bandwidth_gbps):\n"
                 "    update_display(repr((peak_tflops, bandwidth_gbps)), display_id='calls')\n"
                 "    return peak_tflops * 1e12 / (bandwidth_gbps * 1e9)\n"), subs, "shows_cases")
    save(add_helper(lab01(), "from IPython.display import display\n"
                             "for i in range(200):\n"
                             "    display({'text/plain': str(i) + 'x' * 199_000}, raw=True)"), subs, "floods_outputs")
    save(add_helper(lab01(), "import os, subprocess\n"
                             "print([ln.strip() for ln in open('/proc/self/status') if ln.startswith('CapEff')])\n"
                             "r = subprocess.run(['mount', '-o', 'remount,rw,bind', '/usr'], capture_output=True)\n"
                             "print('REMOUNT', 'done' if r.returncode == 0 else 'refused')\n"
                             "print('SYSCTL', 'writable' if os.access('/proc/sys/kernel/core_pattern', os.W_OK) else 'read-only')"),
         subs, "remounts")
    save(set_solution(lab01(), "ridge_point", inspect.getsource(formulas.ridge_point)), subs, "pastes_ref")
    save(lab01(), subs, "zz_honest")
    graded = run_round(subs, base / "out", "--labs", "01_env", "--sandbox", "bwrap", "--cell-timeout", "30")
    graded["secret"] = secret
    return graded


def _text(graded, student):
    """What a reader of the hand-back sees: every cell's source and outputs (not the cells' execution
    timestamps, whose microseconds can hold any four digits)."""
    return json.dumps([(c.source, c.get("outputs", [])) for c in handback(graded["out"], student).cells])


def test_a_link_as_executed_notebook_is_not_followed(escapes):
    text = _text(escapes, "links_executed")
    assert OTHER_LAB not in text and "BEGIN HIDDEN TESTS" not in text
    first = handback(escapes["out"], "links_executed").cells[0].source
    assert "its executed notebook is a link" in first, first
    assert assert_one_record(escapes, "links_executed") == _full()   # its answers were its own


def test_a_link_as_answers_is_not_followed(escapes):
    pts = assert_one_record(escapes, "links_answers")
    assert pts == dict(_full(), ridge_point=0.0)
    first = handback(escapes["out"], "links_answers").cells[0].source
    assert "SECRET-OF-THE-GRADER" not in first and "its answers file is a link, not followed" in first, first


def test_the_hidden_cases_cannot_be_read_before_the_cells_are_done(escapes):
    text = _text(escapes, "reads_stdin")
    assert HIDDEN_INPUT not in text, "hidden inputs in the hand-back"
    assert assert_one_record(escapes, "reads_stdin") == _full()


def test_the_hidden_cases_do_not_reach_the_hand_back(escapes):
    text = _text(escapes, "shows_cases")
    assert "(100.0, 1000.0)" in text or "(989.0, 3350.0)" in text      # the visible calls may show
    assert HIDDEN_INPUT not in text and "936.0" not in text
    assert assert_one_record(escapes, "shows_cases") == _full()


def test_a_flood_of_outputs_is_cut_in_the_hand_back(escapes):
    path = escapes["out"] / "course/autograded/floods_outputs/01_env/01_env.ipynb"
    assert path.stat().st_size < 4 * 2**20, path.stat().st_size
    assert "left out by the grader" in _text(escapes, "floods_outputs")
    assert assert_one_record(escapes, "floods_outputs") == _full()


def test_no_capability_and_the_kernels_settings_read_only(escapes):
    text = outputs_text(handback(escapes["out"], "remounts"))
    assert "CapEff:\\t0000000000000000" in text, text
    assert "REMOUNT refused" in text and "SYSCTL read-only" in text, text


def test_a_pasted_reference_scores_zero(escapes):
    assert assert_one_record(escapes, "pastes_ref") == dict(_full(), ridge_point=0.0)
    first = handback(escapes["out"], "pastes_ref").cells[0].source
    assert "calls the course's reference utils.formulas.ridge_point" in first, first


def test_the_round_goes_on(escapes):
    assert assert_one_record(escapes, "zz_honest") == _full()
    assert escapes["secret"].read_text().count("SECRET") == 1

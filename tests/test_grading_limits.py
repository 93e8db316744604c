"""What a sandbox hands back, forged by the student: the grader's memory, its files and its reasons stay safe.

No round here: a fake driver stands for a submission that took over its sandbox (monkeypatched harvest,
a killed driver), and the answers files are written as such a submission could write them.
"""
import json
import os
import subprocess
import sys

import pytest

from ci import grade, grade_key, sandbox
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def key01():
    return grade_key.answer_key("01_env", grade.graded_labs()["01_env"])


def test_a_flood_on_stdout_does_not_fill_the_graders_memory(tmp_path):
    """The student's kernel holds the driver's stdout: 400 MB there must not become 400 MB in the grader."""
    code, work = tmp_path / "code", tmp_path / "work"
    code.mkdir()
    work.mkdir()
    (code / "grade_driver.py").write_text("import sys\nsys.stdin.readline()\nchunk = b'x' * 2**20 + b'\\n'\n"
                                          "for _ in range(400):\n    sys.stdout.buffer.write(chunk)\n"
                                          "sys.stdout.buffer.write(b'last line')\n")
    probe = ("from pathlib import Path\nfrom ci import sandbox\n"
             f"o = sandbox.run('none', Path({str(work)!r}), Path({str(code)!r}), '{{}}', 120)\n"
             "peak = next(ln.split()[1] for ln in open('/proc/self/status') if ln.startswith('VmHWM'))   # KiB\n"
             "print(o.returncode, len(o.log), o.log.endswith('last line'), peak)")
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr
    rc, size, last, maxrss_kib = r.stdout.split()
    assert rc == "0" and int(size) <= sandbox.LOG_TAIL and last == "True"
    assert int(maxrss_kib) < 150 * 1024, f"the grader grew to {int(maxrss_kib) >> 10} MiB"


def test_read_back_takes_only_plain_files_of_the_folder(tmp_path):
    work, outside = tmp_path / "work", tmp_path / "outside"
    (work / "out").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.json").write_text("grader's own")
    (work / "out" / "plain.json").write_text("mine")
    (work / "out" / "link.json").symlink_to(outside / "secret.json")
    (work / "dirlink").symlink_to(outside)
    os.mkfifo(work / "out" / "fifo.json")                       # would block a reader forever
    (work / "out" / "big.json").write_bytes(b"x" * 2048)
    assert sandbox.read_back(work, "out/plain.json", 100) == (b"mine", "")
    assert sandbox.read_back(work, "out/link.json", 100) == (None, "is a link, not followed")
    assert sandbox.read_back(work, "dirlink/secret.json", 100) == (None, "is a link, not followed")
    assert sandbox.read_back(work, "out/fifo.json", 100) == (None, "is not a plain file")
    assert sandbox.read_back(work, "out/big.json", 1024)[1].startswith("is larger than")
    assert sandbox.read_back(work, "out/none.json", 100) == (None, "is missing")


def _answers(path, answers):
    path.write_text(json.dumps({"answers": answers}))
    return path


FORGED = {
    "a negative shape": {"value": {"__tensor__": ["float32", [-1, -2], "AAAAAAAAAAA="]}},
    "an empty negative shape": {"value": {"__tensor__": ["float32", [-1, 0], ""]}},
    "a shape past int64": {"value": {"__tensor__": ["float32", [2**70, 0], ""]}},
    "a dtype that is not one": {"value": {"__dtype__": ["float32"]}},
    "a huge error name": {"error": "E" * 10**6, "message": "m"},
}


@pytest.mark.parametrize("what", list(FORGED))
def test_forged_answers_score_zero_with_a_reason_never_a_grader_error(tmp_path, key01, what):
    e = key01["ridge_point"]
    path = _answers(tmp_path / "a.json", [FORGED[what]] * (len(e.visible) + len(e.hidden)))
    pts, why = grade_key.score(e, path)
    assert pts == 0.0 and why and len(why) <= grade_key.MAX_WHY, (what, why[:300])


def test_a_reason_is_one_short_line(tmp_path, key01):
    """What the student returned goes into summary.md's table and the hand-back: no newline, no megabytes."""
    e = key01["ridge_point"]
    n = len(e.visible) + len(e.hidden)
    fake_row = "\n| mallory | 01_env | 3 / 3 | graded | 1 |\n"
    for answers in ([{"value": [1.0] * 10**6}] * n, [{"error": "ValueError", "message": fake_row}] * n,
                    [{"value": fake_row}] * n):
        pts, why = grade_key.score(e, _answers(tmp_path / "a.json", answers))
        assert pts == 0.0 and "\n" not in why and len(why) <= grade_key.MAX_WHY, why[:300]

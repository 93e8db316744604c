"""What a sandbox hands back, forged by the student: the grader's memory, its files and its reasons stay safe.

No round here: a fake driver stands for a submission that took over its sandbox (monkeypatched harvest,
a killed driver), and the answers files are written as such a submission could write them.
"""
import json
import os
import subprocess
import sys
import time

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


# --- a submission's share of the machine, in bubblewrap: bounded stand-ins for a fork bomb, a memory blow-up
# and a full disk (the real ones would hurt the machine that runs this test) ---------------------------------

ATTACKS = {
    "forks": ("import os, time\nfor i in range(100):\n    if os.fork() == 0:\n        time.sleep(20)\n        os._exit(0)\n"
              "print('FORKED 100', flush=True)\ntime.sleep(20)\n"),
    "maps": ("import mmap\ntry:\n    m = mmap.mmap(-1, 6 << 30, flags=mmap.MAP_PRIVATE)   # private: its own memory\n"
             "    print('MAPPED 6 GiB')\nexcept (OSError, MemoryError) as e:\n    print('REFUSED', type(e).__name__)\n"),
    "touches_shared": ("import mmap, time\nm = mmap.mmap(-1, 512 << 20)   # shared: outside RLIMIT_DATA\n"
                       "for i in range(0, 512 << 20, 4096):\n    m[i] = 1\nprint('TOUCHED 512 MiB', flush=True)\n"
                       "time.sleep(20)\n"),
    "fills_folder": ("import os, time\nchunk = b'x' * (8 << 20)\nfor i in range(40):\n"
                     "    with open(f'/submission/f{i}', 'wb') as f:\n        f.write(chunk)\n        os.fsync(f.fileno())\n"
                     "print('WROTE 320 MiB', flush=True)\ntime.sleep(20)\n"),
    "fills_memory": ("for where in ('/tmp', '/dev/shm', '/dev'):\n    try:\n        for i in range(5):   # 320 MiB of RAM\n"
                     "            with open(f'{where}/big{i}', 'wb') as f:\n                f.write(b'x' * (64 << 20))\n"
                     "        print('FILLED', where)\n    except OSError as e:\n        print('REFUSED', where, e.strerror)\n"),
}


@pytest.mark.parametrize("what", list(ATTACKS))
def test_a_submission_cannot_take_the_machine(tmp_path, monkeypatch, what):
    if not sandbox.bwrap_path():
        pytest.skip("bubblewrap is not installed here")
    monkeypatch.setattr(sandbox, "MAX_PROCS", 32)
    monkeypatch.setattr(sandbox, "MAX_DISK", 100 * 2**20)
    monkeypatch.setattr(sandbox, "TMPFS", 64 * 2**20)
    monkeypatch.setattr(sandbox, "MAX_RESIDENT", 256 * 2**20)
    code, work = tmp_path / "code", tmp_path / "work"
    code.mkdir()
    work.mkdir()
    (code / "grade_driver.py").write_text(ATTACKS[what])
    t0 = time.perf_counter()
    o = sandbox.run("bwrap", work, code, "{}", 60)
    assert not o.cut and time.perf_counter() - t0 < 15, o.log      # stopped, not left to sleep its 20 s
    if what == "forks":
        assert "more than 32 processes at once" in o.limit, (o.log, o.limit)
    elif what == "maps":
        assert "REFUSED" in o.log, o.log
    elif what == "touches_shared":
        assert "more than 0.25 GiB of memory in use" in o.limit, (o.log, o.limit)
    elif what == "fills_folder":
        assert "more than 100 MiB written to its folder" in o.limit, (o.log, o.limit)
    else:
        assert "FILLED" not in o.log and o.log.count("REFUSED") == 3, o.log


@pytest.mark.parametrize("hidden", [{"value": "(312.0, 2039.0)"}, {"value": ["(312.0, 2039.0)"]},
                                    {"error": "ValueError", "message": "(312.0, 2039.0)"}])
def test_a_reason_on_a_hidden_case_echoes_nothing_of_the_students(tmp_path, key01, hidden):
    """What a function returns or raises on a hidden case may be the case itself: the hand-back shows the reason."""
    e = key01["ridge_point"]
    answers = [{"value": c.expected} for c in e.visible] + [hidden] * len(e.hidden)
    pts, why = grade_key.score(e, _answers(tmp_path / "a.json", answers))
    assert pts == 0.0 and "hidden case 1 of" in why and "2039" not in why, why


def test_a_status_quotes_nothing_printed_after_the_cases_went_in():
    """A student's kernel can print the hidden calls on the driver's stdout, then kill the driver: the
    status (hand-back, grades.csv) would quote that last line."""
    import nbformat

    for sent in (False, True):
        o = sandbox.Outcome(137, False, "Traceback ...\n(312.0, 2039.0)\n", inputs_sent=sent)
        status, _ = grade._status(nbformat.v4.new_notebook(), o, 30, 300)
        assert status.startswith("the sandbox failed (exit 137)") and ("2039" in status) is not sent, status

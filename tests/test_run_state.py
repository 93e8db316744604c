"""A run always ends in a true state: interrupted, failed or complete, never `running` for ever; its kernels
are shut down; --resume reuses only what validates, and the printed "fix it, then:" command works."""
import errno
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import nbformat
import pytest

from bad_input_table import record
from ci import run as chain
from test_chain import GOOD, make_lab
from utils import results

ROOT = Path(__file__).resolve().parents[1]


def stable(message: str) -> str:
    """The message with what changes from run to run (run folder stamps, pids, seconds) as placeholders, so the
    generated table does not drift."""
    message = re.sub(r"\d{8}-\d{6}", "<stamp>", message)
    message = re.sub(r"\b(pid|kill) \d+", r"\1 <pid>", message)
    return re.sub(r"\b\d+(\.\d+)? s\b", "<n> s", message)


def _profile(tmp_path):
    return {"name": "test", "params": {"size": 7}, "labs": {}, "_path": str(tmp_path / "test.yaml")}


def _manifest(run_dir):
    return json.loads((run_dir / "run.json").read_text())


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:   # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


def _kernel_sockets(tmp):
    return set(Path(tmp).glob("quant-lab-kernel-*"))


# signals -----------------------------------------------------------------------------------------

@pytest.mark.skipif(os.name != "posix", reason="signals to a child process")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_the_run_interrupted_and_shuts_its_kernel_down(tmp_path, sig):
    labs = tmp_path / "labs"
    make_lab(labs, "01_a", GOOD.format(name="01_a"))
    make_lab(labs, "02_b", f'import os, time\nopen({str(tmp_path / "kernel.pid")!r}, "w").write(str(os.getpid()))\n'
                           'time.sleep(120)')
    runtime = tmp_path / "runtime"
    (tmp_path / "test.yaml").write_text("name: test\nparams:\n  size: 7\nlabs: {}\n")
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from pathlib import Path
        from ci import run as chain
        real = chain.discover_labs
        chain.discover_labs = lambda labs_dir=None: real(Path({str(labs)!r}))
        sys.exit(chain.main(["--profile", {str(tmp_path / "test.yaml")!r}, "--runs-dir", {str(tmp_path / "runs")!r}]))
    """)
    private_tmp = Path(tempfile.mkdtemp())    # the kernels' IPC sockets go here, apart from other test runs
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime), "TMPDIR": str(private_tmp)}
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    pid_file = tmp_path / "kernel.pid"
    deadline = time.monotonic() + 120
    while not pid_file.exists() or not pid_file.read_text():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the second lab never started"
        time.sleep(0.2)
    kernel_pid = int(pid_file.read_text())
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)

    record("run state", f"the chain gets {sig.name} during a lab", stable(err))
    assert proc.returncode == 128 + sig, (proc.returncode, err)
    (run_dir,) = (tmp_path / "runs").iterdir()
    manifest = _manifest(run_dir)
    assert manifest["status"] == "interrupted" and manifest["finished"]
    assert sig.name in manifest["failure"]["reason"]
    assert [(e["lab"], e["status"]) for e in manifest["labs"]] == [("01_a", "complete"), ("02_b", "interrupted")]
    assert "interrupted" in (run_dir / "report.md").read_text().lower()
    assert "running" not in (run_dir / "report.md").read_text().lower()
    assert f"--resume {run_dir} --from 02_b" in err and "Traceback" not in err
    for _ in range(50):
        if not _alive(kernel_pid):
            break
        time.sleep(0.2)
    assert not _alive(kernel_pid), "the lab's kernel was left running"
    assert not list(runtime.glob("kernel-*.json")), "a kernel connection file was left behind"
    assert not _kernel_sockets(private_tmp), "kernel sockets were left behind"
    private_tmp.rmdir()


# a full disk -------------------------------------------------------------------------------------

def _enospc_for(prefix, monkeypatch):
    """Every atomic write of a file whose name starts with `prefix` fails as on a full disk."""
    real = tempfile.mkstemp

    def mkstemp(*a, **k):
        if str(k.get("prefix", "")).startswith(f".{prefix}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*a, **k)
    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


def test_a_full_disk_while_writing_the_report_ends_the_run_failed(tmp_path, monkeypatch):
    labs = tmp_path / "labs"
    make_lab(labs, "01_a", GOOD.format(name="01_a"))
    _enospc_for("report", monkeypatch)
    with pytest.raises(chain.ChainError) as err:
        chain.run_chain(_profile(tmp_path), labs=chain.discover_labs(labs), runs_dir=tmp_path / "runs")
    record("run state", "the disk fills while the runner writes the report", stable(str(err.value)))
    assert "No space left on device" in str(err.value)
    (run_dir,) = (tmp_path / "runs").iterdir()
    manifest = _manifest(run_dir)
    assert manifest["status"] == "failed" and "No space left on device" in manifest["failure"]["reason"]
    assert not any("running" in p.read_text() for p in run_dir.glob("report.*")), "a stale report says running"


def test_a_full_disk_while_writing_run_json_still_ends_it(tmp_path, monkeypatch):
    """run.json cannot be replaced atomically (no room for the copy): it is rewritten in place."""
    labs = tmp_path / "labs"
    make_lab(labs, "01_a", GOOD.format(name="01_a"))
    make_lab(labs, "02_b", GOOD.format(name="02_b"))
    calls = {"n": 0}
    real = tempfile.mkstemp

    def mkstemp(*a, **k):
        if str(k.get("prefix", "")).startswith(".run.json"):
            calls["n"] += 1
            if calls["n"] > 3:    # the first saves work, then the disk is full
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*a, **k)
    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    with pytest.raises(chain.ChainError) as err:
        chain.run_chain(_profile(tmp_path), labs=chain.discover_labs(labs), runs_dir=tmp_path / "runs")
    record("run state", "the disk fills while the runner records run.json", stable(str(err.value)))
    (run_dir,) = (tmp_path / "runs").iterdir()
    manifest = _manifest(run_dir)
    assert manifest["status"] == "failed" and "No space left on device" in manifest["failure"]["reason"]


# --resume of a run that is still running ---------------------------------------------------------

def _earlier_run(tmp_path, labs):
    run_dir = chain.run_chain(_profile(tmp_path), labs=chain.discover_labs(labs), runs_dir=tmp_path / "runs")
    return run_dir


@pytest.fixture
def two_labs(tmp_path, monkeypatch):
    labs = tmp_path / "labs"
    make_lab(labs, "01_a", GOOD.format(name="01_a"))
    make_lab(labs, "02_b", GOOD.format(name="02_b"))
    real = chain.discover_labs
    monkeypatch.setattr(chain, "discover_labs", lambda labs_dir=None: real(labs))   # the CLI sees these labs
    (tmp_path / "test.yaml").write_text("name: test\nparams:\n  size: 7\nlabs: {}\n")
    return labs


def _mark_running(run_dir, pid):
    m = _manifest(run_dir)
    m.update(status="running", finished=None, pid=pid)
    m["labs"][-1]["status"] = "running"
    (run_dir / "run.json").write_text(json.dumps(m))


def test_resume_refuses_a_run_whose_process_is_alive(tmp_path, capsys, two_labs):
    run_dir = _earlier_run(tmp_path, two_labs)
    _mark_running(run_dir, os.getpid())          # this very process: alive
    rc = chain.main(["--resume", str(run_dir), "--from", "02_b", "--runs-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    record("resume", "--resume of a run whose process is still running", stable(err))
    assert rc == 1 and "still running" in err and str(os.getpid()) in err
    assert len(list((tmp_path / "runs").iterdir())) == 1     # no new run folder


def test_resume_of_a_run_whose_process_is_gone_says_so_and_proceeds(tmp_path, capsys, two_labs):
    run_dir = _earlier_run(tmp_path, two_labs)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _mark_running(run_dir, dead.pid)
    rc = chain.main(["--resume", str(run_dir), "--from", "02_b", "--runs-dir", str(tmp_path / "runs")])
    out = capsys.readouterr()
    note = next(line for line in out.out.splitlines() if line.startswith("note:"))
    record("resume", "--resume of a run marked running whose process is gone", stable(note))
    assert rc == 0, out.err
    assert str(dead.pid) in out.out + out.err and "interrupted" in out.out + out.err
    old = _manifest(run_dir)
    assert old["status"] == "interrupted" and str(dead.pid) in old["failure"]["reason"]


# --resume validates what it copies; the fix-it command works when followed -----------------------

def _truncate_notebook(run_dir):
    nb = run_dir / "01_a" / "01_a.ipynb"
    nb.write_text(nb.read_text()[:200])


def _wrong_shape_results(run_dir):
    p = run_dir / "01_a" / "results.json"
    payload = json.loads(p.read_text())
    payload["headline"] = ["size", 7]            # a list where a mapping belongs
    p.write_text(json.dumps(payload))


def _truncate_results(run_dir):
    p = run_dir / "01_a" / "results.json"
    p.write_text(p.read_text()[:60])


def _failed_lab_status(run_dir):
    m = _manifest(run_dir)
    m["labs"][0]["status"] = "failed"
    (run_dir / "run.json").write_text(json.dumps(m))


@pytest.mark.parametrize("damage, case", [
    (_truncate_notebook, "--resume reusing a truncated executed notebook"),
    (_wrong_shape_results, "--resume reusing a results.json with headline as a list"),
    (_truncate_results, "--resume reusing a truncated results.json"),
    (_failed_lab_status, "--resume reusing a lab its run recorded as failed"),
])
def test_resume_refuses_what_does_not_validate_and_its_command_works(tmp_path, capsys, two_labs, damage, case):
    run_dir = _earlier_run(tmp_path, two_labs)
    damage(run_dir)
    rc = chain.main(["--resume", str(run_dir), "--from", "02_b", "--runs-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    record("resume", case, stable(err))
    assert rc == 1 and "01_a" in err, err
    assert len(list((tmp_path / "runs").iterdir())) == 1, "a run folder was made for a refused resume"
    cmd = err.split("fix it, then: ")[1].splitlines()[0] if "fix it, then: " in err else \
        err.split("then: ")[1].splitlines()[0]
    argv = shlex.split(cmd)
    assert argv[:3] == ["python", "-m", "ci.run"] and "--from" in argv
    assert chain.main(argv[3:]) == 0, capsys.readouterr().err          # following it works
    newest = sorted((tmp_path / "runs").iterdir())[-1]
    assert _manifest(newest)["status"] == "complete"
    results.read_results(newest / "01_a")


@pytest.mark.parametrize("damage, case", [
    ('open(p, "w").write(open(p).read()[:50])', "a lab fails on an earlier lab's truncated results.json"),
    ('import json; d = json.load(open(p)); d["headline"] = []; open(p, "w").write(json.dumps(d))',
     "a lab fails on an earlier lab's wrong-shaped results.json"),
])
def test_the_fix_it_command_for_a_broken_earlier_result_works_when_followed(tmp_path, capsys, two_labs,
                                                                           damage, case):
    """02_b fails because 01_a's results.json went bad: the command must rerun 01_a, not 02_b again."""
    import shutil
    shutil.rmtree(two_labs / "02_b")
    make_lab(two_labs, "02_b", f'import os\np = os.path.join(run_dir, "01_a", "results.json")\n{damage}\n'
             'from utils import runs\nassert runs.find_lab_results("01_a", run_dir)["headline"]["size"] == 7')
    with pytest.raises(chain.ChainError) as err:
        chain.run_chain(_profile(tmp_path), labs=chain.discover_labs(two_labs), runs_dir=tmp_path / "runs")
    msg = str(err.value)
    record("resume", case, stable(msg))
    cmd = msg.split("fix it, then: ")[1].splitlines()[0]
    assert "--from 01_a" in cmd, msg
    shutil.rmtree(two_labs / "02_b")                                   # the fix: 02_b no longer damages 01_a
    make_lab(two_labs, "02_b", GOOD.format(name="02_b"))
    assert chain.main(shlex.split(cmd)[3:]) == 0, capsys.readouterr().err
    newest = sorted((tmp_path / "runs").iterdir())[-1]
    assert _manifest(newest)["status"] == "complete"


def test_results_of_the_wrong_shape_are_refused_naming_the_key(tmp_path):
    results.write_results(tmp_path, "01_a", headline={"x": 1})
    p = tmp_path / "results.json"
    for key, bad in (("headline", []), ("verdicts", {}), ("data", None), ("lab", 3)):
        payload = json.loads(p.read_text())
        payload[key] = bad
        p.write_text(json.dumps(payload))
        with pytest.raises(results.ResultsError, match=rf"{p}.*{key}") as err:
            results.read_results(tmp_path)
        record("results file", f"results.json with {key} of the wrong type", str(err.value))
        results.write_results(tmp_path / "again", "01_a", headline={"x": 1})
        p.write_text((tmp_path / "again" / "results.json").read_text())
        (tmp_path / "again" / "results.json").unlink()


def test_kept_notebook_is_valid_after_a_run(tmp_path):
    """The executed notebooks a run keeps validate (they are what --resume copies)."""
    labs = tmp_path / "labs"
    make_lab(labs, "01_a", GOOD.format(name="01_a"))
    run_dir = chain.run_chain(_profile(tmp_path), labs=chain.discover_labs(labs), runs_dir=tmp_path / "runs")
    nbformat.validate(nbformat.read(run_dir / "01_a" / "01_a.ipynb", as_version=4))

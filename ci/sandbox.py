"""Where a submission runs: bubblewrap (Debian's `bubblewrap`, what Flatpak uses), or nothing when asked by name.

A submission sees, in bubblewrap: the system's /usr, a few files of /etc and the Python environment,
read-only; a throw-away folder of its own (its notebook, the cells to run) at /submission, writable; a
read-only copy of the course's `utils/` in which the exercises' references are stubs
(`stub_references`: the answer key is not in the sandbox, under any name); an empty /tmp; no network
(--unshare-all), no other process. Not there: the repository, the labs' source notebooks, the gradebook, other submissions, the
hidden cases until the student's cells are done (they come on stdin, ci/grade_driver.py).

`none` runs the same driver as a plain process in the same throw-away folder with the same stubbed copy
first on its path: the points are still decided outside, but the student's code can read and write
whatever the grader's user can. It runs only when asked for by name, and the summary says so.
"""
from __future__ import annotations

import ast
import os
import resource
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
MODES = ("auto", "bwrap", "none")
FILE_LIMIT = 256 * 2**20          # bytes: the largest file a submission may write
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "hosts", "nsswitch.conf", "passwd", "group")
STUB = ("raise __import__('utils.exercises', fromlist=['ReferenceCalled']).ReferenceCalled("
        "{name!r} + ' is the course\\'s reference for this exercise: not available while grading; write your own')")


class SandboxError(RuntimeError):
    """The sandbox asked for cannot run here, with what to do."""


def bwrap_path() -> str | None:
    """bwrap, if installed and allowed to make user namespaces here."""
    path = shutil.which("bwrap")
    if not path:
        return None
    ok = subprocess.run([path, "--unshare-all", "--ro-bind", "/", "/", "true"], capture_output=True, timeout=30)
    return path if ok.returncode == 0 else None


def choose(mode: str) -> str:
    """The sandbox a round uses: `auto` takes bwrap when it works here; `none` only when named."""
    if mode not in MODES:
        raise SandboxError(f"--sandbox {mode!r}: choose one of {', '.join(MODES)}")
    if mode == "none":
        return "none"
    if bwrap_path():
        return "bwrap"
    raise SandboxError(f"--sandbox {mode}: bubblewrap is not installed or cannot make user namespaces here; "
                       "install it (apt-get install -y bubblewrap), or pass --sandbox none to grade without a "
                       "sandbox (the students' code then runs as you)")


def describe(mode: str) -> str:
    if mode == "bwrap":
        v = subprocess.run([bwrap_path() or "bwrap", "--version"], capture_output=True, text=True).stdout.strip()
        return f"bwrap ({v or 'bubblewrap'}): no network, read-only system, a throw-away folder per submission"
    return ("none (asked for by name): the students' code ran as the grader's user, able to read and write "
            "what it can; points were still computed outside their kernels")


def stub_references(code: Path, refs: set[tuple[str, str]]) -> None:
    """Replace the body of each (module, function) in the copy under `code` by a raise of ReferenceCalled."""
    by_file: dict[Path, list[str]] = {}
    for module, name in refs:
        by_file.setdefault(code / (module.replace(".", "/") + ".py"), []).append(name)
    for path, names in by_file.items():
        lines = path.read_text().splitlines(keepends=True)
        tree = ast.parse("".join(lines))
        found = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names}
        missing = set(names) - set(found)
        if missing:
            raise SandboxError(f"reference(s) {sorted(missing)} are not top-level functions of {path.name}")
        for node in sorted(found.values(), key=lambda n: -n.lineno):   # bottom up: line numbers stay valid
            first = node.body[0]
            indent = " " * first.col_offset
            stub = indent + STUB.format(name=f"{path.stem}.{node.name}") + "\n"
            lines[first.lineno - 1:node.end_lineno] = [stub]
        path.write_text("".join(lines))


def prepare(work: Path, refs: set[tuple[str, str]]) -> Path:
    """WORK/code: a copy of utils/ with the references stubbed, and the driver."""
    code = work.parent / (work.name + "-code")
    shutil.copytree(REPO_ROOT / "utils", code / "utils", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy2(REPO_ROOT / "ci" / "grade_driver.py", code / "grade_driver.py")
    stub_references(code, refs)
    return code


def _env(work: str, code: str) -> dict[str, str]:
    return {"PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
            "HOME": work, "TMPDIR": "/tmp", "PYTHONPATH": code, "PYTHONDONTWRITEBYTECODE": "1",
            "QUANTLAB_GRADING": "1", "JUPYTER_RUNTIME_DIR": f"{work}/.jupyter-runtime", "IPYTHONDIR": f"{work}/.ipython",
            "MPLCONFIGDIR": f"{work}/.matplotlib", "JUPYTER_PLATFORM_DIRS": "1", "PYTHONWARNINGS": "ignore",
            "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "2", "LANG": "C.UTF-8"}


def _bwrap_argv(work: Path, code: Path) -> list[str]:
    argv = [bwrap_path() or "bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--clearenv"]
    for top in ("/bin", "/lib", "/lib64", "/lib32", "/sbin"):
        p = Path(top)
        if p.is_symlink():
            argv += ["--symlink", os.readlink(p), top]
        elif p.exists():
            argv += ["--ro-bind", top, top]
    argv += ["--ro-bind", "/usr", "/usr"]
    for name in ETC:                      # what the loader, Python and the kernel need of /etc, no more
        if os.path.exists(f"/etc/{name}"):
            argv += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    argv += ["--tmpfs", "/tmp"]           # before the binds below: a venv in a clone under /tmp stays visible
    prefixes = {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}
    for p in sorted(prefixes):
        if not p.startswith("/usr/"):
            argv += ["--ro-bind", p, p]
    argv += ["--ro-bind", str(code), "/course", "--bind", str(work), "/submission", "--dev", "/dev",
             "--proc", "/proc", "--chdir", "/submission"]
    for k, v in _env("/submission", "/course").items():
        argv += ["--setenv", k, v]
    python = os.path.join(os.path.realpath(sys.prefix), "bin", Path(sys.executable).name)
    return argv + [python, "/course/grade_driver.py", "/submission"]


@dataclass
class Outcome:
    returncode: int | None
    cut: bool
    log: str


def _limits():
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run(mode: str, work: Path, code: Path, stdin: str, timeout: float) -> Outcome:
    """Run the driver on WORK in the sandbox `mode`, the cases' inputs on stdin, within timeout seconds."""
    if mode == "bwrap":
        argv, env, cwd = _bwrap_argv(work, code), {}, None
    else:
        argv, env, cwd = [sys.executable, str(code / "grade_driver.py"), str(work)], _env(str(work), str(code)), work
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env, cwd=cwd, start_new_session=True, preexec_fn=_limits)
    try:
        log, _ = p.communicate(stdin, timeout=timeout)
        return Outcome(p.returncode, False, (log or "")[-4000:])
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        log, _ = p.communicate()
        return Outcome(None, True, (log or "")[-4000:])
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()

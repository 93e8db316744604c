"""Where a submission runs: bubblewrap (Debian's `bubblewrap`, what Flatpak uses), or nothing when asked by name.

A submission sees, in bubblewrap: the system's /usr, a few files of /etc and the Python environment,
read-only; a throw-away folder of its own (its notebook, the cells to run) at /submission, writable; a
read-only copy of the course's `utils/` in which the exercises' references are stubs
(`stub_references`: the answer key is not in the sandbox, under any name); an empty /tmp; no network
(--unshare-all), no other process, no capability (even when the grader is root), /proc/sys read-only. Not there: the
repository, the labs' source notebooks, the gradebook, other submissions, the hidden cases until the student's
cells are done (the driver asks for them on stdout with a nonce it alone holds, ci/grade_driver.py). What the
sandbox leaves is read back only as plain files of its folder (`read_back`): it is the student's to shape.

`none` runs the same driver as a plain process in the same throw-away folder with the same stubbed copy
first on its path: the points are still decided outside, but the student's code can read and write
whatever the grader's user can. It runs only when asked for by name, and the summary says so.
"""
from __future__ import annotations

import ast
import errno
import os
import resource
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

REPO_ROOT = Path(__file__).resolve().parents[1]
MODES = ("auto", "bwrap", "none")
FILE_LIMIT = 256 * 2**20          # bytes: the largest file a submission may write
MEMORY_LIMIT = 4 * 2**30          # bytes of private writable memory per process (RLIMIT_DATA), see _limits
MAX_RESIDENT = 8 * 2**30          # bytes resident in all the sandbox's processes together (shared memory too)
MAX_PROCS = 64                    # processes at once: a fork bomb is stopped (RLIMIT_NPROC does not bind root)
MAX_DISK = 2**30                  # bytes a submission may leave in its folder (the grader's disk)
MAX_FILES = 20_000                # files and folders it may leave there
TMPFS = 256 * 2**20               # bytes of /tmp and of /dev/shm in bwrap: they live in the machine's memory
WATCH_EVERY = 0.25                # seconds between two looks at the sandbox's processes and folder
LOG_TAIL = 4000                   # bytes of the sandbox's stdout kept: a flood must not fill the grader's memory
REQUEST = b"quantlab: the cases, please"   # the driver's line asking for the cases, followed by the run's nonce
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
    # no capabilities even when the grader runs as root: else the sandbox's root could remount its read-only binds
    argv = [bwrap_path() or "bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--clearenv", "--cap-drop", "ALL"]
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
    argv += ["--size", str(TMPFS), "--tmpfs", "/tmp"]   # before the binds below: a venv in a clone under /tmp stays visible
    prefixes = {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}
    for p in sorted(prefixes):
        if not p.startswith("/usr/"):
            argv += ["--ro-bind", p, p]
    argv += ["--ro-bind", str(code), "/course", "--bind", str(work), "/submission", "--dev", "/dev",
             "--size", str(TMPFS), "--tmpfs", "/dev/shm", "--remount-ro", "/dev",   # /dev itself is memory too
             "--proc", "/proc", "--chdir", "/submission"]
    for knob in ("/proc/sys", "/proc/sysrq-trigger"):   # the kernel's settings: the owner's to write, and root is the owner
        argv += ["--ro-bind-try", knob, knob]
    for k, v in _env("/submission", "/course").items():
        argv += ["--setenv", k, v]
    python = os.path.join(os.path.realpath(sys.prefix), "bin", Path(sys.executable).name)
    return argv + [python, "/course/grade_driver.py", "/submission"]


@dataclass
class Outcome:
    returncode: int | None
    cut: bool
    log: str
    inputs_sent: bool = False
    limit: str = ""          # the limit it was stopped at, if any


def _limits():
    """Not RLIMIT_AS: a CUDA build of torch maps several GiB of libraries at import, so an address-space cap
    that a CPU kernel never reaches would refuse `import torch` on an instructor's GPU box. RLIMIT_DATA counts
    what a submission allocates (heap, private mappings); _watch adds what it touches in shared memory."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_LIMIT, MEMORY_LIMIT))


def _resident(pids: list[int]) -> int:
    """Bytes resident in these processes (a page two of them share counts twice: an upper bound)."""
    total, page = 0, os.sysconf("SC_PAGE_SIZE")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue
    return total


def _tree(root: int) -> list[int]:
    """root and every process under it (a pid namespace's processes all are), from /proc."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat", "rb") as f:
                    st = f.read()
            except OSError:
                continue
            kids.setdefault(int(st[st.rindex(b")") + 2:].split()[1]), []).append(int(d))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += kids.get(pid, [])
    return out


def _folder_over(work: Path) -> str:
    """Why the submission's folder is over its limits, or ''. Links are counted, never followed."""
    used, n, todo = 0, 0, [str(work)]
    while todo:
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:
            continue
        for e in entries:
            n += 1
            try:
                used += e.stat(follow_symlinks=False).st_blocks * 512
                if e.is_dir(follow_symlinks=False):
                    todo.append(e.path)
            except OSError:
                continue
            if n > MAX_FILES:
                return f"more than {MAX_FILES:,} files in its folder"
            if used > MAX_DISK:
                return f"more than {MAX_DISK / 2**20:g} MiB written to its folder"
    return ""


def _watch(p: subprocess.Popen, work: Path, done: threading.Event, why: list[str]) -> None:
    """Stop the sandbox, every process in it, at MAX_PROCS processes, MAX_RESIDENT bytes resident or past
    its folder's limits."""
    while not done.wait(WATCH_EVERY):
        pids = _tree(p.pid)
        over = (f"more than {MAX_PROCS} processes at once" if len(pids) > MAX_PROCS else "") or (
            f"more than {MAX_RESIDENT / 2**30:g} GiB of memory in use" if _resident(pids) > MAX_RESIDENT else "") \
            or _folder_over(work)
        if over:
            why.append(over)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            return


def run(mode: str, work: Path, code: Path, stdin: str, timeout: float,
        before_inputs: Callable[[], None] | None = None) -> Outcome:
    """Run the driver on WORK in the sandbox `mode` within timeout seconds. The cases' inputs (`stdin`) go in
    only when the driver asks with this run's nonce (a secret it read first from stdin, which no student
    process can see), once the student's cells are done; `before_inputs` runs just before they go in. Only
    the last LOG_TAIL bytes of what the sandbox prints are kept."""
    if mode == "bwrap":
        argv, env, cwd = _bwrap_argv(work, code), {}, None
    else:
        argv, env, cwd = [sys.executable, str(code / "grade_driver.py"), str(work)], _env(str(work), str(code)), work
    nonce = secrets.token_hex(16).encode()
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         env=env, cwd=cwd, start_new_session=True, preexec_fn=_limits)
    tail, sent = bytearray(), threading.Event()

    def pump():
        for line in iter(lambda: p.stdout.readline(65536), b""):
            if not sent.is_set() and line.rstrip(b"\n").endswith(REQUEST + b" " + nonce):
                try:
                    if before_inputs:
                        before_inputs()
                finally:
                    sent.set()
                try:
                    p.stdin.write(stdin.encode())
                    p.stdin.close()
                except OSError:
                    pass
                continue
            tail.extend(line)
            del tail[:-LOG_TAIL]

    reader = threading.Thread(target=pump, daemon=True)
    done, over = threading.Event(), []
    watcher = threading.Thread(target=_watch, args=(p, work, done, over), daemon=True)
    watcher.start()
    try:
        p.stdin.write(nonce + b"\n")
        p.stdin.flush()
    except OSError:
        pass
    reader.start()
    cut = False
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        cut = True
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        done.set()
        watcher.join(10)
        reader.join(10)
    return Outcome(None if cut else p.returncode, cut, tail.decode(errors="replace"), sent.is_set(),
                   f"stopped at its limit: {over[0]}" if over else "")


def read_back(work: Path, rel: str, limit: int) -> tuple[bytes | None, str]:
    """(the bytes of WORK/rel, '') when it is a plain file there, no link on the way, of at most `limit`
    bytes; else (None, why). What a sandbox leaves is the student's to shape: a link would make the
    grader read its own files."""
    parts = rel.split("/")
    try:
        fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None, "is missing"
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        f = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except FileNotFoundError:
        os.close(fd)
        return None, "is missing"
    except OSError as e:
        os.close(fd)
        return None, ("is a link, not followed" if e.errno in (errno.ELOOP, errno.ENOTDIR)
                      else f"is not readable ({errno.errorcode.get(e.errno, e.errno)})")
    os.close(fd)
    with os.fdopen(f, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None, "is not a plain file"
        data = fh.read(limit + 1)
    if len(data) > limit:
        return None, f"is larger than {limit / 2**20:g} MiB"
    return data, ""

"""A run's state on disk (run.json) and the means to keep it true: signals end a run `interrupted`, a full disk
still records `failed`, every kernel the chain started is shut down, and --resume reuses only labs whose
copied notebook and results validate, from a run whose process is gone.
"""
from __future__ import annotations

import errno
import json
import os
import signal
import socket
import threading
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from utils.results import RESULTS_FILE, ResultsError, atomic_write_json, read_results
from utils.runs import RUN_MANIFEST

FULL_DISK = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
_KERNELS: list = []            # strong references: an interrupted nbclient drops its own before clean-up


class Interrupted(BaseException):
    """A signal asked the chain to stop (BaseException, like KeyboardInterrupt: nothing swallows it)."""

    def __init__(self, signum: int):
        self.signum = signum
        self.kernels_stopped = 0
        self.name = signal.Signals(signum).name
        super().__init__(f"interrupted by {self.name}")


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@contextmanager
def signals_raise():
    """SIGTERM, SIGINT and SIGHUP kill the chain's kernels at once (left to nbclient's graceful shutdown, a busy
    kernel prints a traceback) and raise Interrupted in the main thread, once; the old handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = []

    def handler(signum, frame):
        if not raised:              # a second signal while the run is being ended must not break that
            raised.append(signum)
            exc = Interrupted(signum)
            exc.kernels_stopped = shutdown_kernels()
            raise exc
    sigs = [s for s in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGHUP", None)) if s is not None]
    old = {s: signal.signal(s, handler) for s in sigs}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# kernels -------------------------------------------------------------------------------------------

def track(manager) -> None:
    """Remember a kernel manager, so an interrupted run can shut its kernel down; forget ended ones."""
    _KERNELS[:] = [km for km in _KERNELS if _running(km)]
    _KERNELS.append(manager)


def _running(km) -> bool:
    proc = getattr(getattr(km, "provisioner", None), "process", None)
    return proc is not None and proc.poll() is None


def shutdown_kernels() -> int:
    """Kill every tracked kernel still running (its process group: workers too) and remove its connection
    file and IPC sockets. An interrupted nbclient never reaches its own clean-up. Returns how many."""
    n = 0
    for km in list(_KERNELS):
        prov = getattr(km, "provisioner", None)
        proc = getattr(prov, "process", None)
        if proc is not None and proc.poll() is None:
            n += 1
            try:
                pgid = getattr(prov, "pgid", None)
                if pgid and hasattr(os, "killpg"):
                    os.killpg(pgid, signal.SIGKILL)
                else:
                    proc.kill()
                proc.wait(timeout=10)
            except (OSError, ValueError):
                pass
            except Exception:  # noqa: BLE001 - a timeout while waiting: the kill was sent
                pass
        for clean in ("cleanup_connection_file", "cleanup_ipc_files"):
            try:
                getattr(km, clean)()
            except Exception:  # noqa: BLE001 - best effort: the files may already be gone
                pass
        if getattr(km, "transport", "") == "ipc" and getattr(km, "ip", ""):
            for sock in Path(km.ip).parent.glob(Path(km.ip).name + "-*"):   # every port's socket of this kernel
                sock.unlink(missing_ok=True)
    _KERNELS.clear()
    return n


# run.json ------------------------------------------------------------------------------------------

def _process_start(pid: int) -> str:
    """The process's start time (Linux /proc), so a reused pid is not taken for the run's process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def owner() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "pid_start": _process_start(os.getpid())}


def save_manifest(run_dir: Path, manifest: dict) -> None:
    """Atomically; on a full disk (no room for the copy) rewrite the file in place, then re-raise."""
    path = Path(run_dir) / RUN_MANIFEST
    try:
        atomic_write_json(path, manifest)
    except OSError as exc:
        if exc.errno not in FULL_DISK or not path.is_file():
            raise
        text = json.dumps(manifest, indent=2, default=str) + "\n"
        with open(path, "r+", encoding="utf-8") as fh:
            fh.write(text)
            fh.truncate()
        raise


def finish(run_dir: Path, manifest: dict, status: str, failure: dict, build_report) -> str:
    """Record the end of a run as `status` with its failure, even on a full disk; rebuild the report, or remove a
    stale one that would still say `running`. Returns a note when something could not be written."""
    manifest.update(status=status, finished=now(), failure=failure)
    for entry in manifest.get("labs", []):
        if entry.get("status") == "running":
            entry["status"] = status
    note = ""
    try:
        save_manifest(run_dir, manifest)
    except OSError as exc:
        note = f"run.json was rewritten in place ({exc.strerror or exc})"
    try:
        build_report(run_dir)
    except Exception as exc:  # noqa: BLE001 - the report must never outlive the state it shows
        for stale in ("report.md", "report.html"):
            try:
                (Path(run_dir) / stale).unlink(missing_ok=True)
            except OSError:
                pass
        note = (note + "; " if note else "") + f"the report could not be written ({exc}) and was removed"
        manifest["report_error"] = str(exc)
        try:
            save_manifest(run_dir, manifest)
        except OSError:
            pass
    return note


def _alive(pid: int, start: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    now_start = _process_start(pid)
    if not now_start:
        return True
    if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
        return False
    return not start or now_start == start


def check_not_running(run_dir: Path, manifest: dict, build_report, log=print) -> None:
    """Refuse (ValueError) a run still `running` in a live process; a `running` run whose process is gone
    was killed without a chance to say so: it is marked `interrupted` (a true state) and the resume goes on."""
    if manifest.get("status") != "running":
        return
    pid, host = manifest.get("pid"), manifest.get("host")
    if pid is None:
        raise ValueError(f"--resume {run_dir}: that run says it is still running and its run.json records no "
                         "process to check; if it has stopped, start a fresh run with python -m ci.run --profile "
                         f"{manifest.get('profile', 'NAME')}; nothing was run")
    if host and host != socket.gethostname():
        raise ValueError(f"--resume {run_dir}: that run is still running, or was, on host {host} (pid {pid}); "
                         f"resume it on {host} once it has ended; nothing was run")
    if _alive(int(pid), str(manifest.get("pid_start") or "")):
        raise ValueError(f"--resume {run_dir}: that run is still running (pid {pid}); wait for it to end, or stop "
                         f"it (kill {pid}: it then records itself interrupted), then resume; nothing was run")
    reason = (f"its process (pid {pid}) ended without recording how (killed with SIGKILL, out of memory, or "
              f"the machine stopped); found by --resume at {now()}")
    lab = next((e["lab"] for e in manifest.get("labs", []) if e.get("status") == "running"), None)
    finish(run_dir, manifest, "interrupted",
           {"lab": lab, "notebook": None, "cell": None, "ename": "ProcessGone", "evalue": reason, "reason": reason},
           build_report)
    log(f"note: {run_dir} said it was running, but its process (pid {pid}) is gone: it is now marked "
        "interrupted; its labs before --from are checked before they are reused")


# how a run ended ------------------------------------------------------------------------------------

def failed_cell(exc: BaseException, out_nb: Path) -> dict:
    """The cell a lab stopped in: papermill names it; a timeout, a dead kernel or a signal do not, so the
    executed notebook's own record (the last cell papermill started) is read instead."""
    index, count, source = (getattr(exc, "cell_index", None), getattr(exc, "exec_count", None),
                            getattr(exc, "source", None))
    if index is None and out_nb.is_file():
        import nbformat
        try:
            cells = nbformat.read(str(out_nb), as_version=4).cells
            started = [i for i, c in enumerate(cells) if (c.metadata.get("papermill") or {}).get("start_time")]
            if started:
                index = started[-1]
                count, source = cells[index].get("execution_count"), cells[index].source
                if count is None:   # the kernel died before it said: the number a fresh kernel gives it
                    count = sum(1 for i in started if cells[i].cell_type == "code")
        except Exception:  # noqa: BLE001 - an unreadable notebook: the lab is still named
            pass
    if index is None:
        return {"cell": None, "cell_source": ""}
    text = " / ".join(ln.strip() for ln in (source or "").splitlines() if ln.strip())
    label = f"[{count}]" if count is not None else "(not started)"
    return {"cell": f"{label} (#{index + 1} in the executed notebook)",
            "cell_source": text if len(text) <= 160 else text[:157] + "..."}


def failure_of(exc: BaseException, lab: str | None, notebook, out_nb: Path | None, no_cell=False) -> dict:
    ename = getattr(exc, "ename", None) or type(exc).__name__
    evalue = str(getattr(exc, "evalue", None) or exc).strip()[:2000]
    first = evalue.splitlines()[0] if evalue else ""
    reason = str(exc) if isinstance(exc, Interrupted) else f"{ename}: {first}" if first else ename
    failure = {"lab": lab, "notebook": str(notebook) if notebook else None, "ename": ename, "evalue": evalue,
               "reason": reason, "cell": None, "cell_source": ""}
    if out_nb is not None:
        if not no_cell:
            failure.update(failed_cell(exc, out_nb))
        failure["executed_notebook"] = str(out_nb) if out_nb.is_file() else None
    return failure


def hint(exc: BaseException, profile: dict, run_dir: Path) -> str:
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    if isinstance(exc, CellTimeoutError):
        return (f"  the cell ran past cell_timeout_s: {profile.get('cell_timeout_s')} (the profile's limit per cell):"
                " raise it, or set it to null for no limit\n")
    if isinstance(exc, DeadKernelError):
        return "  the kernel died in that cell (out of memory, or a crash in native code)\n"
    if isinstance(exc, OSError) and exc.errno in FULL_DISK:
        return f"  free space on the disk that holds {run_dir}, or give --runs-dir on another disk\n"
    return ""


# what --resume reuses ------------------------------------------------------------------------------

def lab_problem(lab_dir: Path, lab: str, entry: dict | None = None) -> str:
    """Why a lab's folder cannot be reused ("" when it can): its run.json entry, results.json, notebook."""
    import nbformat

    if entry is not None and entry.get("status") not in ("complete", "reused"):
        return f"that run recorded {lab} as {entry.get('status')!r}, not complete"
    try:
        res = read_results(lab_dir)
    except ResultsError as exc:
        return str(exc)
    if res.get("lab") != lab:
        return f"{Path(lab_dir) / RESULTS_FILE} is {res.get('lab')!r}'s results, not {lab}'s"
    notebooks = sorted(Path(lab_dir).glob("*.ipynb"))
    if not notebooks:
        return f"{lab_dir} holds no executed notebook"
    for nb in notebooks:
        try:
            nbformat.validate(nbformat.read(str(nb), as_version=4))
        except Exception as exc:  # noqa: BLE001 - any reason the notebook cannot be read is a reason
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return f"the executed notebook {nb} does not validate ({first})"
    return ""


def first_bad_lab(run_dir: Path, labs: list[str], entries: dict | None = None) -> tuple[str, str] | None:
    """(lab, why) for the first of `labs` in run_dir that cannot be reused, else None."""
    for lab in labs:
        if entries is not None and lab not in entries:
            return lab, f"that run has no record of running {lab}"
        why = lab_problem(Path(run_dir) / lab, lab, entries.get(lab) if entries is not None else None)
        if why:
            return lab, why
    return None


def resume_target(run_dir: Path, manifest: dict, order: list[str], failed_lab: str | None) -> tuple[str, str]:
    """The lab a resume must start from, and why when it is earlier than the failed lab: the first lab before
    it whose results in run_dir no longer validate (a lab that fails on an earlier lab's results.json would
    fail again if that were reused)."""
    done = [e["lab"] for e in manifest["labs"] if e.get("status") in ("complete", "reused")]
    stop = failed_lab or next((lab for lab in order if lab not in done), order[-1])
    before = [lab for lab in order[:order.index(stop)] if lab in done] if stop in order else done
    bad = first_bad_lab(run_dir, before)
    if bad:
        return bad[0], f"  {bad[0]}'s results in this run no longer validate ({bad[1]}), so the run goes on from it\n"
    return stop, ""


def parameters_differ(lab_dir: Path, notebook: Path, given: dict) -> str:
    """Why a reused lab's results are not what `given` (this profile's parameters for it) would compute ("" when
    they are, or when its executed notebook does not record them): a result of other sizes, models or settings
    would sit in the new run under this profile's name."""
    from ci.profile_schema import lab_params

    executed = sorted(Path(lab_dir).glob("*.ipynb"))
    try:
        ran = json.loads(executed[0].read_text(encoding="utf-8"))["metadata"]["papermill"]["parameters"]
    except (IndexError, OSError, ValueError, KeyError, TypeError):
        return ""
    defaults = {k: v["default"] for k, v in lab_params(notebook).items()}
    then, now = {**defaults, **ran}, {**defaults, **given}
    diff = [f"{k}={then.get(k)!r} there, {now.get(k)!r} here" for k in sorted(set(then) | set(now))
            if k not in ("run_dir", "profile") and then.get(k) != now.get(k)]
    return (f"it ran with other parameters than this profile gives it ({'; '.join(diff)}), so its results are not "
            "this profile's: resume with the profile that made that run, or rerun that lab" if diff else "")

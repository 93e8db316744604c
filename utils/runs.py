"""Run folders: runs/<timestamp>-<profile>/<lab>/ holds one execution of the chain.

A run folder is created exclusively (never reused), a lab folder refuses to be written twice,
so an earlier run is never overwritten. A lab that needs an earlier lab's results finds them in
its own run folder, or, when a notebook is run alone in JupyterLab, in the newest run that has them.
"""
from __future__ import annotations

import os
import re
from datetime import datetime
from pathlib import Path

from .results import RESULTS_FILE, ResultsError, read_results

REPO_ROOT = Path(__file__).resolve().parents[1]
RUN_MANIFEST = "run.json"
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class RunsDirError(OSError):
    """The runs folder cannot be written; the message says where else runs can go."""


def runs_root() -> Path:
    """Where run folders live: $QUANTLAB_RUNS, else <repo>/runs. Empty counts as unset: Path("") is the
    current folder, which for a notebook is its lab folder."""
    return Path(os.environ.get("QUANTLAB_RUNS", "").strip() or REPO_ROOT / "runs").resolve()


def new_run_dir(profile: str, root: str | os.PathLike | None = None, now: datetime | None = None) -> Path:
    """Create a fresh run folder <root>/<YYYYmmdd-HHMMSS>-<profile>; never returns an existing one."""
    if not _NAME_OK.match(profile):
        raise ValueError(f"profile name {profile!r} must be letters, digits, '.', '_' or '-'")
    root = Path(root) if root is not None else runs_root()
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    try:
        root.mkdir(parents=True, exist_ok=True)
        for n in range(1, 1000):
            name = f"{stamp}-{profile}" if n == 1 else f"{stamp}-{profile}-{n}"
            try:
                (root / name).mkdir()
            except FileExistsError:
                continue
            return root / name
    except OSError as exc:  # read-only, full, or a file in the way: say where runs go instead
        raise RunsDirError(
            f"cannot create a run folder under {root} ({exc.strerror or exc}): give a writable folder "
            "(python -m ci.run --runs-dir DIR, or the QUANTLAB_RUNS environment variable; a notebook "
            "opened alone writes under $QUANTLAB_RUNS or runs/)") from exc
    raise RuntimeError(f"could not create a new run folder under {root}")


def lab_dir(run_dir: str | os.PathLike | None, lab: str) -> Path:
    """The folder a lab writes into. Empty run_dir (a notebook opened alone) starts a new 'interactive' run.

    Refuses a lab folder that already holds complete results: start a new run instead of overwriting.
    """
    base = Path(run_dir) if run_dir else new_run_dir("interactive")
    out = base / lab
    if (out / RESULTS_FILE).exists():
        raise FileExistsError(
            f"{out} already holds results from an earlier execution; they are kept. "
            "Start a new run (leave run_dir empty, or python -m ci.run) instead of overwriting."
        )
    (out / "figures").mkdir(parents=True, exist_ok=True)
    return out


def list_runs(root: str | os.PathLike | None = None) -> list[Path]:
    """Run folders, oldest first (names start with a sortable timestamp)."""
    root = Path(root) if root is not None else runs_root()
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and re.match(r"^\d{8}-\d{6}-", p.name))


def find_lab_results(lab: str, run_dir: str | os.PathLike | None = None,
                     root: str | os.PathLike | None = None) -> dict:
    """An earlier lab's results: from run_dir if given, else from the newest run that completed it."""
    if run_dir:
        return read_results(Path(run_dir) / lab)
    for run in reversed(list_runs(root)):
        if (run / lab / RESULTS_FILE).is_file():
            try:
                return read_results(run / lab)
            except ResultsError:
                continue
    raise ResultsError(
        f"no run under {Path(root) if root else runs_root()} has complete results for {lab}: "
        f"run labs/{lab} first."
    )

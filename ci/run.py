"""The lab chain: run every lab notebook in order with papermill, parameters from a profile.

    python -m ci.run --profile cpu-tiny                       # the embedded default (offline, CPU)
    python -m ci.run --profile rtx4090                        # a 24 GB NVIDIA box with internet
    python -m ci.run --resume runs/<id> --from 03_eval        # a new run that reuses 01-02 of <id>
    python -m ci.run --list                                   # profiles and labs

Each run gets a new folder runs/<timestamp>-<profile>/ holding run.json (status, timings, failure),
one folder per lab (executed notebook, results.json, figures) and report.md / report.html.
A lab joins the chain by adding labs/NN_name/NN_name.ipynb and its section in the profiles.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml

from utils.reporting import build_report
from utils.results import atomic_write_json, atomic_write_text
from utils.runs import REPO_ROOT, RUN_MANIFEST, RunsDirError, new_run_dir, runs_root

LABS_DIR = REPO_ROOT / "labs"
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
KERNEL_HOOKS = Path(__file__).resolve().parent / "kernel_hooks"


class ChainError(RuntimeError):
    """A profile or chain problem found before or while running, with what to do about it."""


def discover_labs(labs_dir: Path = LABS_DIR) -> dict[str, Path]:
    """{'01_env': labs/01_env/01_env.ipynb, ...} in chain order."""
    found = {}
    for folder in sorted(p for p in labs_dir.iterdir() if p.is_dir() and p.name[:2].isdigit()):
        nb = folder / f"{folder.name}.ipynb"
        if nb.is_file():
            found[folder.name] = nb
    return found


def load_profile(name_or_path: str) -> dict:
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILES_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PROFILES_DIR.glob("*.yaml")))
        raise ChainError(f"profile {name_or_path!r} not found (known: {known})")
    profile = yaml.safe_load(path.read_text()) or {}
    for key in ("name", "params", "labs"):
        if key not in profile:
            raise ChainError(f"profile {path} has no '{key}' section")
    profile["_path"] = str(path.resolve())   # run.json keeps it, so a resume finds the same file
    return profile


def lab_parameters(profile: dict, lab: str, notebook: Path, run_dir: Path) -> dict:
    """Common params the notebook declares + the lab's own section (which must all be declared)."""
    import papermill

    declared = set(papermill.inspect_notebook(str(notebook)))
    if "run_dir" not in declared:
        raise ChainError(f"{notebook} declares no run_dir parameter (or papermill could not parse its "
                         "parameters cell: keep it to plain `name = value  # comment` lines)")
    own = dict((profile["labs"] or {}).get(lab) or {})
    unknown = sorted(set(own) - declared)
    if unknown:
        raise ChainError(f"profile {profile['name']!r} sets {unknown} for {lab}, which its notebook's "
                         f"parameters cell does not declare (declared: {sorted(declared)})")
    params = {k: v for k, v in (profile["params"] or {}).items() if k in declared}
    params.update(own)
    if "run_dir" in declared:
        params["run_dir"] = str(run_dir)
    if "profile" in declared:
        params["profile"] = profile["name"]
    return params


def check_common_params(profile: dict, labs: dict[str, Path]) -> None:
    """Every key of the profile's `params` must be declared by at least one lab of the chain: a key that
    no notebook reads would otherwise be dropped without a word (a misspelt or stale setting)."""
    import papermill

    declared = set()
    for notebook in labs.values():
        declared |= set(papermill.inspect_notebook(str(notebook)))
    unread = sorted(set(profile["params"] or {}) - declared)
    if unread:
        raise ChainError(f"profile {profile['name']!r} sets params {unread}, which no lab of the chain "
                         f"declares in its parameters cell ({', '.join(labs)}): remove or rename them")


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _failure_from(exc: BaseException, lab: str, notebook: Path) -> dict:
    """What failed, where: papermill names the cell; anything else (a dead kernel) names the lab."""
    cell = getattr(exc, "exec_count", None)
    index = getattr(exc, "cell_index", None)
    return {"lab": lab, "notebook": str(notebook),
            "cell": f"[{cell}] (cell #{index})" if cell is not None or index is not None else "?",
            "ename": getattr(exc, "ename", type(exc).__name__),
            "evalue": str(getattr(exc, "evalue", exc)).strip()[:2000]}


_WIDGET = "application/vnd.jupyter.widget-view+json"
# tqdm's "43%|####  | 3/7 [00:01<00:02, 2.1it/s]", and without a total "0 examples [00:00, ? examples/s]"
_BAR = re.compile(r"^[^\n]*(\d+%\|[^|]*\|\s*\d+/\d+ \[[^\]]*\]|\d+ \w+ \[\d+:\d+(:\d+)?, [^\]]*/s\])\s*$")


def _is_progress(output) -> bool:
    """A tqdm bar as a saved notebook holds it: a widget with no state (its first frame, "0/74", shown
    as text or as "model not found" in JupyterLab) or stderr lines that are only bar updates."""
    if output.get("output_type") == "display_data":
        data = output.get("data", {})
        return _WIDGET in data and set(data) <= {_WIDGET, "text/plain"} and bool(_BAR.match(data.get("text/plain", "")))
    if output.get("output_type") == "stream" and output.get("name") == "stderr":
        lines = [ln for ln in re.split(r"[\r\n]", output.get("text", "")) if ln.strip()]
        return all(_BAR.match(ln) for ln in lines)            # also drops the blank lines tqdm leaves
    return False


def strip_progress_bars(notebook: Path) -> int:
    """Remove progress bars from an executed notebook (live in JupyterLab, dead weight once saved);
    every other output stays. Returns how many outputs went; the file is replaced atomically."""
    import nbformat

    nb = nbformat.read(str(notebook), as_version=4)
    dropped = 0
    for cell in nb.cells:
        if cell.get("cell_type") == "code":
            kept = [o for o in cell.get("outputs", []) if not _is_progress(o)]
            dropped += len(cell.outputs) - len(kept)
            cell.outputs = kept
    if dropped:
        text = nbformat.writes(nb)
        atomic_write_text(notebook, text if text.endswith("\n") else text + "\n")   # as nbformat.write
    return dropped


def kernel_manager_class():
    """The labs' kernel manager: on Linux and macOS the kernel talks over Unix-domain sockets (IPC) named
    under the temp folder instead of TCP ports. The kernel is always on this machine, and ipykernel 7 prints
    on every TCP start that the traffic is unencrypted, a warning a student cannot act on. Windows has no
    IPC transport: None there, and nbclient's default (TCP)."""
    if os.name != "posix":
        return None
    import tempfile
    import uuid

    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class IPCKernelManager(AsyncKernelManager):
        @default("transport")
        def _default_transport(self):
            return "ipc"

        @default("ip")                  # IPC: the sockets' path prefix (<ip>-<port>), removed at shutdown
        def _default_ip(self):
            return os.path.join(tempfile.gettempdir(), f"quant-lab-kernel-{uuid.uuid4().hex[:12]}")

    return IPCKernelManager


def check_resume(resume_from: Path) -> dict:
    """The run.json of an earlier run folder, or a ChainError saying what --resume needs."""
    manifest_file = Path(resume_from) / RUN_MANIFEST
    if not Path(resume_from).is_dir():
        raise ChainError(f"--resume {resume_from}: no such run folder. Give a folder made by python -m ci.run "
                         f"(they are under {runs_root()}, or the --runs-dir of that run); nothing was run")
    try:
        return json.loads(manifest_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ChainError(f"--resume {resume_from}: no readable {RUN_MANIFEST} in it ({exc}), so it is not a "
                         "run folder of python -m ci.run; give one that is; nothing was run") from exc


def resume_command(profile: dict, run_dir: Path, lab: str, runs_dir: Path | None = None) -> str:
    """The command that resumes run_dir at lab; names the profile's file when it is not a shipped one."""
    cmd = ["python -m ci.run", f"--resume {run_dir}", f"--from {lab}"]
    path = Path(profile.get("_path", ""))
    if path.is_file() and path.resolve().parent != PROFILES_DIR.resolve():
        cmd.insert(1, f"--profile {path}")
    if runs_dir is not None:
        cmd.append(f"--runs-dir {runs_dir}")
    return " ".join(cmd)


def fallback_warning(lab_dir: Path) -> str:
    """fetch.fallback_warning for the results a lab wrote; "" when it wrote none readable."""
    from utils.fetch import fallback_warning as warning_for
    from utils.results import ResultsError, read_results

    try:
        return warning_for(read_results(lab_dir))
    except ResultsError:
        return ""


def run_chain(profile: dict, *, labs: dict[str, Path] | None = None, start_from: str | None = None,
              resume_from: Path | None = None, runs_dir: Path | None = None, log=print) -> Path:
    """Run the chain; return the run folder. Raises ChainError (after writing run.json) on failure."""
    import papermill

    labs = labs if labs is not None else discover_labs()
    order = [lab for lab in labs if lab not in set(profile.get("skip") or [])]
    if start_from is not None and start_from not in order:
        raise ChainError(f"--from {start_from!r} is not a lab of this chain: {order}")
    for lab in profile["labs"] or {}:
        if lab not in labs:
            raise ChainError(f"profile {profile['name']!r} names lab {lab!r}, which has no notebook in labs/")
    check_common_params(profile, labs)

    if resume_from is not None:
        check_resume(resume_from)
    to_run = order[order.index(start_from):] if start_from else order
    reused = order[: len(order) - len(to_run)]      # labs before --from: reused, not recomputed
    for lab in reused:
        if resume_from is None or not (Path(resume_from) / lab / "results.json").is_file():
            raise ChainError(f"--from {start_from} needs complete results of {lab}: pass --resume RUN_DIR "
                             "naming a run that has them; nothing was run")
    try:
        run_dir = new_run_dir(profile["name"], runs_dir)
    except RunsDirError as exc:
        raise ChainError(f"--runs-dir: {exc}") from exc
    manifest = {"schema": "quant-lab/run", "schema_version": 1, "run_id": run_dir.name,
                "profile": profile["name"], "profile_file": profile["_path"], "status": "running",
                "started": _now(), "finished": None, "git_commit": _git_commit(),
                "command": " ".join([Path(sys.executable).name, "-m", "ci.run", *sys.argv[1:]]),
                "resumed_from": str(resume_from) if resume_from else None, "labs": [], "failure": None}

    def save():
        atomic_write_json(run_dir / RUN_MANIFEST, manifest)

    for lab in reused:
        src = Path(resume_from) / lab
        shutil.copytree(src, run_dir / lab)
        manifest["labs"].append({"lab": lab, "status": "reused", "from": str(src)})
    save()

    env_backup = dict(os.environ)
    # ci/kernel_hooks: the kernels' sitecustomize (utils/gpu_cap.py: a profile's GPU memory cap, peaks)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), str(KERNEL_HOOKS),
                                                             os.environ.get("PYTHONPATH")]))
    os.environ.update({k: str(v) for k, v in (profile.get("env") or {}).items()})
    km = kernel_manager_class()
    kernel_kwargs = {"kernel_manager_class": km} if km else {}
    try:
        for lab in to_run:
            notebook = labs[lab]
            entry = {"lab": lab, "status": "running", "notebook": f"{lab}/{notebook.name}"}
            manifest["labs"].append(entry)
            save()
            (run_dir / lab).mkdir(exist_ok=True)
            out_nb = run_dir / lab / notebook.name
            t0 = time.monotonic()
            log(f"[{lab}] running {notebook.relative_to(REPO_ROOT) if notebook.is_relative_to(REPO_ROOT) else notebook}")
            try:
                params = lab_parameters(profile, lab, notebook, run_dir)
                papermill.execute_notebook(str(notebook), str(out_nb), parameters=params,
                                           kernel_name=profile.get("kernel", "python3"),
                                           cwd=str(notebook.parent), progress_bar=False,
                                           execution_timeout=profile.get("cell_timeout_s"), **kernel_kwargs)
                if not (run_dir / lab / "results.json").is_file():
                    raise ChainError("the notebook ran to its end but wrote no results.json")
                strip_progress_bars(out_nb)
            except BaseException as exc:  # noqa: BLE001 - every failure must land in run.json
                rel = notebook.relative_to(REPO_ROOT) if notebook.is_relative_to(REPO_ROOT) else notebook
                failure = {**_failure_from(exc, lab, rel), "executed_notebook": str(out_nb)}
                entry.update(status="failed", seconds=round(time.monotonic() - t0, 1))
                manifest.update(status="failed", finished=_now(), failure=failure)
                save()
                build_report(run_dir)
                first_line = failure["evalue"].splitlines()[0] if failure["evalue"] else ""
                raise ChainError(
                    f"lab {lab} failed: notebook {failure['notebook']}, cell {failure['cell']}: "
                    f"{failure['ename']}: {first_line}\n"
                    f"  executed notebook kept at {out_nb}\n  run folder: {run_dir} (status: failed)\n"
                    f"  fix it, then: {resume_command(profile, run_dir, lab, runs_dir)}") from exc
            entry.update(status="complete", seconds=round(time.monotonic() - t0, 1))
            warning = fallback_warning(run_dir / lab)
            if warning:
                manifest.setdefault("warnings", []).append(f"{lab}: {warning}")
                log(f"[{lab}] WARNING: {warning}")
            save()
            build_report(run_dir)
            log(f"[{lab}] complete in {entry['seconds']} s")
    finally:
        os.environ.clear()
        os.environ.update(env_backup)

    manifest.update(status="complete", finished=_now())
    save()
    build_report(run_dir)
    for warning in manifest.get("warnings", []):
        log(f"WARNING: {warning}")
    return run_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ci.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", help="profile name in ci/profiles/ or a path to a YAML file")
    ap.add_argument("--from", dest="start_from", help="start at this lab (e.g. 03_eval)")
    ap.add_argument("--resume", type=Path, help="an earlier run folder whose labs before --from are reused")
    ap.add_argument("--runs-dir", type=Path, help=f"where run folders go (default {runs_root()})")
    ap.add_argument("--list", action="store_true", help="list profiles and labs, then exit")
    args = ap.parse_args(argv)

    if args.list:
        print("labs:", ", ".join(discover_labs()))
        for p in sorted(PROFILES_DIR.glob("*.yaml")):
            print(f"profile {p.stem}: {(yaml.safe_load(p.read_text()) or {}).get('description', '')}")
        return 0
    try:
        if args.resume:
            earlier = check_resume(args.resume)
            if not args.profile:   # the file the earlier run was made with, else its name in ci/profiles/
                saved = earlier.get("profile_file")
                args.profile = saved if saved and Path(saved).is_file() else earlier.get("profile")
        if not args.profile:
            ap.error("--profile is required (try --list)")
        if args.resume and not args.start_from:
            ap.error("--resume needs --from LAB: the lab to start again from")
        run_dir = run_chain(load_profile(args.profile), start_from=args.start_from,
                            resume_from=args.resume, runs_dir=args.runs_dir)
    except ChainError as exc:
        print(f"ci.run: {exc}", file=sys.stderr)
        return 1
    warnings = json.loads((run_dir / RUN_MANIFEST).read_text()).get("warnings") or []
    note = f" with {len(warnings)} warning(s), printed above and heading the report" if warnings else ""
    print(f"\nrun complete{note}: {run_dir}\nreport: {run_dir / 'report.html'}  (and report.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

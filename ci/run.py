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
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from ci import run_state
from ci.machine import machine_problems
from ci.notebook_output import strip_progress_bars
from ci.profile_schema import ProfileError, lab_params, load_yaml, validate_profile
from ci.run_state import Interrupted
from utils.reporting import build_report
from utils.runs import REPO_ROOT, RUN_MANIFEST, RunsDirError, new_run_dir, runs_root

LABS_DIR = REPO_ROOT / "labs"
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
KERNEL_HOOKS = Path(__file__).resolve().parent / "kernel_hooks"


class ChainError(RuntimeError):
    """A profile or chain problem found before or while running, with what to do about it."""


class NoResults(ChainError):
    """A notebook ran to its end without writing its results.json."""


class RunInterrupted(ChainError):
    """The chain was stopped by a signal; the run is recorded `interrupted`."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


def discover_labs(labs_dir: Path = LABS_DIR) -> dict[str, Path]:
    """{'01_env': labs/01_env/01_env.ipynb, ...} in chain order."""
    found = {}
    for folder in sorted(p for p in labs_dir.iterdir() if p.is_dir() and p.name[:2].isdigit()):
        nb = folder / f"{folder.name}.ipynb"
        if nb.is_file():
            found[folder.name] = nb
    return found


def load_profile(name_or_path: str, labs: dict[str, Path] | None = None) -> dict:
    """A profile by name (ci/profiles/NAME.yaml) or path, checked against its schema: the top level and each
    lab's section against that lab's parameters cell (the labs of labs/ unless given)."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILES_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PROFILES_DIR.glob("*.yaml")))
        raise ChainError(f"profile {name_or_path!r} not found (known: {known})")
    try:
        profile = load_yaml(path)
        validate_profile(profile, labs if labs is not None else discover_labs(), str(path))
    except ProfileError as exc:
        raise ChainError(str(exc)) from exc
    profile["_path"] = str(path.resolve())   # run.json keeps it, so a resume finds the same file
    return profile


def lab_parameters(profile: dict, lab: str, notebook: Path, run_dir: Path) -> dict:
    """Common params the notebook declares + the lab's own section (validate_profile has checked both)."""
    declared = set(lab_params(notebook))
    if "run_dir" not in declared:
        raise ChainError(f"{notebook} declares no run_dir parameter (or papermill could not parse its "
                         "parameters cell: keep it to plain `name = value  # comment` lines)")
    params = {k: v for k, v in (profile.get("params") or {}).items() if k in declared}
    params.update((profile.get("labs") or {}).get(lab) or {})
    params["run_dir"] = str(run_dir)
    if "profile" in declared:
        params["profile"] = profile["name"]
    return params


def check_profile(profile: dict, labs: dict[str, Path]) -> None:
    """The whole profile against its schema (top level + every lab's parameters cell); ChainError if not."""
    try:
        validate_profile(profile, labs)
    except ProfileError as exc:
        raise ChainError(str(exc)) from exc



check_common_params = check_profile     # the name other tests know


def check_machine(profile: dict, to_run: list[str], labs: dict[str, Path]) -> None:
    """ChainError listing the settings this machine cannot honour, each with what to set instead."""
    problems = machine_problems(profile, to_run, labs)
    if problems:
        raise ChainError(f"profile {profile.get('_path', '<profile>')} cannot run on this machine (nothing was "
                         "run):\n" + "\n".join(f"  - {p}" for p in problems))


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def kernel_manager_class():
    """The labs' kernel manager. Every one is remembered (run_state.track), so a run stopped by a signal shuts
    its kernel down. On Linux and macOS the kernel talks over Unix-domain sockets (IPC) named under the temp
    folder instead of TCP ports: the kernel is always on this machine, and ipykernel 7 prints on every TCP start
    that the traffic is unencrypted, a warning a student cannot act on. Windows has no IPC: TCP there."""
    import tempfile
    import uuid

    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class TrackedKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            run_state.track(self)

        async def _async_interrupt_kernel(self):
            # jupyter_client interrupts before every shutdown; a lab that ended has nothing to interrupt, and a
            # SIGINT landing in a message handler prints "ERROR | KeyboardInterrupt caught in kernel" under a
            # run that succeeded. A timed-out cell is still interrupted (nbclient calls this outside a shutdown).
            if not self.shutting_down:
                await super()._async_interrupt_kernel()

    if os.name != "posix":
        return TrackedKernelManager

    class IPCKernelManager(TrackedKernelManager):
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
        manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
        if not isinstance(manifest, dict):
            raise ValueError(f"it holds a JSON {type(manifest).__name__}, not an object")
        return manifest
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
    """Run the chain; return the run folder. Raises ChainError (after recording the run's end in run.json)."""
    import papermill

    labs = labs if labs is not None else discover_labs()
    check_profile(profile, labs)
    order = [lab for lab in labs if lab not in set(profile.get("skip") or [])]
    if start_from is not None and start_from not in order:
        raise ChainError(f"--from {start_from!r} is not a lab of this chain: {order}")
    to_run = order[order.index(start_from):] if start_from else order
    reused = order[: len(order) - len(to_run)]      # labs before --from: reused, not recomputed
    if resume_from is not None:
        earlier = check_resume(resume_from)
        try:
            run_state.check_not_running(Path(resume_from), earlier, build_report, log)
        except ValueError as exc:
            raise ChainError(str(exc)) from exc
        bad = run_state.first_bad_lab(resume_from, reused, {e.get("lab"): e for e in earlier.get("labs") or []})
        bad = bad or next(((lab, why) for lab in reused if (why := run_state.parameters_differ(
            Path(resume_from) / lab, labs[lab], lab_parameters(profile, lab, labs[lab], Path(resume_from))))), None)
        if bad:
            why = bad[1].rstrip(".")
            raise ChainError(f"--resume {resume_from}: {bad[0]} cannot be reused: {why}; nothing was run\n"
                             f"  fix it, then: {resume_command(profile, Path(resume_from), bad[0], runs_dir)}")
    elif reused:
        raise ChainError(f"--from {start_from} needs complete results of {reused[0]}: pass --resume RUN_DIR "
                         "naming a run that has them; nothing was run")
    check_machine(profile, to_run, labs)

    run_dir, now = None, run_state.now
    manifest = {"schema": "quant-lab/run", "schema_version": 1, "run_id": None, "profile": profile["name"],
                "profile_file": profile["_path"], "status": "running", "started": now(), "finished": None,
                "git_commit": _git_commit(), **run_state.owner(),
                "command": " ".join([Path(sys.executable).name, "-m", "ci.run", *sys.argv[1:]]),
                "resumed_from": str(resume_from) if resume_from else None, "labs": [], "failure": None}
    at = {"lab": None, "notebook": None, "out_nb": None, "entry": None, "t0": 0.0}
    env_backup = dict(os.environ)
    with run_state.signals_raise():
        try:
            try:
                run_dir = new_run_dir(profile["name"], runs_dir)
            except RunsDirError as exc:
                raise ChainError(f"--runs-dir: {exc}") from exc
            manifest["run_id"] = run_dir.name
            run_state.save_manifest(run_dir, manifest)
            for lab in reused:
                src = Path(resume_from) / lab
                shutil.copytree(src, run_dir / lab)
                why = run_state.lab_problem(run_dir / lab, lab)
                if why:
                    raise ChainError(f"the copy of {src} does not validate: {why}")
                manifest["labs"].append({"lab": lab, "status": "reused", "from": str(src)})
            run_state.save_manifest(run_dir, manifest)
            # ci/kernel_hooks: the kernels' sitecustomize (utils/gpu_cap.py: a profile's GPU memory cap, peaks)
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), str(KERNEL_HOOKS),
                                                                     os.environ.get("PYTHONPATH")]))
            os.environ.update({k: str(v) for k, v in (profile.get("env") or {}).items()})
            for lab in to_run:
                notebook = labs[lab]
                rel = notebook.relative_to(REPO_ROOT) if notebook.is_relative_to(REPO_ROOT) else notebook
                at.update(lab=lab, notebook=rel, out_nb=run_dir / lab / notebook.name, t0=time.monotonic(),
                          entry={"lab": lab, "status": "running", "notebook": f"{lab}/{notebook.name}"})
                manifest["labs"].append(at["entry"])
                run_state.save_manifest(run_dir, manifest)
                (run_dir / lab).mkdir(exist_ok=True)
                log(f"[{lab}] running {rel}")
                papermill.execute_notebook(str(notebook), str(at["out_nb"]),
                                           parameters=lab_parameters(profile, lab, notebook, run_dir),
                                           kernel_name=profile.get("kernel", "python3"), cwd=str(notebook.parent),
                                           progress_bar=False, execution_timeout=profile.get("cell_timeout_s"),
                                           kernel_manager_class=kernel_manager_class())
                if not (run_dir / lab / "results.json").is_file():
                    raise NoResults("the notebook ran to its end but wrote no results.json")
                strip_progress_bars(at["out_nb"])
                at["entry"].update(status="complete", seconds=round(time.monotonic() - at["t0"], 1))
                at.update(lab=None, notebook=None, out_nb=None, entry=None)
                warning = fallback_warning(run_dir / lab)
                if warning:
                    manifest.setdefault("warnings", []).append(f"{lab}: {warning}")
                    log(f"[{lab}] WARNING: {warning}")
                run_state.save_manifest(run_dir, manifest)
                build_report(run_dir)
                log(f"[{lab}] complete in {manifest['labs'][-1]['seconds']} s")
            manifest.update(status="complete", finished=now())
            run_state.save_manifest(run_dir, manifest)
            build_report(run_dir)
        except BaseException as exc:  # noqa: BLE001 - every way a run can end is recorded in run.json
            if run_dir is None:
                if isinstance(exc, Interrupted):
                    raise RunInterrupted(f"{exc} before the run folder was made; nothing was run", exc.signum) from exc
                raise
            raise _end_run(exc, profile, run_dir, manifest, at, order, runs_dir) from exc
        finally:
            os.environ.clear()
            os.environ.update(env_backup)
    for warning in manifest.get("warnings", []):
        log(f"WARNING: {warning}")
    return run_dir


def _end_run(exc, profile, run_dir, manifest, at, order, runs_dir) -> ChainError:
    """Record how the run ended (interrupted or failed), shut its kernels down, and word what to do next."""
    stopped = run_state.shutdown_kernels() + getattr(exc, "kernels_stopped", 0)
    interrupted = isinstance(exc, (Interrupted, KeyboardInterrupt))
    if isinstance(exc, KeyboardInterrupt):
        exc = Interrupted(2)
    failure = run_state.failure_of(exc, at["lab"], at["notebook"], at["out_nb"], isinstance(exc, NoResults))
    if at["entry"] is not None:
        at["entry"]["seconds"] = round(time.monotonic() - at["t0"], 1)
    if at["lab"] is None and not interrupted:
        failure["reason"] = f"between labs, in the runner: {failure['reason']}"
    status = "interrupted" if interrupted else "failed"
    note = run_state.finish(run_dir, manifest, status, failure, build_report)
    target, why = run_state.resume_target(run_dir, manifest, order, at["lab"])
    cell = f", cell {failure['cell']}" + (f" ({failure['cell_source']!r})" if failure["cell_source"] else "") \
        if failure.get("cell") else (", after its last cell" if isinstance(exc, NoResults) else "")
    if at["lab"]:
        head = (f"lab {at['lab']} {'was interrupted' if interrupted else 'failed'}: notebook {failure['notebook']}"
                f"{cell}: {failure['reason']}")
    else:
        head = f"the run {'was interrupted' if interrupted else 'failed'}: {failure['reason']}"
    kept = failure.get("executed_notebook")
    lines = [head, run_state.hint(exc, profile, run_dir).rstrip("\n")]
    if at["lab"]:
        lines.append(f"  executed notebook kept at {kept}" if kept else
                     "  no executed notebook was written (the kernel never started)")
    if stopped:
        lines.append(f"  {stopped} kernel(s) of this run shut down")
    if note:
        lines.append(f"  note: {note}")
    lines += [why.rstrip("\n"), f"  run folder: {run_dir} (status: {status})",
              f"  {'to go on' if interrupted else 'fix it, then'}: "
              f"{resume_command(profile, run_dir, target, runs_dir)}"]
    message = "\n".join(line for line in lines if line)
    return RunInterrupted(message, exc.signum) if interrupted else ChainError(message)


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
        run_dir = run_chain(load_profile(args.profile), start_from=args.start_from, resume_from=args.resume,
                            runs_dir=args.runs_dir)
    except RunInterrupted as exc:
        print(f"ci.run: {exc}", file=sys.stderr)
        return 128 + exc.signum
    except ChainError as exc:
        print(f"ci.run: {exc}", file=sys.stderr)
        return 1
    warnings = json.loads((run_dir / RUN_MANIFEST).read_text()).get("warnings") or []
    note = f" with {len(warnings)} warning(s), printed above and heading the report" if warnings else ""
    print(f"\nrun complete{note}: {run_dir}\nreport: {run_dir / 'report.html'}  (and report.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

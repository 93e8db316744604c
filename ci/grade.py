"""An instructor's grading round with nbgrader, in one command.

    python -m ci.grade --submissions SUBMISSIONS --out OUT [--labs 01_env,02_models] [--cell-timeout 30]

1. The lab notebooks (labs/NN/NN.ipynb, solutions and hidden tests in) are nbgrader's source; a new
   course folder OUT/course gets them and `nbgrader generate_assignment` writes the student release
   to OUT/course/release/<lab>/<lab>.ipynb (what students get: solutions blank, hidden tests gone).
2. SUBMISSIONS/<student>/<lab>.ipynb (or nbgrader's own <student>/<lab>/<lab>.ipynb) are copied into
   OUT/course/submitted/ and each (student, lab) is autograded by `nbgrader autograde` in its own
   process and kernel, every cell under --cell-timeout, the whole submission under --timeout: a cell
   that hangs is cut and the cells after it still run; a submission that crashes scores what it reached.
3. OUT/grades.csv (one row per student, one column of points per exercise, and the total) and
   OUT/summary.md + summary.json (pass rate per exercise, the most common failure message, time per
   submission).

Only the exercise cells are executed: before autograding, nbgrader's sanitize step (configured in
OUT/course/nbgrader_config.py) drops every code cell that is not an nbgrader cell (KeepGradedCells),
so no model is loaded and no GSM8K is run per student. The exercise sections are written for this:
they need nothing from the rest of the lab.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import nbformat
from nbgrader.preprocessors import NbGraderPreprocessor

REPO_ROOT = Path(__file__).resolve().parents[1]
LABS_DIR = REPO_ROOT / "labs"
COURSE_ID = "quant-lab"

CONFIG = """\
from nbgrader.preprocessors import ClearOutput, DeduplicateIds, OverwriteKernelspec, OverwriteCells, CheckCellMetadata
from ci.grade import KeepGradedCells

c = get_config()  # noqa: F821
c.CourseDirectory.root = {root!r}
c.CourseDirectory.course_id = {course!r}
c.GenerateAssignment.create_assignment = True
c.Autograde.create_student = True
c.Execute.timeout = {cell_timeout}
c.Autograde.sanitize_preprocessors = [ClearOutput, DeduplicateIds, OverwriteKernelspec, OverwriteCells,
                                      KeepGradedCells, CheckCellMetadata]
"""


class GradeError(RuntimeError):
    """A problem with the round's input (submissions folder, labs, output folder), with what to do."""


class KeepGradedCells(NbGraderPreprocessor):
    """Drop every code cell that nbgrader does not grade or lock: the lab's heavy lesson cells."""

    def preprocess(self, nb, resources):
        nb.cells = [c for c in nb.cells if c.cell_type != "code" or "nbgrader" in c.metadata]
        return nb, resources


def graded_labs(labs_dir: Path = LABS_DIR) -> dict[str, Path]:
    """{lab: notebook} for the labs that hold at least one graded cell, in order."""
    found = {}
    for folder in sorted(p for p in labs_dir.iterdir() if p.is_dir() and p.name[:2].isdigit()):
        nb_path = folder / f"{folder.name}.ipynb"
        if nb_path.is_file() and exercise_points(nb_path):
            found[folder.name] = nb_path
    return found


def exercise_points(nb_path: Path) -> dict[str, float]:
    """{exercise: points} of a notebook's autograded test cells; the exercise is the grade id less '_tests'."""
    nb = nbformat.read(nb_path, as_version=4)
    out = {}
    for c in nb.cells:
        meta = c.metadata.get("nbgrader", {})
        if meta.get("grade"):
            out[meta["grade_id"].removesuffix("_tests")] = float(meta["points"])
    return out


def find_submissions(folder: Path, labs: list[str]) -> dict[str, dict[str, Path]]:
    """{student: {lab: notebook}} from <student>/<lab>.ipynb or <student>/<lab>/<lab>.ipynb."""
    if not folder.is_dir():
        raise GradeError(f"--submissions {folder} is not a folder: give a folder of <student>/<lab>.ipynb")
    found = {}
    for student in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        mine = {}
        for lab in labs:
            for cand in (student / f"{lab}.ipynb", student / lab / f"{lab}.ipynb"):
                if cand.is_file():
                    mine[lab] = cand
                    break
        if mine:
            found[student.name] = mine
    if not found:
        raise GradeError(f"no submissions in {folder}: expected <student>/<lab>.ipynb for a lab of {labs}")
    return found


def _path_with_venv() -> str:
    """PATH with this interpreter's bin folder first: nbgrader's gradebook runs the `alembic` script."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def nbgrader(args: list[str], course: Path, timeout: float | None = None) -> subprocess.CompletedProcess:
    """Run one nbgrader command in the course folder, in its own process, with the repo importable."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
               PATH=_path_with_venv(), PYTHONWARNINGS="ignore", TQDM_DISABLE="1")
    return subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env, timeout=timeout,
                          capture_output=True, text=True)


def make_course(out: Path, labs: dict[str, Path], cell_timeout: int) -> Path:
    course = out / "course"
    course.mkdir(parents=True)
    (course / "nbgrader_config.py").write_text(CONFIG.format(root=str(course), course=COURSE_ID,
                                                             cell_timeout=cell_timeout))
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    os.environ["PATH"] = _path_with_venv()
    api = NbGraderAPI(coursedir=CourseDirectory(root=str(course), course_id=COURSE_ID))
    for lab, nb_path in labs.items():      # generate_assignment runs no student code: in this process
        (course / "source" / lab).mkdir(parents=True)
        shutil.copy2(nb_path, course / "source" / lab / nb_path.name)
        r = api.generate_assignment(lab, force=True, create=True)
        if not r["success"] or not (course / "release" / lab / nb_path.name).is_file():
            raise GradeError(f"nbgrader generate_assignment {lab} failed:\n{r.get('error', '')}{r.get('log', '')[-4000:]}")
    return course


def failure_message(nb_path: Path) -> dict[str, str]:
    """{exercise: the first error line of its test cell} in an autograded notebook."""
    if not nb_path.is_file():
        return {}
    nb = nbformat.read(nb_path, as_version=4)
    out = {}
    for c in nb.cells:
        meta = c.metadata.get("nbgrader", {})
        if not meta.get("grade") or c.cell_type != "code":
            continue
        for o in c.get("outputs", []):
            if o.output_type == "error":
                out[meta["grade_id"].removesuffix("_tests")] = f"{o.ename}: {o.evalue}".strip()
                break
            if o.output_type == "stream" and o.name == "stderr":
                out[meta["grade_id"].removesuffix("_tests")] = "wrote to stderr: " + o.text.strip()[:200]
                break
    return out


def read_scores(course: Path, lab: str, student: str) -> dict[str, float]:
    """{exercise: points} from the gradebook; empty if the submission was never graded."""
    from nbgrader.api import Gradebook, MissingEntry

    os.environ["PATH"] = _path_with_venv()
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        try:
            nb = gb.find_submission_notebook(lab, lab, student)
        except MissingEntry:
            return {}
        return {g.name.removesuffix("_tests"): float(g.score) for g in nb.grades if g.auto_score is not None
                or g.manual_score is not None}


def autograde(course: Path, lab: str, student: str, nb, timeout: float):
    """nbgrader autograde of one notebook in its own process: (status, detail, {exercise: points}, {exercise: failure})."""
    dest = course / "submitted" / student / lab
    dest.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest / f"{lab}.ipynb")
    try:
        r = nbgrader(["autograde", lab, "--student", student, "--force"], course, timeout=timeout)
        status = "graded" if r.returncode == 0 else f"nbgrader failed (exit {r.returncode})"
        lines = (r.stderr or r.stdout).strip().splitlines()
        named = [ln.strip() for ln in lines if "DeadKernelError" in ln or "Kernel died" in ln]
        detail = "" if r.returncode == 0 else (named or lines[-1:] or [""])[-1][:300]
    except subprocess.TimeoutExpired:
        status, detail = f"cut at the {timeout:.0f} s limit", ""
    scores = read_scores(course, lab, student) if status == "graded" else {}
    return status, detail, scores, failure_message(course / "autograded" / student / lab / f"{lab}.ipynb")


def grade_each_alone(course: Path, lab: str, student: str, nb_path: Path, exercises: list[str], timeout: float):
    """Score what a submission reached when its kernel died: grade each exercise with every other one's
    solution cell blanked, so one exercise that kills the kernel costs only its own points. The
    exercises share nothing but the setup cell, so each alone scores as it would in the whole."""
    scores, msgs = {}, {}
    for ex in exercises:
        nb = nbformat.read(nb_path, as_version=4)
        for c in nb.cells:
            meta = c.metadata.get("nbgrader", {})
            if meta.get("solution") and meta.get("grade_id") != ex:
                c.source = "raise NotImplementedError()"
        status, _, got, why = autograde(course, lab, student, nb, timeout)
        scores[ex] = got.get(ex, 0.0)
        msgs[ex] = why.get(ex) or (status if status != "graded" else "")
    return scores, {k: v for k, v in msgs.items() if v}


def choose_labs(out: Path, labs: list[str] | None) -> dict[str, Path]:
    """The labs to release or grade (all with exercises by default), after checking --out is new."""
    if out.exists() and any(out.iterdir()):
        raise GradeError(f"--out {out} exists and is not empty: give a new folder (earlier rounds are kept)")
    all_labs = graded_labs()
    unknown = sorted(set(labs or []) - set(all_labs))
    if unknown:
        raise GradeError(f"--labs {unknown}: not a lab with exercises (known: {sorted(all_labs)})")
    return {k: v for k, v in all_labs.items() if not labs or k in labs}


def make_release(out: Path, labs: list[str] | None = None, cell_timeout: int = 30) -> Path:
    """Only the student release, to hand out before a round: OUT/course/release/<lab>/<lab>.ipynb."""
    return make_course(out, choose_labs(out, labs), cell_timeout) / "release"


def grade_round(submissions: Path, out: Path, labs: list[str] | None = None, cell_timeout: int = 30,
                timeout: float = 300) -> dict:
    chosen = choose_labs(out, labs)
    subs = find_submissions(submissions, list(chosen))
    t0 = time.perf_counter()
    course = make_course(out, chosen, cell_timeout)
    release_s = time.perf_counter() - t0
    points = {lab: exercise_points(nb) for lab, nb in chosen.items()}
    columns = [f"{lab}/{ex}" for lab in chosen for ex in points[lab]]
    rows, runs, failures = [], [], {col: Counter() for col in columns}
    for student, mine in subs.items():
        row = {"student": student}
        for lab, nb_path in mine.items():
            t = time.perf_counter()
            status, detail, scores, msgs = autograde(course, lab, student, nbformat.read(nb_path, as_version=4),
                                                     timeout)
            if status != "graded":          # the kernel died (or it ran out of time): each exercise alone
                scores, msgs = grade_each_alone(course, lab, student, nb_path, list(points[lab]), timeout)
                status += "; each exercise then graded alone"
            seconds = time.perf_counter() - t
            for ex, full in points[lab].items():
                col = f"{lab}/{ex}"
                row[col] = scores.get(ex, 0.0)
                if row[col] < full:
                    failures[col][msgs.get(ex) or status] += 1
            runs.append({"student": student, "lab": lab, "status": status, "seconds": round(seconds, 1),
                         **({"detail": detail} if detail else {})})
        row["total"] = sum(row.get(c, 0.0) for c in columns)
        rows.append(row)
    with open(out / "grades.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["student", *columns, "total"], restval=0.0)
        w.writeheader()
        w.writerows(rows)
    n = len(rows)
    per_ex = {col: {"points": points[col.split("/")[0]][col.split("/")[1]],
                    "pass_rate": sum(r.get(col, 0.0) >= points[col.split("/")[0]][col.split("/")[1]] for r in rows) / n,
                    "most_common_failure": (failures[col].most_common(1)[0] if failures[col] else None)}
              for col in columns}
    summary = {"students": n, "labs": list(chosen), "release_seconds": round(release_s, 1),
               "grading_seconds": round(sum(r["seconds"] for r in runs), 1), "submissions": runs, "exercises": per_ex,
               "release": str(course / "release"), "grades_csv": str(out / "grades.csv")}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.md").write_text(summary_markdown(summary))
    return summary


def summary_markdown(s: dict) -> str:
    lines = [f"# Grading round: {s['students']} students, labs {', '.join(s['labs'])}", "",
             f"Release generated in {s['release_seconds']} s ({s['release']}); grading took {s['grading_seconds']} s; "
             f"points in {s['grades_csv']}.", "", "| exercise | points | pass rate | most common failure |",
             "|---|---|---|---|"]
    for col, e in s["exercises"].items():
        fail = f"{e['most_common_failure'][0]} ({e['most_common_failure'][1]}x)" if e["most_common_failure"] else ""
        lines.append(f"| {col} | {e['points']:g} | {100 * e['pass_rate']:.0f} % | {fail.replace('|', '/')} |")
    lines += ["", "| student | lab | status | seconds |", "|---|---|---|---|"]
    lines += [f"| {r['student']} | {r['lab']} | {r['status']} | {r['seconds']} |" for r in s["submissions"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--submissions", type=Path, help="folder of <student>/<lab>.ipynb")
    ap.add_argument("--release-only", action="store_true", help="only make the student release (OUT/course/release)")
    ap.add_argument("--out", required=True, type=Path, help="a new folder for the course, grades.csv and summary")
    ap.add_argument("--labs", default="", help="comma-separated labs to grade (default: every lab with exercises)")
    ap.add_argument("--cell-timeout", type=int, default=30, help="seconds any one cell may run (nbgrader's)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds one submission of one lab may take")
    a = ap.parse_args(argv)
    labs = [x for x in a.labs.split(",") if x] or None
    try:
        if a.release_only:
            print(f"student release: {make_release(a.out, labs, a.cell_timeout)}")
            return 0
        if a.submissions is None:
            raise GradeError("--submissions is required (or --release-only to make the release alone)")
        s = grade_round(a.submissions, a.out, labs, a.cell_timeout, a.timeout)
    except GradeError as e:
        print(f"ci.grade: {e}", file=sys.stderr)
        return 2
    print(summary_markdown(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""An instructor's grading round, in one command; also the students' release.

    python -m ci.grade --release-only --out DIR                      # what students open and hand in
    python -m ci.grade --submissions SUBMISSIONS --out OUT [--labs 01_env,02_models] [--sandbox auto]

1. The lab notebooks (labs/NN/NN.ipynb, solutions and hidden tests in) are nbgrader's source; a new
   course folder OUT/course gets them and `nbgrader generate_assignment` writes the student release to
   OUT/course/release/<lab>/<lab>.ipynb (solutions blank, hidden tests gone) and the gradebook's tables.
2. Every entry of SUBMISSIONS gets a row in OUT/grades.csv: a student's folder is graded, anything else
   says why not. In a student's folder, each notebook is graded as the lab whose exercises it holds
   (found from its cells), whatever its name; a notebook with no exercise cells counts by its name
   (<lab>.ipynb); when two hold the same lab, the one named <lab>.ipynb is graded and the other noted.
3. Each (student, lab) runs in its own sandbox (ci/sandbox.py) on a throw-away copy: the lab's exercise
   setup cell, the student's solution and added cells, the course's check cells, every cell under
   --cell-timeout, the whole under --timeout. The points are computed here, outside it (ci/grade_key.py):
   what the student's functions returned against the expected values, hidden cases included.
4. This process alone then writes the gradebook (OUT/course/gradebook.db), the hand-back notebooks
   (OUT/course/autograded/<student>/<lab>/<lab>.ipynb), OUT/grades.csv and OUT/summary.md + .json,
   all from the same scores.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from ci import grade_key, grade_report, sandbox

REPO_ROOT = Path(__file__).resolve().parents[1]
LABS_DIR = REPO_ROOT / "labs"
COURSE_ID = "quant-lab"
INSTRUCTOR_MARK = "> **Instructor's copy"     # a markdown line the release leaves out
MAX_NOTEBOOK = 20 * 2**20
MAX_STUDENT_BYTES = 5 * MAX_NOTEBOOK   # notebooks read per student folder: each is parsed here, before any time limit
MAX_ENTRIES = 200              # entries of a student's folder looked at (each may add a note to the row)
MAX_EXECUTED = 32 * 2**20      # the notebook the sandbox writes back: the student's plus capped outputs

CONFIG = """\
c = get_config()  # noqa: F821
c.CourseDirectory.root = {root!r}
c.CourseDirectory.course_id = {course!r}
c.GenerateAssignment.create_assignment = True
"""


class GradeError(RuntimeError):
    """A problem with the round's input (submissions folder, labs, output folder), with what to do."""


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
    out = {}
    for c in nbformat.read(nb_path, as_version=4).cells:
        meta = c.metadata.get("nbgrader", {})
        if meta.get("grade"):
            out[meta["grade_id"].removesuffix("_tests")] = float(meta["points"])
    return out


def make_course(out: Path, labs: dict[str, Path]) -> Path:
    """OUT/course with nbgrader's release of each lab (this process: generate_assignment runs no student code)."""
    course = out / "course"
    course.mkdir(parents=True)
    (course / "nbgrader_config.py").write_text(CONFIG.format(root=str(course), course=COURSE_ID))
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    api = NbGraderAPI(coursedir=CourseDirectory(root=str(course), course_id=COURSE_ID))
    for lab, nb_path in labs.items():
        (course / "source" / lab).mkdir(parents=True)
        shutil.copy2(nb_path, course / "source" / lab / nb_path.name)
        r = api.generate_assignment(lab, force=True, create=True)
        released = course / "release" / lab / nb_path.name
        if not r["success"] or not released.is_file():
            raise GradeError(f"nbgrader generate_assignment {lab} failed:\n{r.get('error', '')}{r.get('log', '')[-4000:]}")
        nb = nbformat.read(released, as_version=4)
        for c in nb.cells:
            if c.cell_type == "markdown" and INSTRUCTOR_MARK in c.source:
                c.source = "\n".join(ln for ln in c.source.split("\n") if not ln.startswith(INSTRUCTOR_MARK)).strip("\n")
        nbformat.write(nb, released)
    return course


def choose_labs(out: Path, labs: list[str] | None) -> dict[str, Path]:
    """The labs to release or grade (all with exercises by default), after checking --out is new."""
    if out.exists() and any(out.iterdir()):
        raise GradeError(f"--out {out} exists and is not empty: give a new folder (earlier rounds are kept)")
    all_labs = graded_labs()
    unknown = sorted(set(labs or []) - set(all_labs))
    if unknown:
        raise GradeError(f"--labs {unknown}: not a lab with exercises (known: {sorted(all_labs)})")
    return {k: v for k, v in all_labs.items() if not labs or k in labs}


def make_release(out: Path, labs: list[str] | None = None) -> Path:
    """Only the student release: OUT/course/release/<lab>/<lab>.ipynb, what students open and hand in."""
    return make_course(out, choose_labs(out, labs)) / "release"


def lab_ids(labs: dict[str, Path]) -> dict[str, set[str]]:
    return {lab: {c.metadata["nbgrader"]["grade_id"] for c in nbformat.read(p, as_version=4).cells
                  if "grade_id" in c.metadata.get("nbgrader", {})} for lab, p in labs.items()}


def _lab_of(nb, ids: dict[str, set[str]]) -> str | None:
    mine = {c.metadata["nbgrader"].get("grade_id") for c in nb.cells if isinstance(c.metadata.get("nbgrader"), dict)}
    best = max(ids, key=lambda lab: len(ids[lab] & mine))
    return best if ids[best] & mine else None


def _files(folder: Path, depth: int = 0):
    for p in sorted(folder.iterdir()):
        if p.is_dir() and not p.is_symlink() and depth < 3:
            yield from _files(p, depth + 1)
        else:
            yield p


def survey(folder: Path, chosen: list[str]):
    """({student: {lab: (path, notebook)}}, {student: [notes]}, [(entry, reason)]): every entry accounted for."""
    if not folder.is_dir():
        raise GradeError(f"--submissions {folder} is not a folder: give a folder of <student>/<lab>.ipynb")
    ids = lab_ids(graded_labs())
    students, notes, stray = {}, {}, []
    for entry in sorted(folder.iterdir()):
        name = entry.name
        if entry.is_symlink():
            stray.append((name, "a link, not followed: copy the student's folder itself"))
        elif not entry.is_dir():
            stray.append((name, "a file, not a student's folder: expected <student>/<lab>.ipynb"))
        elif name.startswith("."):
            stray.append((name, "a hidden folder, not a student's: not graded"))
        else:
            students[name], notes[name] = _survey_student(entry, chosen, ids)
    if not students and not stray:
        raise GradeError(f"no submissions in {folder}: expected <student>/<lab>.ipynb for a lab of {chosen}")
    return students, notes, stray


def _survey_student(folder: Path, chosen: list[str], ids: dict[str, set[str]]):
    notes, cands = [], {}
    if folder.name.startswith("-") or folder.name != folder.name.strip():
        notes.append(f"the name {folder.name!r} would be read as an option by nbgrader's command line: graded "
                     f"under this name (with nbgrader itself, write --student={folder.name})")
    files, budget = [], MAX_STUDENT_BYTES
    for f in _files(folder):
        if len(files) == MAX_ENTRIES:
            notes.append(f"not looked at: more than {MAX_ENTRIES} entries in the folder")
            break
        files.append(f)
    if not files:
        notes.append("empty folder: nothing submitted")
    # the notebooks named for a lab are read first: a hoard of copies cannot crowd them out
    files.sort(key=lambda f: (f.suffix != ".ipynb" or f.stem not in ids, str(f)))
    for f in files:
        rel = f.relative_to(folder).as_posix()
        if f.is_symlink():
            notes.append(f"{rel}: a link, not followed")
            continue
        if f.is_dir():
            notes.append(f"{rel}: a folder nested too deep, not looked into")
            continue
        if ".ipynb_checkpoints" in f.parts:
            notes.append(f"{rel}: JupyterLab's checkpoint copy, not graded")
            continue
        if f.suffix != ".ipynb":
            notes.append(f"{rel}: not a notebook, not graded")
            continue
        try:
            size = f.stat().st_size
            if size > MAX_NOTEBOOK:
                raise ValueError(f"larger than {MAX_NOTEBOOK >> 20} MiB")
            if size > budget:
                notes.append(f"{rel}: not read: the folder's notebooks pass {MAX_STUDENT_BYTES / 2**20:g} MiB")
                continue
            budget -= size
            nb = nbformat.read(f, as_version=4)
            lab = _lab_of(nb, ids) or (f.stem if f.stem in ids else None)
        except Exception as e:  # noqa: BLE001 - any unreadable file is a row note, never an abort
            notes.append(f"{rel}: not a notebook (cannot be read as one: {type(e).__name__}: {str(e)[:120]})")
            continue
        if lab is None:
            notes.append(f"{rel}: holds no lab's exercise cells and is not named <lab>.ipynb: not graded")
        elif lab not in chosen:
            notes.append(f"{rel}: Lab {lab}, not graded in this round (labs {', '.join(chosen)})")
        else:
            cands.setdefault(lab, []).append((rel, f, nb))
    picked = {}
    for lab, cs in cands.items():
        cs.sort(key=lambda c: (Path(c[0]).stem != lab, c[0].count("/"), c[0]))
        rel, f, nb = cs[0]
        picked[lab] = (f, nb)
        if Path(rel).stem != lab:
            notes.append(f"{rel}: holds Lab {lab}'s exercises, graded as {lab}")
        notes += [f"{r}: another copy of Lab {lab}; {rel} was graded" for r, _, _ in cs[1:]]
    notes += [f"{lab}: not submitted" for lab in chosen if lab not in picked and files]
    return picked, notes


def grade_one(course: Path, lab: str, student: str, nb, key: dict, mode: str, cell_timeout: int,
              timeout: float) -> dict:
    """Run one submission in the sandbox and score it here; the gradebook and hand-back get the same result."""
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="quantlab-grade-"))
    back = None
    try:
        release = nbformat.read(course / "release" / lab / f"{lab}.ipynb", as_version=4)
        ran, notes = grade_key.cells_to_run(nb, release, key)
        back = ran
        work = tmp / "work"
        work.mkdir()
        nbformat.write(ran, work / "run.ipynb")
        (work / "plan.json").write_text(json.dumps({"cell_timeout": cell_timeout,
                                                    "exercises": {ex: e.function for ex, e in key.items()}}))
        refs = {t for e in key.values() if (t := e.reference_target())}
        code = sandbox.prepare(work, refs)
        before = {"nb": (None, "was not taken")}

        def before_cases():   # the hand-back's copy: taken before any case enters the sandbox
            before["nb"] = executed_notebook(work)

        outcome = sandbox.run(mode, work, code, grade_key.inputs_for(key), timeout, before_cases)
        final, why_final = executed_notebook(work)
        mine, why_back = before["nb"] if outcome.inputs_sent else (final, why_final)
        back, done = mine or ran, final or ran
        for why in dict.fromkeys((why_back, why_final)):
            if why not in ("", "is missing", "was not taken"):
                notes.append(f"its executed notebook {why}" + ("" if mine else ": handed back without outputs"))
        status, why_cell = _status(done, outcome, cell_timeout, timeout)
        exs = {}
        for ex, e in key.items():
            pts, why = grade_key.score(e, work / "out" / "answers" / f"{ex}.json", why_cell.get(("harvest", ex), "")
                                       or (status if outcome.cut or outcome.returncode else ""), within=work)
            if pts < e.points and why_cell.get(("solution", ex)):
                why = why_cell[("solution", ex)]
            exs[ex] = (pts, e.points, why)
        for ex, why in grade_key.copied_references(ran, key).items():
            exs[ex] = (0.0, key[ex].points, why)
        result = {"student": student, "lab": lab, "status": status, "exercises": exs, "notes": notes}
    except Exception as e:  # noqa: BLE001 - one submission's failure is its row, never the round's
        result = {"student": student, "lab": lab, "status": f"grader error: {type(e).__name__}: {e}",
                  "exercises": {ex: (0.0, k.points, "not graded: grader error") for ex, k in key.items()}, "notes": []}
    result_total(result, t0)
    try:
        grade_report.write_gradebook(course, lab, student, {ex: v[0] for ex, v in result["exercises"].items()})
        grade_report.hand_back(back or nbformat.v4.new_notebook(), course, lab, student, result)
    except Exception as e:  # noqa: BLE001 - said in the row: the instructor must look at this one
        result["status"] += f"; its gradebook entry or hand-back could not be written: {type(e).__name__}: {e}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def executed_notebook(work: Path):
    """(the notebook the sandbox wrote, '') or (None, why not): read only as a plain file of its folder."""
    data, why = sandbox.read_back(work, "out/executed.ipynb", MAX_EXECUTED)
    if data is None:
        return None, why
    try:
        return nbformat.reads(data.decode(), as_version=4), ""
    except Exception as e:  # noqa: BLE001 - the sandbox's files are the student's to spoil
        return None, f"is not a notebook ({type(e).__name__})"


def result_total(result: dict, t0: float) -> None:
    result["total"] = sum(v[0] for v in result["exercises"].values())
    result["out_of"] = sum(v[1] for v in result["exercises"].values())
    result["seconds"] = round(time.perf_counter() - t0, 1)


def _status(done, outcome, cell_timeout: int, timeout: float):
    """The submission's status and, per (role, exercise), what cut or killed it."""
    why, deaths, cuts = {}, 0, 0
    sol_ex = None
    for c in done.cells:
        q = c.metadata.get("quantlab", {})
        if q.get("role") == "solution":
            sol_ex = c.metadata.get("nbgrader", {}).get("grade_id")
        errs = {o.get("ename") for o in c.get("outputs", []) if o.get("output_type") == "error"}
        kind = "died" if "KernelDied" in errs else "cut" if "CellTimeout" in errs else None
        if not kind:
            continue
        deaths, cuts = deaths + (kind == "died"), cuts + (kind == "cut")
        what = (f"cut at the {cell_timeout} s cell limit" if kind == "cut"
                else "the kernel died (a crash such as os._exit)")
        if q.get("role") == "harvest":
            why[("harvest", q.get("exercise"))] = f"{what} while its function ran on the cases"
        elif q.get("role") == "solution" and sol_ex:
            why[("solution", sol_ex)] = f"{what} in its solution cell"
    if outcome.cut:
        status = f"cut at the {timeout:g} s submission limit"
    elif outcome.limit:
        status = outcome.limit
    elif outcome.returncode and outcome.inputs_sent:   # what it printed then may be the hidden cases
        status = f"the sandbox failed (exit {outcome.returncode}) while its functions ran on the cases"
    elif outcome.returncode:
        status = f"the sandbox failed (exit {outcome.returncode}): {outcome.log.strip().splitlines()[-1:] or ''}"
    else:
        status = "graded"
    extra = [f"kernel died {deaths}x" if deaths else "", f"{cuts} cell(s) cut at {cell_timeout} s" if cuts else ""]
    extra = [x for x in extra if x]
    return status + (f" ({'; '.join(extra)}; each cost only its exercise)" if extra else ""), why


def grade_round(submissions: Path, out: Path, labs: list[str] | None = None, cell_timeout: int = 30,
                timeout: float = 300, sandbox_mode: str = "auto") -> dict:
    mode = sandbox.choose(sandbox_mode)
    chosen = choose_labs(out, labs)
    students, notes, stray = survey(submissions, list(chosen))
    t0 = time.perf_counter()
    course = make_course(out, chosen)
    keys = {lab: grade_key.answer_key(lab, p) for lab, p in chosen.items()}
    release_s = time.perf_counter() - t0
    columns = [f"{lab}/{ex}" for lab in chosen for ex in keys[lab]]
    rows, results = [], []
    for student, mine in students.items():
        row = {"student": student, "_student": True}
        for lab, (_, nb) in mine.items():
            r = grade_one(course, lab, student, nb, keys[lab], mode, cell_timeout, timeout)
            results.append(r)
            row.update({f"{lab}/{ex}": v[0] for ex, v in r["exercises"].items()})
            notes[student] += [f"{lab}: {n}" for n in r["notes"]]
            if r["status"] != "graded":
                notes[student].append(f"{lab}: {r['status']}")
        row["total"] = sum(v for k, v in row.items() if k in columns)
        row["notes"] = "; ".join(notes[student])
        rows.append(row)
    rows += [{"student": name, "notes": reason} for name, reason in stray]
    grade_report.write_csv(out / "grades.csv", columns, [{k: v for k, v in r.items() if k != "_student"} for r in rows])
    summary = grade_report.summarize({lab: {ex: e.points for ex, e in keys[lab].items()} for lab in chosen}, results,
                                     rows, sandbox.describe(mode), release_s)
    grade_report.write_summary(out, summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--submissions", type=Path, help="folder of <student>/<lab>.ipynb")
    ap.add_argument("--release-only", action="store_true", help="only make the student release (OUT/course/release)")
    ap.add_argument("--out", required=True, type=Path, help="a new folder for the course, grades.csv and summary")
    ap.add_argument("--labs", default="", help="comma-separated labs to grade (default: every lab with exercises)")
    ap.add_argument("--cell-timeout", type=int, default=30, help="seconds any one cell may run")
    ap.add_argument("--timeout", type=float, default=300, help="seconds one submission of one lab may take")
    ap.add_argument("--sandbox", default="auto", choices=sandbox.MODES,
                    help="auto: bubblewrap where it works, else refuse; none: no sandbox (only when named)")
    a = ap.parse_args(argv)
    labs = [x for x in a.labs.split(",") if x] or None
    try:
        if a.release_only:
            print(f"student release: {make_release(a.out, labs)}")
            return 0
        if a.submissions is None:
            raise GradeError("--submissions is required (or --release-only to make the release alone)")
        s = grade_round(a.submissions, a.out, labs, a.cell_timeout, a.timeout, a.sandbox)
    except (GradeError, sandbox.SandboxError) as e:
        print(f"ci.grade: {e}", file=sys.stderr)
        return 2
    print(grade_report.summary_markdown(s, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A round's one record, written only by the grader's process from the same scores: nbgrader's gradebook,
the hand-back notebooks (OUT/course/autograded/<student>/<lab>/<lab>.ipynb), grades.csv and the summary.
"""
from __future__ import annotations

import copy
import csv
import json
import os
import sys
from collections import Counter
from pathlib import Path

import nbformat


def _path_with_venv() -> None:
    """nbgrader's gradebook runs the `alembic` script: this interpreter's bin folder goes first on PATH."""
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def write_gradebook(course: Path, lab: str, student: str, scores: dict[str, float]) -> None:
    """The student's autograde scores for one lab, one Grade per check cell (nbgrader's own tables)."""
    from nbgrader.api import Gradebook, MissingEntry

    _path_with_venv()
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        gb.update_or_create_student(student)
        try:
            gb.find_submission(lab, student)
        except MissingEntry:
            gb.add_submission(lab, student)
        for ex, pts in scores.items():
            g = gb.find_grade(f"{ex}_tests", lab, lab, student)
            g.auto_score = pts
        gb.db.commit()


def read_gradebook(course: Path, lab: str, student: str) -> dict[str, float]:
    """{exercise: points} as the gradebook has them; empty when the student has no such submission."""
    from nbgrader.api import Gradebook, MissingEntry

    _path_with_venv()
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        try:
            nb = gb.find_submission_notebook(lab, lab, student)
        except MissingEntry:
            return {}
        return {g.name.removesuffix("_tests"): float(g.score) for g in nb.grades}


def hand_back(ran, course: Path, lab: str, student: str, result: dict) -> Path:
    """The notebook the student gets back: the cells that ran, the student's own code with their outputs,
    a first cell with the score, and under each check cell its points and why. The cells that ran the
    cases are left out (their inputs include the hidden cases)."""
    nb = copy.deepcopy(ran)
    nb.cells = [c for c in nb.cells if c.metadata.get("quantlab", {}).get("role") != "harvest"]
    lines = [f"# {lab}: graded copy of {student}'s notebook", "",
             f"**{result['total']:g} of {result['out_of']:g} points.** Status: {result['status']}.", "",
             "| exercise | points | why not full |", "|---|---|---|"]
    for ex, (pts, full, why) in result["exercises"].items():
        lines.append(f"| {ex} | {pts:g} / {full:g} | {why.replace('|', '/')} |")
    lines += ["", *[f"- {n}" for n in result["notes"]]]
    nb.cells.insert(0, nbformat.v4.new_markdown_cell("\n".join(lines).rstrip() + "\n"))
    for c in nb.cells:
        gid = c.metadata.get("nbgrader", {}).get("grade_id", "")
        ex = gid.removesuffix("_tests")
        if c.metadata.get("nbgrader", {}).get("grade") and ex in result["exercises"]:
            pts, full, why = result["exercises"][ex]
            text = f"graded: {pts:g} of {full:g} point{'s' if full != 1 else ''}" + (f" ({why})" if why else "") + "\n"
            c.outputs.append(nbformat.v4.new_output("stream", name="stdout", text=text))
            c.metadata["quantlab"] = {"role": "check", "points": pts, "out_of": full}
    dest = course / "autograded" / student / lab / f"{lab}.ipynb"
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest)
    return dest


def write_csv(path: Path, columns: list[str], rows: list[dict]) -> None:
    """grades.csv. The notes quote the students' file names: one starting with = + - @ would be a formula
    in a spreadsheet, so such a note starts with ' (as spreadsheets write text)."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, ["student", *columns, "total", "notes"], restval="")
        w.writeheader()
        w.writerows([{**r, "notes": "'" + r["notes"]} if str(r.get("notes", ""))[:1] in tuple("=+-@\t\r") else r
                     for r in rows])
    os.replace(tmp, path)


def summarize(points: dict[str, dict[str, float]], results: list[dict], rows: list[dict], sandbox: str,
              release_s: float) -> dict:
    """Pass rate per exercise over the students who submitted that lab; the most common reason it failed."""
    per_ex = {}
    for lab, exs in points.items():
        mine = [r for r in results if r["lab"] == lab]
        for ex, full in exs.items():
            got = [r["exercises"][ex] for r in mine]
            fails = Counter(why or "wrong" for pts, _, why in got if pts < full)
            per_ex[f"{lab}/{ex}"] = {"points": full, "submitted": len(got),
                                     "pass_rate": (sum(p >= full for p, _, _ in got) / len(got)) if got else None,
                                     "most_common_failure": list(fails.most_common(1)[0]) if fails else None}
    return {"sandbox": sandbox, "students": sum(1 for r in rows if r.get("_student")),
            "labs": list(points), "release_seconds": round(release_s, 1),
            "grading_seconds": round(sum(r["seconds"] for r in results), 1),
            "submissions": [{k: r[k] for k in ("student", "lab", "status", "seconds", "total", "out_of")}
                            for r in results],
            "exercises": per_ex,
            "rows_without_a_grade": [{"entry": r["student"], "reason": r["notes"]} for r in rows if not r.get("_student")]}


def summary_markdown(s: dict, out: Path) -> str:
    warn = [] if s["sandbox"].startswith("bwrap") else [f"**Sandbox: {s['sandbox']}.**", ""]
    lines = [f"# Grading round: {s['students']} students, labs {', '.join(s['labs'])}", "", *warn,
             f"Sandbox: {s['sandbox']}.", "",
             f"Release generated in {s['release_seconds']} s; grading took {s['grading_seconds']} s; "
             f"points in {out / 'grades.csv'}, hand-back notebooks in {out / 'course' / 'autograded'}.", "",
             "| exercise | points | submitted | pass rate | most common failure |", "|---|---|---|---|---|"]
    for col, e in s["exercises"].items():
        fail = f"{e['most_common_failure'][0]} ({e['most_common_failure'][1]}x)" if e["most_common_failure"] else ""
        rate = "" if e["pass_rate"] is None else f"{100 * e['pass_rate']:.0f} %"
        lines.append(f"| {col} | {e['points']:g} | {e['submitted']} | {rate} | {fail.replace('|', '/')} |")
    lines += ["", "| student | lab | points | status | seconds |", "|---|---|---|---|---|"]
    lines += [f"| {r['student']} | {r['lab']} | {r['total']:g} / {r['out_of']:g} | {r['status']} | {r['seconds']} |"
              for r in s["submissions"]]
    if s["rows_without_a_grade"]:
        lines += ["", "Entries that are not a student's folder (a row each in grades.csv):", ""]
        lines += [f"- `{r['entry']}`: {r['reason']}" for r in s["rows_without_a_grade"]]
    return "\n".join(lines) + "\n"


def write_summary(out: Path, summary: dict) -> None:
    for name, text in (("summary.json", json.dumps(summary, indent=2)), ("summary.md", summary_markdown(summary, out))):
        tmp = out / (name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, out / name)

"""Submissions as students (and attackers) write them, for the grading tests: edits of Lab 01's notebook."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
import uuid
from pathlib import Path

import nbformat

from ci import grade, grade_report, sandbox
from tests.conftest import ROOT

SANDBOX = "bwrap" if sandbox.bwrap_path() else "none"    # the strongest this machine has


def lab01():
    return nbformat.read(grade.graded_labs()["01_env"], as_version=4)


def set_solution(nb, grade_id: str, source: str):
    next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id).source = source
    return nb


def add_helper(nb, source: str, after: str = "setup_01"):
    """A code cell the student added (no nbgrader metadata, a new id), after the cell `after`."""
    i = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == after)
    cell = nbformat.v4.new_code_cell(source)
    cell.id = uuid.uuid4().hex[:8]
    nb.cells.insert(i + 1, cell)
    return nb


def save(nb, folder: Path, student: str, name: str = "01_env.ipynb") -> Path:
    (folder / student).mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / student / name)
    return folder / student / name


def run_round(subs: Path, out: Path, *extra: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "ci.grade", "--submissions", str(subs), "--out", str(out), *extra],
                       cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(out / "grades.csv") as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    return {"rows": rows, "summary": json.loads((out / "summary.json").read_text()), "out": out, "stdout": r.stdout}


def handback(out: Path, student: str, lab: str = "01_env"):
    return nbformat.read(out / "course" / "autograded" / student / lab / f"{lab}.ipynb", as_version=4)


def handback_points(nb) -> dict[str, float]:
    return {c.metadata["nbgrader"]["grade_id"].removesuffix("_tests"): c.metadata["quantlab"]["points"]
            for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")}


def assert_one_record(graded: dict, student: str, lab: str = "01_env") -> dict[str, float]:
    """grades.csv, the gradebook and the hand-back notebook give the same points; returns them."""
    row = graded["rows"][student]
    csv_pts = {k.split("/")[1]: float(v) for k, v in row.items() if k.startswith(lab + "/") and v != ""}
    book = grade_report.read_gradebook(graded["out"] / "course", lab, student)
    back = handback_points(handback(graded["out"], student, lab))
    assert csv_pts == book == back, (student, csv_pts, book, back)
    return csv_pts


def outputs_text(nb) -> str:
    return "\n".join(str(o.get("text", "")) + str(o.get("evalue", "")) for c in nb.cells if c.cell_type == "code"
                     for o in c.outputs)

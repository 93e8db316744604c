"""A student's folder shaped to slow the round or to reach the instructor's spreadsheet: neither works.

No sandbox here: only the survey of the submissions and grades.csv.
"""
import csv

import nbformat

from ci import grade, grade_report
from tests.grading_helpers import lab01, save


def test_a_folder_of_many_notebooks_costs_a_bounded_read(tmp_path, monkeypatch):
    """Each notebook is read (and validated) in the grader's own process, before any time limit applies:
    a folder of many large notebooks would hold up everyone's grading."""
    nb = lab01()
    path = save(nb, tmp_path / "subs", "hoarder", "01_env.ipynb")
    for i in range(6):
        (path.parent / f"copy{i}.ipynb").write_bytes(path.read_bytes())
    reads = []
    real = nbformat.read
    monkeypatch.setattr(grade.nbformat, "read", lambda f, *a, **k: reads.append(f) or real(f, *a, **k))
    monkeypatch.setattr(grade, "MAX_STUDENT_BYTES", 3 * path.stat().st_size)
    students, notes, _ = grade.survey(tmp_path / "subs", ["01_env"])
    assert sum(1 for f in reads if "hoarder" in str(f)) == 3
    assert students["hoarder"]["01_env"][0].name == "01_env.ipynb"          # the one named for the lab is read first
    assert sum("not read: the folder's notebooks pass" in n for n in notes["hoarder"]) == 4, notes["hoarder"]


def test_a_folder_of_many_files_gets_a_bounded_row(tmp_path):
    folder = tmp_path / "subs" / "spammer"
    folder.mkdir(parents=True)
    for i in range(5000):
        (folder / f"junk{i:05}.txt").write_text("x")
    _, notes, _ = grade.survey(tmp_path / "subs", ["01_env"])
    assert len(notes["spammer"]) <= grade.MAX_ENTRIES + 2
    assert any(f"not looked at: more than {grade.MAX_ENTRIES} entries" in n for n in notes["spammer"]), notes["spammer"][-3:]


def test_a_note_is_never_a_spreadsheet_formula(tmp_path):
    """A file named =HYPERLINK(...) in a student's folder starts its row's notes: a spreadsheet would run it."""
    folder = tmp_path / "subs" / "mallory"
    folder.mkdir(parents=True)
    (folder / '=HYPERLINK("x.example","grade")+1.txt').write_text("x")
    _, notes, _ = grade.survey(tmp_path / "subs", ["01_env"])
    row = {"student": "mallory", "notes": "; ".join(notes["mallory"])}
    assert row["notes"].startswith("=")
    grade_report.write_csv(tmp_path / "grades.csv", [], [row])
    with open(tmp_path / "grades.csv") as f:
        got = next(csv.DictReader(f))["notes"]
    assert got[0] not in "=+-@\t\r" and "HYPERLINK" in got, got

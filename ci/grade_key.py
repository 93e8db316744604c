"""The answer key, kept in the grader's process: the cases, the cells a submission runs, and its score.

`answer_key` runs a lab's source exercise cells here (trusted: the course's own solutions and hidden
tests) with utils.exercises recording instead of checking, so every exercise's cases (hand-made and
hidden) and their expected values, computed by the references, stay on this side of the sandbox.
`cells_to_run` builds the notebook a submission runs: the release's setup and check cells (a check
cell the student edited or deleted is the course's again), the student's solution cells and every
code cell the student added (helpers count), never the lesson's own cells. `score` compares the
answers the sandbox wrote with the expected values: an exercise scores its points when every case
is right; stderr output and the visible checks' own verdicts count for nothing.
"""
from __future__ import annotations

import builtins
import copy
import functools
import json
import re
import types
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import torch

from ci import sandbox
from utils import exercises
from utils.exercises import Case

MAX_ANSWERS = 64 * 2**20
MAX_WHY = 400


@dataclass
class Exercise:
    name: str               # the test cell's grade id less "_tests"
    function: str           # the function the student writes
    points: float
    visible: list[Case]
    hidden: list[Case]
    reference: object = None
    solution_ids: list[str] = field(default_factory=list)

    def reference_target(self) -> tuple[str, str] | None:
        """(module, function) of the reference, to stub in the sandbox's copy of utils."""
        ref = self.reference.func if isinstance(self.reference, functools.partial) else self.reference
        mod, name = getattr(ref, "__module__", ""), getattr(ref, "__name__", "")
        return (mod, name) if mod.startswith("utils.") and name.isidentifier() else None


HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", re.S)


def _meta(cell) -> dict:
    m = cell.get("metadata", {}).get("nbgrader", {})
    return m if isinstance(m, dict) else {}


def answer_key(lab: str, nb_path: Path) -> dict[str, Exercise]:
    """{exercise: Exercise} from the lab's source notebook, computed here, never in a student's kernel."""
    nb = nbformat.read(nb_path, as_version=4)
    ns: dict = {}
    key: dict[str, Exercise] = {}
    solutions: list[str] = []
    with exercises.recording() as rec:
        for c in nb.cells:
            m = _meta(c)
            if c.cell_type != "code" or not m:
                continue
            before = {k: id(v) for k, v in rec.items()}
            exec(compile(c.source, f"<{lab}:{m.get('grade_id')}>", "exec"), ns)  # noqa: S102 - the course's source
            if m.get("solution"):
                solutions.append(m["grade_id"])
            if m.get("grade"):
                new = [k for k in rec if k not in before]
                if len(new) != 1:
                    raise RuntimeError(f"{nb_path}: check cell {m['grade_id']} records {len(new)} exercises, expected 1")
                ex = m["grade_id"].removesuffix("_tests")
                r = rec[new[0]]
                key[ex] = Exercise(ex, new[0], float(m["points"]), r["visible"], r["hidden"], r.get("reference"),
                                   [s for s in solutions if s == ex] or solutions[-1:])
    return key


def _code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def cells_to_run(student_nb, release_nb, key: dict[str, Exercise]) -> tuple[object, list[str]]:
    """(the notebook the sandbox runs, notes on what was restored); every cell carries quantlab.role."""
    rel_ids = {c.get("id") for c in release_nb.cells}
    rel_src = {c.source.strip() for c in release_nb.cells}
    setup = [c for c in _code_cells(release_nb) if _meta(c) and not _meta(c).get("solution") and not _meta(c).get("grade")]
    checks = {_meta(c)["grade_id"].removesuffix("_tests"): c for c in _code_cells(release_nb) if _meta(c).get("grade")}
    sol_of = {sid: ex for ex, e in key.items() for sid in e.solution_ids}
    notes, cells, placed = [], [], set()

    def add(cell, role):
        cell = copy.deepcopy(cell)
        cell.outputs, cell.execution_count = [], None
        cell.metadata["quantlab"] = {"role": role}
        cells.append(cell)

    for c in setup:
        add(c, "setup")
    student_checks = {}
    for c in _code_cells(student_nb):
        m = _meta(c)
        if m.get("grade"):
            student_checks[m.get("grade_id", "").removesuffix("_tests")] = c
            continue
        if m.get("solution") and m.get("grade_id") in sol_of:
            add(c, "solution")
            ex = sol_of[m["grade_id"]]
            if ex not in placed:
                add(checks[ex], "check")
                placed.add(ex)
            continue
        if m or c.get("id") in rel_ids or c.source.strip() in rel_src or not c.source.strip():
            continue                      # the lesson's own cells, or a locked one (the release's copy ran)
        add(c, "helper")
    for ex in key:
        if ex not in placed:
            add(checks[ex], "check")
        mine = student_checks.get(ex)
        if mine is None:
            notes.append(f"{ex}: check cell deleted; the course's copy ran (no points lost)")
        elif HIDDEN.sub("", mine.source).strip() != checks[ex].source.strip():
            notes.append(f"{ex}: check cell edited; the course's copy ran")
    nb = nbformat.v4.new_notebook(metadata=copy.deepcopy(release_nb.metadata))
    nb.cells = cells
    return nb, notes


def copied_references(ran, key: dict[str, Exercise]) -> dict[str, str]:
    """{exercise: why} for each exercise whose reference's code is in the student's cells, pasted whole: the
    copy the home check refuses when it runs (exercises.code_signature). In the sandbox the reference is a
    stub, so the look is here, on the cells' text: compiled, never run."""
    from IPython.core.inputtransformer2 import TransformerManager

    sigs: dict[tuple, list[str]] = {}
    for ex, e in key.items():
        ref = e.reference.func if isinstance(e.reference, functools.partial) else e.reference
        if getattr(ref, "__code__", None) is not None:
            sigs.setdefault(exercises.code_signature(ref.__code__), []).append(ex)
    found: dict[str, str] = {}
    transform = TransformerManager().transform_cell
    for c in ran.cells:
        if c.metadata.get("quantlab", {}).get("role") not in ("solution", "helper"):
            continue
        try:
            todo = [compile(transform(c.source), "<cell>", "exec", dont_inherit=True)]
        except Exception:  # noqa: BLE001 - a cell that cannot compile cannot run either: it fails in the sandbox
            continue
        while todo:
            co = todo.pop()
            for ex in sigs.get(exercises.code_signature(co), []):
                found[ex] = (exercises.reference_used(_named(key[ex].function), key[ex].reference)
                             + " (a copy of its code is in the notebook)")
            todo += [k for k in co.co_consts if isinstance(k, types.CodeType)]
    return found


def inputs_for(key: dict[str, Exercise]) -> str:
    """The calls each exercise's function gets, hidden cases included: what the sandbox reads on stdin."""
    return json.dumps({ex: exercises.encode([[c.args, c.kwargs] for c in e.visible + e.hidden])
                       for ex, e in key.items()})


def _case_failure(e: Exercise, i: int, got) -> str | None:
    cases = e.visible + e.hidden
    case = cases[i]
    why = exercises.mismatch(got, case.expected, case.rtol, case.atol, same_dtype=case.same_dtype)
    if why is None:
        return None
    if i < len(e.visible):
        return f"wrong on case {case.describe()}: {why}" + exercises.hint_for(case, got)
    k = i - len(e.visible) + 1
    if why.startswith("expected a"):                # never what came back: it may be the hidden case itself
        why = f"{why.split(', got ')[0]}, got {_kind(got)}"
    shape = f": {why}" if why.startswith(("shape", "dtype", "expected a", "missing key")) else ""
    return f"wrong on hidden case {k} of {len(e.hidden)}{shape} (the hand-made cases pass)"


def _kind(x) -> str:
    """The type of an answer, named only when the course names it (a student's class name is its own text)."""
    t = type(x)
    return t.__name__ if t in (type(None), bool, int, float, str, list, tuple, dict, torch.Tensor, torch.dtype) \
        else "another kind of object"


def _exception(name) -> str:
    """An exception's name as the hand-back says it on a hidden case: Python's own, or no name."""
    return name if isinstance(name, str) and isinstance(getattr(builtins, name, None), type) \
        and issubclass(getattr(builtins, name), BaseException) else "an exception"


def score(e: Exercise, answers_path: Path, why_not_run: str = "", within: Path | None = None) -> tuple[float, str]:
    """(points, '' or why not full): the student's answers against the expected values, all computed here.
    The answers file is read only as a plain file under `within` (the sandbox's folder), no link followed.
    The reason is one line of at most MAX_WHY characters: it quotes what the student returned or raised, and
    it goes into summary.md's table and the hand-back."""
    pts, why = _score(e, answers_path, why_not_run, within)
    why = " ".join(why.split())
    return pts, why if len(why) <= MAX_WHY else why[:MAX_WHY - 3] + "..."


def _score(e: Exercise, answers_path: Path, why_not_run: str, within: Path | None) -> tuple[float, str]:
    root = within or answers_path.parent
    data, why = sandbox.read_back(root, answers_path.relative_to(root).as_posix(), MAX_ANSWERS)
    if data is None:
        return 0.0, (why_not_run or "its function never ran on the cases") if why == "is missing" else f"its answers file {why}"
    try:
        answers = exercises.decode(data.decode()).get("answers")
    except (ValueError, AttributeError, UnicodeDecodeError) as err:
        return 0.0, f"its answers could not be read ({err})"
    if isinstance(answers, dict):
        return 0.0, f"solution missing: {answers.get('missing')}"
    cases = e.visible + e.hidden
    if not isinstance(answers, list) or len(answers) != len(cases):
        return 0.0, "its answers are incomplete"
    for a in answers:
        if isinstance(a, dict) and a.get("error") == "ReferenceCalled":
            return 0.0, exercises.reference_used(_named(e.function), e.reference)
    for i, a in enumerate(answers):
        if not isinstance(a, dict):
            return 0.0, "its answers are malformed"
        if "error" in a:
            if a["error"] == "NotImplementedError":
                return 0.0, exercises.NOT_DONE
            where = cases[i].describe() if i < len(e.visible) else f"hidden case {i - len(e.visible) + 1}"
            if i >= len(e.visible):                   # its message may hold the hidden case
                return 0.0, f"raised {_exception(a['error'])} on {where} of {len(e.hidden)} (the hand-made cases pass)"
            return 0.0, f"raised {a['error']}: {str(a.get('message'))[:200]} on case {where}"
        why = _case_failure(e, i, a.get("value"))
        if why:
            return 0.0, why
    return e.points, ""


def _named(name: str):
    def f():
        pass
    f.__name__ = name
    return f

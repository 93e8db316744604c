"""Every exercise says one thing: the function its text names is the one its solution cell defines, its
visible check and its hidden test call, and the answer key records; every input the cases hand it is
described in the text; the reference its messages name is a real function one can import."""
from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import inspect
import io
import re

import nbformat
import pytest

from tests.conftest import ROOT

LABS = ["01_env", "02_models", "03_eval", "04_divergence", "05_kernels"]
HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", re.S)
SOLUTION = re.compile(r"### BEGIN SOLUTION.*?### END SOLUTION", re.S)


def _cells(lab):
    nb = nbformat.read(ROOT / "labs" / lab / f"{lab}.ipynb", as_version=4)
    return nb.cells


def _grade_id(cell) -> str:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")


def exercise_text(lab: str, function: str) -> str:
    """The markdown that asks for `function`: its numbered item ("N. `function`: ..."), else the paragraph
    that names it."""
    for c in _cells(lab):
        if c.cell_type != "markdown":
            continue
        item = re.search(rf"^\d+\. `{function}`:(.*?)(?=^\d+\. |\Z)", c.source, re.S | re.M)
        if item:
            return item.group(0)
    for c in _cells(lab):
        if c.cell_type == "markdown" and f"`{function}`" in c.source:
            return c.source
    return ""


def called_first_args(source: str, attr: str) -> list[str]:
    """The first argument's name of every `exercises.<attr>(...)` call in a cell."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == attr
                and node.args and isinstance(node.args[0], ast.Name)):
            names.append(node.args[0].id)
    return names


def dict_keys(x, depth: int = 0) -> set[str]:
    """The keys of every dict among a case's inputs (rows of a table, say), nested lists included."""
    if depth > 3:
        return set()
    if isinstance(x, dict):
        return {str(k) for k in x} | set().union(*(dict_keys(v, depth + 1) for v in x.values()))
    if isinstance(x, (list, tuple)):
        return set().union(set(), *(dict_keys(v, depth + 1) for v in x))
    return set()


def resolve(name: str):
    """'utils.m.f' or 'utils.m.f(k=v)' -> the function, imported afresh by its dotted name."""
    dotted = name.split("(")[0]
    module, _, attr = dotted.rpartition(".")
    return getattr(importlib.import_module(module), attr)


@functools.lru_cache(maxsize=None)
def key(lab: str):
    from ci.grade_key import answer_key
    return answer_key(lab, ROOT / "labs" / lab / f"{lab}.ipynb")


@pytest.mark.parametrize("lab", LABS)
def test_text_solution_check_hidden_test_and_key_name_one_function(lab):
    cells = {_grade_id(c): c for c in _cells(lab) if _grade_id(c)}
    for ex, e in key(lab).items():
        fn = e.function
        text = exercise_text(lab, fn)
        assert text, f"{lab} {ex}: no markdown names `{fn}`"
        solution = cells[e.solution_ids[0]].source
        assert re.search(rf"^def {fn}\(", solution, re.M), f"{lab} {ex}: the solution cell does not define {fn}"
        tests = cells[f"{ex}_tests"].source
        visible, hidden = HIDDEN.sub("", tests), "".join(HIDDEN.findall(tests))
        assert called_first_args(visible, "self_check") == [fn], f"{lab} {ex}: the self-check does not call {fn}"
        assert called_first_args(hidden, "grade") == [fn], f"{lab} {ex}: the hidden test does not call {fn}"


@pytest.mark.parametrize("lab", LABS)
def test_every_input_field_the_cases_use_is_in_the_text_and_the_docstring(lab):
    """A row field the checks depend on (Lab 04's normalized L2, say) is one the student was told about."""
    for ex, e in key(lab).items():
        text = exercise_text(lab, e.function)
        fields = set().union(*(dict_keys(c.args) for c in e.visible + e.hidden))
        missing = sorted(f for f in fields if f"`{f}`" not in text and f'"{f}"' not in text)
        assert not missing, f"{lab} {e.function}: its cases use the fields {missing}, which its text never names"


@pytest.mark.parametrize("lab", LABS)
def test_not_done_yet_names_a_reference_one_can_import(lab):
    from utils import exercises

    for ex, e in key(lab).items():
        def blank(*args, **kwargs):
            raise NotImplementedError
        blank.__name__ = e.function
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exercises.self_check(blank, e.visible, reference=e.reference)
        line = out.getvalue()
        assert f"{e.function}: not done yet" in line, line
        named = re.search(r"the reference (.+?) meanwhile", line)
        assert named and "<" not in named.group(1) and "__main__" not in named.group(1), line
        ref = e.reference.func if isinstance(e.reference, functools.partial) else e.reference
        assert resolve(named.group(1)) is ref, f"{lab} {ex}: {named.group(1)} does not import as the reference"
        if isinstance(e.reference, functools.partial):     # the fixed arguments are the reference's own
            inspect.signature(ref).bind_partial(*e.reference.args, **e.reference.keywords)

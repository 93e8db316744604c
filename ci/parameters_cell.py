"""A lab's parameters checked where a student edits them: in its own parameters cell, opened in JupyterLab.
The chain checks a profile before any lab runs (ci/profile_schema.py); a lab opened alone had no such check,
so a bad value failed late with a traceback, or not at all. Both use the same specs and the same words."""
from __future__ import annotations

from pathlib import Path

from ci.profile_schema import SET_BY_RUNNER, Validator, _message, _param_schema, lab_params

REPO_ROOT = Path(__file__).resolve().parents[1]


def check_lab_parameters(lab: str, values: dict, notebook: Path | None = None) -> None:
    """The values of `lab`'s parameters (a notebook's globals()) against its cell's specs: ValueError naming
    each wrong parameter, what it expects and its default, before the lab uses any. notebook: the lab's
    source (default labs/<lab>/<lab>.ipynb, which the students' copies share their specs with)."""
    notebook = Path(notebook or REPO_ROOT / "labs" / lab / f"{lab}.ipynb")
    props = {n: {**_param_schema(lab, notebook, n, info), "x-source": None, "x-example": f"{n} = {info['default']!r}"}
             for n, info in lab_params(notebook).items() if n not in SET_BY_RUNNER}
    schema = {"type": "object", "properties": props}
    given = {n: values[n] for n in props if n in values}
    problems = sorted(_message(e, schema, {}).replace("; e.g. ", "; its default: ")
                      for e in Validator(schema).iter_errors(given))
    if problems:
        raise ValueError(f"{lab}'s parameters cell:\n  - " + "\n  - ".join(problems)
                         + "\nFix the value in the parameters cell (the lab's first code cell), then run the lab again.")

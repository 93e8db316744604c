"""The labs' exercises: run a student's function on small hand-made cases and say what is wrong.

Every exercise is a small function the student writes in the notebook. Its test cell calls

    fn = exercises.self_check(student_fn, cases, reference=utils_fn)

which prints "self-check passed" (and returns the student's function), or "not done yet" while the
function still raises NotImplementedError (and returns the reference, so the rest of the lab runs
on it), or raises ExerciseFailed naming the case, what was expected and what came back. The hidden
tests of the same cell call `exercises.grade(student_fn, more_cases)`, which is strict: a function
not done yet fails there, with the message "not done yet". Every message goes to stdout: the grader
(nbgrader) scores a test cell 0 when anything reaches stderr.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

NOT_DONE = "not done yet"


class ExerciseFailed(AssertionError):
    """The student's function gave a wrong answer (or raised) on a named case."""


@dataclass
class Case:
    """One call of the exercise: fn(*args, **kwargs) should give `expected` (within rtol/atol)."""
    args: tuple
    expected: Any
    label: str = ""
    kwargs: dict = field(default_factory=dict)
    rtol: float = 1e-9
    atol: float = 0.0
    same_dtype: bool = True    # False: a tensor of any dtype of the same kind (integer / float) will do
    hints: tuple = ()          # (a known wrong answer, what it means): says what is wrong, not only that it is

    def describe(self) -> str:
        if self.label:
            return self.label
        parts = [_short(a) for a in self.args] + [f"{k}={_short(v)}" for k, v in self.kwargs.items()]
        return f"({', '.join(parts)})"


def _short(x: Any, limit: int = 60) -> str:
    if isinstance(x, torch.Tensor):
        text = (f"tensor({x.tolist()}, dtype={str(x.dtype).replace('torch.', '')})" if x.numel() <= 8
                else f"tensor of shape {tuple(x.shape)}, {str(x.dtype).replace('torch.', '')}")
    else:
        text = repr(x)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def mismatch(got: Any, expected: Any, rtol: float = 1e-9, atol: float = 0.0, where: str = "",
             same_dtype: bool = True) -> str | None:
    """None if got matches expected, else a sentence saying how it differs. NaN matches NaN.

    Tensors must match in shape and dtype and elementwise within rtol/atol; floats within rtol/atol;
    sequences and dicts item by item; anything else by ==.
    """
    at = f" at {where}" if where else ""
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"expected a torch.Tensor{at}, got {type(got).__name__}"
        if tuple(got.shape) != tuple(expected.shape):
            return f"shape {tuple(got.shape)}{at}, expected {tuple(expected.shape)}"
        if got.dtype != expected.dtype and (same_dtype or got.dtype.is_floating_point != expected.dtype.is_floating_point
                                            or got.dtype == torch.bool):
            return f"dtype {got.dtype}{at}, expected {expected.dtype}"
        g, e = got.detach().cpu(), expected.detach().cpu()
        if e.dtype.is_floating_point:
            ok = torch.isclose(g.double(), e.double(), rtol=rtol, atol=atol, equal_nan=True)
        else:
            ok = g == e
        if bool(ok.all()):
            return None
        bad = (~ok).nonzero()[0].tolist()
        idx = tuple(bad) if len(bad) > 1 else bad[0] if bad else ()
        return (f"{int((~ok).sum())} of {ok.numel()} elements differ{at}; first at index {idx}: "
                f"got {g[tuple(bad)].item()!r}, expected {e[tuple(bad)].item()!r}")
    if expected is None:
        return None if got is None else f"got {_short(got)}{at}, expected None"
    if isinstance(expected, bool):
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if type(got).__name__ not in ("bool", "bool_"):
            return f"expected True or False{at}, got {type(got).__name__} {_short(got)}"
        return None if bool(got) == expected else f"got {got!r}{at}, expected {expected!r}"
    if isinstance(expected, str):
        return None if isinstance(got, str) and got == expected else f"got {_short(got)}{at}, expected {expected!r}"
    if isinstance(expected, (int, float)):
        if isinstance(got, torch.Tensor) and got.numel() == 1 or type(got).__module__ == "numpy":
            got = got.item()
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            return f"expected a number{at}, got {type(got).__name__} {got!r}"
        if math.isnan(expected):
            return None if math.isnan(got) else f"got {got!r}{at}, expected nan"
        if math.isinf(expected) or math.isinf(got):
            return None if got == expected else f"got {got!r}{at}, expected {expected!r}"
        if abs(got - expected) <= atol + rtol * abs(expected):
            return None
        return f"got {got!r}{at}, expected {expected!r} (off by {got - expected:.3g})"
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return f"expected a dict{at}, got {type(got).__name__}"
        missing = [k for k in expected if k not in got]
        if missing:
            return f"missing key(s) {missing}{at}"
        for k in expected:
            why = mismatch(got[k], expected[k], rtol, atol, f"{where}[{k!r}]", same_dtype)
            if why:
                return why
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(expected):
            return f"expected a {type(expected).__name__} of {len(expected)} items{at}, got {_short(got)}"
        for i, (g, e) in enumerate(zip(got, expected)):
            why = mismatch(g, e, rtol, atol, f"{where}[{i}]", same_dtype)
            if why:
                return why
        return None
    return None if got == expected else f"got {got!r}{at}, expected {expected!r}"


def against(reference: Callable, calls: list, rtol: float = 1e-9, atol: float = 0.0) -> list[Case]:
    """Cases whose expected values come from the (tested) reference: more cases for the hidden tests."""
    return [Case(tuple(args), reference(*args), rtol=rtol, atol=atol) for args in calls]


def _name(fn: Callable) -> str:
    return getattr(fn, "__name__", repr(fn))


def reference_name(fn: Callable) -> str:
    """'utils.stats.mcnemar_exact', or 'utils.numerics.accumulate(mode='saturate')' for a partial."""
    if isinstance(fn, functools.partial):
        fixed = ", ".join(f"{k}={v!r}" for k, v in fn.keywords.items())
        return f"{reference_name(fn.func)}({fixed})"
    return f"{getattr(fn, '__module__', '?')}.{_name(fn)}"


def run_cases(fn: Callable, cases: list[Case]) -> int:
    """Run every case; raise ExerciseFailed at the first wrong one. NotImplementedError passes through."""
    if not cases:
        raise ValueError("cases is empty: an exercise needs at least one case to check")
    for case in cases:
        try:
            got = fn(*case.args, **case.kwargs)
        except NotImplementedError:
            raise
        except Exception as e:  # the student's code crashed: say where, keep the cause
            raise ExerciseFailed(f"{_name(fn)} raised {type(e).__name__}: {e} on case {case.describe()}") from e
        why = mismatch(got, case.expected, case.rtol, case.atol, same_dtype=case.same_dtype)
        if why:
            hint = next((h for wrong, h in case.hints
                         if mismatch(got, wrong, case.rtol, case.atol, same_dtype=case.same_dtype) is None), None)
            raise ExerciseFailed(f"{_name(fn)}: wrong on case {case.describe()}: {why}"
                                 + (f". Hint: {hint}" if hint else ""))
    return len(cases)


def self_check(fn: Callable, cases: list[Case], reference: Callable | None = None) -> Callable:
    """The visible check. Returns the function the lab goes on with: the student's when it passes,
    the reference while it is not done yet. A wrong answer raises ExerciseFailed."""
    if reference is not None:  # the hand-made cases must hold for the reference itself
        try:
            run_cases(reference, cases)
        except ExerciseFailed as e:
            raise RuntimeError(f"the exercise's own cases fail for the reference {reference_name(reference)}: {e}") from e
    try:
        n = run_cases(fn, cases)
    except NotImplementedError:
        using = f"the lab uses the reference {reference_name(reference)} meanwhile" if reference \
            else "nothing else in the lab needs it"
        print(f"{_name(fn)}: {NOT_DONE} (it raises NotImplementedError); {using}.")
        return reference
    print(f"{_name(fn)}: self-check passed on {n} hand-made case{'s' if n != 1 else ''}.")
    return fn


def grade(fn: Callable, cases: list[Case]) -> None:
    """The hidden tests: every case must pass; a function not done yet fails with 'not done yet'.
    Returns None: a number as a test cell's last value would read to the grader as partial credit."""
    try:
        run_cases(fn, cases)
    except NotImplementedError:
        raise ExerciseFailed(f"{_name(fn)}: {NOT_DONE}") from None

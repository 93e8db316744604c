"""The labs' exercises: run a student's function on small hand-made cases and say what is wrong.

Every exercise is a small function the student writes in the notebook. Its test cell calls

    fn = exercises.self_check(student_fn, cases, reference=utils_fn)

which prints "self-check passed" (and returns the student's function), or "not done yet" while the
function still raises NotImplementedError (and returns the reference, so the rest of the lab runs
on it), or raises ExerciseFailed naming the case, what was expected and what came back. A function
that calls the reference (or a copy of it) fails the check: the answer key is not an answer. The
hidden tests of the same cell call `exercises.grade(student_fn, more_cases)`, strict: a function not
done yet fails there with "not done yet" (the chain runs them on the solutions).

A grading round (ci.grade) never trusts this module inside a student's kernel: it records the cases
here, in its own process (`recording`), sends only their inputs into the sandbox, where `harvest`
writes what the student's function returned (`encode`), and compares outside (`decode`, `mismatch`).
"""
from __future__ import annotations

import base64
import contextlib
import functools
import io
import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

NOT_DONE = "not done yet"
GRADING_ENV = "QUANTLAB_GRADING"     # set inside the grading sandbox: there the references are stubs


class ExerciseFailed(AssertionError):
    """The student's function gave a wrong answer (or raised) on a named case."""


class ReferenceCalled(ExerciseFailed):
    """The student's function called the course's reference for its exercise (the answer key)."""


_RECORDING: dict | None = None      # {function name: {"visible": [...], "hidden": [...], "reference": fn}}


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
        except (NotImplementedError, ReferenceCalled):
            raise
        except Exception as e:  # the student's code crashed: say where, keep the cause
            raise ExerciseFailed(f"{_name(fn)} raised {type(e).__name__}: {e} on case {case.describe()}") from e
        why = mismatch(got, case.expected, case.rtol, case.atol, same_dtype=case.same_dtype)
        if why:
            raise ExerciseFailed(f"{_name(fn)}: wrong on case {case.describe()}: {why}" + hint_for(case, got))
    return len(cases)


def hint_for(case: Case, got: Any) -> str:
    """'. Hint: ...' when got is one of the case's known wrong answers, else ''."""
    hint = next((h for wrong, h in case.hints
                 if mismatch(got, wrong, case.rtol, case.atol, same_dtype=case.same_dtype) is None), None)
    return f". Hint: {hint}" if hint else ""


def reference_used(fn: Callable, reference: Callable | None) -> str:
    """The sentence a graded notebook gets for a function that calls its exercise's reference."""
    return (f"{_name(fn)} calls the course's reference {reference_name(reference)}: "
            "the answer key is not an answer, so this exercise scores 0 when graded; write your own")


def code_signature(code) -> tuple:
    """What makes a function a copy of another here: the same bytecode, names and number of constants."""
    return code.co_code, code.co_names, len(code.co_consts)


@contextlib.contextmanager
def _watching(reference: Callable | None):
    """Notes every call, inside the block, of the reference's code or of a copy of it (the same
    bytecode, constants and names: an alias, a re-export or inspect.getsource + exec all match)."""
    seen: list = []
    target = reference.func if isinstance(reference, functools.partial) else reference
    code = getattr(target, "__code__", None)
    if code is None:
        yield seen
        return
    sig = code_signature(code)

    def profile(frame, event, arg):
        c = frame.f_code
        if event == "call" and (c is code or code_signature(c) == sig):
            seen.append(c)
    old = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(old)


def self_check(fn: Callable, cases: list[Case], reference: Callable | None = None) -> Callable:
    """The visible check. Returns the function the lab goes on with: the student's when it passes,
    the reference while it is not done yet. A wrong answer, or a call of the reference, raises."""
    grading = os.environ.get(GRADING_ENV) == "1"   # in the sandbox the reference is a stub: nothing to check it on
    if reference is not None and not grading:      # the hand-made cases must hold for the reference itself
        try:
            run_cases(reference, cases)
        except ExerciseFailed as e:
            raise RuntimeError(f"the exercise's own cases fail for the reference {reference_name(reference)}: {e}") from e
    if _RECORDING is not None:
        _RECORDING.setdefault(_name(fn), {"visible": [], "hidden": []}).update(visible=list(cases), reference=reference)
        return fn
    try:
        with _watching(reference) as seen:
            n = run_cases(fn, cases)
    except NotImplementedError:
        using = f"the lab uses the reference {reference_name(reference)} meanwhile" if reference \
            else "nothing else in the lab needs it"
        print(f"{_name(fn)}: {NOT_DONE} (it raises NotImplementedError); {using}.")
        return reference
    except ReferenceCalled:
        raise ReferenceCalled(reference_used(fn, reference)) from None
    if seen:
        raise ReferenceCalled(reference_used(fn, reference))
    print(f"{_name(fn)}: self-check passed on {n} hand-made case{'s' if n != 1 else ''}.")
    return fn


def grade(fn: Callable, cases: list[Case]) -> None:
    """The hidden tests: every case must pass; a function not done yet fails with 'not done yet'.
    Returns None: a number as a test cell's last value would read to the grader as partial credit."""
    if _RECORDING is not None:
        _RECORDING.setdefault(_name(fn), {"visible": [], "hidden": []})["hidden"] = list(cases)
        return None
    try:
        run_cases(fn, cases)
    except NotImplementedError:
        raise ExerciseFailed(f"{_name(fn)}: {NOT_DONE}") from None


@contextlib.contextmanager
def recording():
    """Inside the block, self_check and grade record their cases (and the reference) instead of running:
    {function name: {"visible": cases, "hidden": cases, "reference": fn}}. The grader's own process uses it."""
    global _RECORDING
    _RECORDING = {}
    try:
        yield _RECORDING
    finally:
        _RECORDING = None


# --- answers across the sandbox wall: plain JSON, no pickle, so reading them runs nothing ---------------
_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}


def encode(x: Any, depth: int = 0) -> Any:
    """A JSON-able form of an exercise's argument or answer; anything else is kept as its type's name."""
    if depth > 40:
        return {"__opaque__": "nested too deeply"}
    if x is None or isinstance(x, (bool, int, float, str)):
        return float(x) if isinstance(x, float) and type(x) is not float else x
    if type(x).__module__ == "numpy" and hasattr(x, "item") and getattr(x, "ndim", 1) == 0:
        return encode(x.item(), depth + 1)
    if isinstance(x, torch.dtype):
        return {"__dtype__": str(x).removeprefix("torch.")}
    if isinstance(x, torch.Tensor) and str(x.dtype).removeprefix("torch.") in _DTYPES and x.layout == torch.strided:
        t = x.detach().cpu().contiguous().reshape(-1)
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return {"__tensor__": [str(t.dtype).removeprefix("torch."), list(x.shape), base64.b64encode(raw).decode()]}
    if isinstance(x, (list, tuple)):
        items = [encode(v, depth + 1) for v in x]
        return items if isinstance(x, list) else {"__tuple__": items}
    if isinstance(x, dict) and all(isinstance(k, str) for k in x):
        return {"__dict__": [[k, encode(v, depth + 1)] for k, v in x.items()]}
    return {"__opaque__": type(x).__name__}


def _decode_obj(d: dict) -> Any:
    if len(d) != 1:
        raise ValueError("not an encoded value")
    (tag, v), = d.items()
    if tag == "__dtype__":
        return _DTYPES[v]
    if tag == "__tensor__":
        dtype, shape, raw = _DTYPES[v[0]], [int(n) for n in v[1]], base64.b64decode(v[2], validate=True)
        if math.prod(shape) * dtype.itemsize != len(raw):
            raise ValueError("a tensor's bytes do not match its shape")
        if not raw:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape).clone()
    if tag == "__opaque__":
        return type(str(v)[:80], (), {"__repr__": lambda self: f"<a {type(self).__name__}>"})()
    raise ValueError(f"unknown tag {tag!r}")


def decode(obj: Any) -> Any:
    """The value `encode` made, from its JSON text or parsed JSON (tensors rebuilt from their bytes);
    ValueError when it is not one."""
    try:
        return _walk(json.loads(obj) if isinstance(obj, str) else obj, 0)
    except (KeyError, TypeError, IndexError, RecursionError, RuntimeError, OverflowError) as e:   # torch refuses a forged shape
        raise ValueError(f"not an encoded value: {type(e).__name__}: {e}") from None


def _walk(x: Any, depth: int) -> Any:
    if depth > 60:
        raise ValueError("nested too deeply")
    if isinstance(x, list):
        return [_walk(v, depth + 1) for v in x]
    if isinstance(x, dict):
        if len(x) == 1 and next(iter(x)) in ("__tensor__", "__dtype__", "__opaque__"):
            return _decode_obj(x)
        if len(x) == 1 and next(iter(x)) in ("__tuple__", "__dict__"):
            (tag, v), = x.items()
            inner = _walk(v, depth + 1)
            return tuple(inner) if tag == "__tuple__" else {str(k): val for k, val in inner}
        return {str(k): _walk(v, depth + 1) for k, v in x.items()}   # the grader's own wrappers
    return x


def harvest(name: str, namespace: dict, inputs_path: str, out_path: str) -> None:
    """Inside the grading sandbox: call the student's `name` on each (args, kwargs) of inputs_path and
    write what came back (or what it raised) to out_path. What it prints is dropped: the calls' inputs
    include the hidden cases."""
    with open(inputs_path) as f:
        calls = decode(f.read())
    fn, answers = namespace.get(name), []
    if not callable(fn):
        answers = {"missing": f"no function named {name} in the notebook"}
    for args, kwargs in calls if callable(fn) else ():
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                got = fn(*args, **kwargs)
            answers.append({"value": encode(got)})
        except NotImplementedError:
            answers.append({"error": "NotImplementedError", "message": NOT_DONE})
        except (Exception, SystemExit) as e:  # noqa: BLE001 - the student's error is the answer
            answers.append({"error": type(e).__name__, "message": str(e)[:500]})
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"name": name, "answers": answers}, f)
    os.replace(tmp, out_path)

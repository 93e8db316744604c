"""A profile's schema, checked with jsonschema before anything runs.

The top-level keys are written down once (TOP_LEVEL). Each lab's section is derived from that notebook's
papermill parameters cell: the names, a type inferred from each default, and, where a type alone is not
enough, a spec in square brackets that opens the parameter's comment, e.g.

    batch_size = "auto"   # [int at least 1 or "auto"] lm-eval batch size

A spec is alternatives joined by " or ": None, a quoted literal, int / float / str / bool with optional bounds
(`float above 0 and at most 1`), or `[non-empty ]list of <those>`. Bounds are words because papermill skips a
parameter line holding a second "=" (so `>=` would hide the parameter). Every error names the file, the line,
the key, what was expected and an example (the notebook's own default, which must satisfy its spec).
"""
from __future__ import annotations

import ast
import difflib
import math
import re
from functools import lru_cache
from pathlib import Path

import jsonschema
import yaml

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
SET_BY_RUNNER = ("run_dir", "profile")        # ci.run sets these for every lab
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"

# key: (schema, what is expected, an example)
TOP_LEVEL = {
    "name": ({"type": "string", "pattern": NAME_PATTERN},
             "letters, digits, '.', '_' or '-' (it names the run folder)", "name: my-box"),
    "description": ({"type": "string"}, "one line of text", "description: a 24 GB NVIDIA box"),
    "env": ({"type": ["object", "null"], "propertyNames": {"pattern": _ENV_NAME},
             "additionalProperties": {"type": ["string", "integer", "number"], "x-expected": "text or a number",
                                      "x-example": 'TRITON_INTERPRET: "1"'}},
            "a mapping of environment variable names to text", 'env: {TRITON_INTERPRET: "1"}'),
    "params": ({"type": ["object", "null"]}, "a mapping of parameters given to every lab that declares them",
               "params: {device: cpu, batch_size: 8}"),
    "labs": ({"type": ["object", "null"]}, "a mapping of lab name to that lab's parameters",
             "labs: {01_env: {repeats: 5}}"),
    "skip": ({"type": "array", "items": {"type": "string"}}, "a list of lab names", "skip: [05_kernels]"),
    "kernel": ({"type": "string", "minLength": 1}, "the name of an installed Jupyter kernel", "kernel: python3"),
    "cell_timeout_s": ({"type": ["number", "null"], "exclusiveMinimum": 0},
                       "seconds per cell (a number > 0), or null for no limit", "cell_timeout_s: 3600"),
}
REQUIRED = ("name",)
_ROOT_EXAMPLE = "name: my-box\nparams:\n  device: cpu\nlabs:\n  01_env:\n    repeats: 5"


def _is_number(checker, value) -> bool:
    """A finite int or float: YAML's .nan and .inf would pass every bound (NaN compares false) and reach a lab."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and (not isinstance(value, float) or math.isfinite(value)))


def _is_integer(checker, value) -> bool:
    """An int, not 512.0: a lab passes it to range() or a tensor shape, where a float is a TypeError."""
    return isinstance(value, int) and not isinstance(value, bool)


# jsonschema's own checker takes 512.0 for an integer and NaN for a number
Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=(
    jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("number", _is_number).redefine("integer", _is_integer)))


class ProfileError(ValueError):
    """A profile that does not match its schema; the message lists every problem."""


# the specs in the parameters cells -------------------------------------------------------------

_BASE = {"int": "integer", "float": "number", "str": "string", "bool": "boolean"}
_BOUND = {"at least": "minimum", "above": "exclusiveMinimum", "at most": "maximum", "below": "exclusiveMaximum"}
_SPEC = re.compile(r"^\[([^\]]+)\]\s*")


def _alternative(text: str) -> dict:
    text = text.strip()
    if text == "None":
        return {"type": "null"}
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return {"const": text[1:-1]}
    if text.startswith("list of "):
        return {"type": "array", "items": _alternative(text[len("list of "):])}
    base, *bounds = re.split(r"\s+and\s+", text)
    head = base.split(None, 1)
    if head[0] not in _BASE:
        raise ValueError(f"unknown type {head[0]!r} (int, float, str, bool, None, \"literal\", list of ...)")
    schema = {"type": _BASE[head[0]]}
    for bound in ([head[1]] if len(head) > 1 else []) + bounds:
        m = re.fullmatch(r"(at least|at most|above|below)\s+(-?[\d.]+)", bound.strip())
        if not m:
            raise ValueError(f"cannot read the bound {bound!r} (e.g. at least 1; above 0 and at most 1)")
        schema[_BOUND[m.group(1)]] = float(m.group(2)) if "." in m.group(2) else int(m.group(2))
    return schema


def parse_spec(spec: str) -> dict:
    """'int at least 1 or "auto"' -> a JSON schema; '[non-empty ]list of X or Y' is a list of items X or Y."""
    m = re.fullmatch(r"(non-empty )?list of (.+)", spec.strip())
    if m:
        return {"type": "array", "items": parse_spec(m.group(2)), **({"minItems": 1} if m.group(1) else {})}
    alts = [_alternative(a) for a in re.split(r"\s+or\s+", spec.strip())]
    return alts[0] if len(alts) == 1 else {"anyOf": alts}


def _inferred(value) -> tuple[dict, str]:
    """A schema and its words from a default value, for parameters without a spec."""
    for py, name in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str")):
        if isinstance(value, py):
            return parse_spec(name), name
    if isinstance(value, list):
        kinds = {_inferred(v)[1] for v in value}
        if len(kinds) == 1:
            (kind,) = kinds
            return parse_spec(f"list of {kind}"), f"list of {kind}"
        return {"type": "array"}, "a list"
    if isinstance(value, dict):
        return {"type": "object"}, "a mapping"
    return {}, "anything"


def _unread_by_papermill(notebook: str, read: set) -> list[str]:
    """Names the parameters cell assigns that papermill's inspection skipped (a line with a second '=')."""
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    cell = next((c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])), None)
    try:
        tree = ast.parse(cell.source) if cell is not None else None
    except SyntaxError:
        return []
    assigned = [t.id for node in (tree.body if tree else []) if isinstance(node, (ast.Assign, ast.AnnAssign))
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)]
    return [n for n in assigned if n not in read]


@lru_cache(maxsize=64)
def _lab_params_cached(notebook: str, mtime: float) -> dict:
    import papermill

    inspected = papermill.inspect_notebook(notebook)
    skipped = _unread_by_papermill(notebook, set(inspected))
    if skipped:
        raise ProfileError(f"{notebook}: papermill cannot read the parameters cell's line for {', '.join(skipped)} "
                           "(one `name = value  # comment` per line, no other '=' on it, e.g. write `at least 1`, "
                           "not `>= 1`)")
    out = {}
    for name, info in inspected.items():
        help_text = info.get("help") or ""
        try:
            default = ast.literal_eval(info.get("default") or "None")
        except (ValueError, SyntaxError):
            default = None
        m = _SPEC.match(help_text)
        if m:
            try:
                schema, spec = parse_spec(m.group(1)), m.group(1).strip()
            except ValueError as exc:
                raise ProfileError(f"{notebook}: the parameters cell's spec for {name} [{m.group(1)}]: {exc}") from exc
        elif default is None and name not in SET_BY_RUNNER:
            raise ProfileError(f"{notebook}: parameter {name} defaults to None, so its type is unknown: open its "
                               f"comment with a spec, e.g. `{name} = None  # [int at least 1 or None] ...`")
        else:
            schema, spec = _inferred(default)
        out[name] = {"default": default, "spec": spec, "help": _SPEC.sub("", help_text), "schema": schema}
    return out


def lab_params(notebook: Path) -> dict:
    """{name: {default, spec, help, schema}} from a notebook's parameters cell."""
    notebook = Path(notebook)
    return _lab_params_cached(str(notebook), notebook.stat().st_mtime)


def _example(name: str, value) -> str:
    return f"{name}: " + yaml.safe_dump(value, default_flow_style=True).splitlines()[0]


def _param_schema(lab: str, notebook: Path, name: str, info: dict) -> dict:
    if name in SET_BY_RUNNER:
        return {"not": {}, "x-expected": f"nothing: {name} is set by ci.run for every lab",
                "x-example": "(remove this key)"}
    rel = notebook.relative_to(notebook.parents[2]) if len(notebook.parents) > 2 else notebook
    return {**info["schema"], "x-expected": info["spec"], "x-source": str(rel),
            "x-example": _example(name, info["default"])}


def build_schema(labs: dict[str, Path] | None) -> dict:
    """The whole profile's schema; labs=None checks the top level only."""
    props = {k: {**s, "x-expected": what, "x-example": ex} for k, (s, what, ex) in TOP_LEVEL.items()}
    if labs is not None:
        declared = {lab: lab_params(nb) for lab, nb in labs.items()}
        props["labs"] = {**props["labs"], "additionalProperties": False, "properties": {
            lab: {"type": ["object", "null"], "additionalProperties": False,
                  "x-expected": f"a mapping of {lab}'s parameters", "x-example": f"{lab}: {{...}}",
                  "properties": {n: _param_schema(lab, labs[lab], n, i) for n, i in params.items()}}
            for lab, params in declared.items()}}
        common = {}
        for lab, params in declared.items():
            for n, info in params.items():
                common.setdefault(n, []).append(_param_schema(lab, labs[lab], n, info))
        props["params"] = {**props["params"], "additionalProperties": False,
                           "properties": {n: {"allOf": subs} for n, subs in common.items()}}
        props["skip"] = {**props["skip"], "items": {"enum": list(labs)}}
    return {"type": "object", "properties": props, "additionalProperties": False, "required": list(REQUIRED),
            "x-expected": "a mapping of keys (" + ", ".join(TOP_LEVEL) + ")", "x-example": _ROOT_EXAMPLE}


# messages ---------------------------------------------------------------------------------------

def _key(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "the profile"


def _got(value) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, str):
        return f"{value!r} (text)"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, list):
        return f"a list {yaml.safe_dump(value, default_flow_style=True).strip()[:60]}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} (not a finite number)"
    return repr(value)


def _lines(text: str | None) -> dict:
    """{path tuple: line} for every key and item of the YAML text."""
    out: dict = {}
    if not text:
        return out

    def walk(node, path):
        out[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                out[path + (k.value,)] = k.start_mark.line + 1
                walk(v, path + (k.value,))
                out[path + (k.value,)] = k.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                walk(v, path + (i,))
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return out
    if node is not None:
        walk(node, ())
    return out


def _explain(schema: dict, schema_path: tuple) -> dict:
    """The innermost schema on the error's schema path that says what it expects."""
    found = node = schema
    for step in schema_path:
        try:
            node = node[step]
        except (KeyError, IndexError, TypeError):
            break
        if isinstance(node, dict) and "x-expected" in node:
            found = node
    return found


def _example_of(prop: dict) -> str:
    for sub in [prop, *prop.get("allOf", [])]:
        if "x-example" in sub:
            return sub["x-example"]
    return ""


def _number_text(value: str, schema: dict):
    """'1e3' -> '1000' when the schema takes that number: YAML 1.1 reads an exponent without a dot as text."""
    try:
        number = float(value)
    except ValueError:
        return None
    for candidate in ((int(number),) if number.is_integer() else ()) + (number,):
        if Validator(schema).is_valid(candidate):
            return yaml.safe_dump(candidate).splitlines()[0]
    return None


def _message(err: jsonschema.ValidationError, schema: dict, lines: dict) -> str:
    path = tuple(err.absolute_path)
    if err.validator == "additionalProperties":
        props = err.schema.get("properties") or {}
        allowed = list(props)
        what = ("a lab of the chain (it has no notebook in labs/)" if path == ("labs",) else
                "a parameter any lab of the chain declares" if path == ("params",) else
                f"a parameter: {path[-1]}'s parameters cell does not declare it" if path[:1] == ("labs",) else
                "a profile key")
        shown = [k for k in allowed if k not in SET_BY_RUNNER]
        known = ", ".join(shown) if len(shown) <= 12 else ", ".join(shown[:12]) + ", ..."
        out = []
        for k in (k for k in err.instance if k not in props):
            near = difflib.get_close_matches(str(k), allowed, n=1, cutoff=0.6)
            where = f"line {lines[path + (k,)]}, " if path + (k,) in lines else ""
            hint = f"did you mean {near[0]!r}? " if near else ""
            pick = near[0] if near else (shown or allowed or [None])[0]
            example = _example_of(props[pick]) if pick else ""
            out.append(f"{where}{_key(path + (k,))}: not {what}; {hint}expected one of: {known or 'none'}"
                       + (f"; e.g. {example}" if example else ""))
        return "\n".join(out)
    if err.validator == "required":
        missing = err.message.split("'")[1]
        _, what, example = TOP_LEVEL[missing]
        return f"{_key(path + (missing,))}: missing; expected {what}, e.g. {example}"
    if err.validator == "propertyNames":
        return (f"{_key(path)}: {err.instance!r} is not an environment variable name; expected letters, digits "
                "and '_' (not starting with a digit), e.g. TRITON_INTERPRET")
    explained = _explain(schema, tuple(err.absolute_schema_path))
    expected = explained.get("x-expected", err.message)
    example = explained.get("x-example", "")
    source = explained.get("x-source")
    where = f"line {lines[path]}, " if path in lines else ""
    got = _got(err.instance)
    plain_schema = {k: v for k, v in explained.items() if not k.startswith("x-")}
    if isinstance(err.instance, float) and err.instance.is_integer() and \
            Validator(plain_schema).is_valid(int(err.instance)):
        got += f", a float where a whole number is expected: write {int(err.instance)}"
    if isinstance(err.instance, str):
        number = _number_text(err.instance, plain_schema)
        if number is not None and re.search(r"[eE]", err.instance):
            got = (f"{err.instance!r}, which YAML reads as text, not a number (an exponent needs a dot and a "
                   f"sign): write {number}")
        elif number is not None:
            got += f": a number in quotes is text to YAML, write {number}"
    if isinstance(err.instance, bool) and "text" in expected:
        got += " - quote it"
    declared = f" (as {source}'s parameters cell declares it)" if source else ""
    return f"{where}{_key(path)}: got {got}; expected {expected}{declared}; e.g. {example}"


def validate_profile(profile, labs: dict[str, Path] | None, path: str | None = None) -> None:
    """Raise ProfileError listing every problem; labs=None checks the top level only."""
    path = path or (profile.get("_path") if isinstance(profile, dict) else None) or "<profile>"
    data = {k: v for k, v in profile.items() if not str(k).startswith("_")} if isinstance(profile, dict) else profile
    schema = build_schema(labs)
    text = None
    try:
        text = Path(path).read_text(encoding="utf-8") if Path(path).is_file() else None
    except OSError:
        pass
    lines = _lines(text)
    if data is None:
        raise ProfileError(f"profile {path} is empty: expected {schema['x-expected']}, e.g.\n{_ROOT_EXAMPLE}")
    errors = list(Validator(schema).iter_errors(data))
    if not errors:
        return
    if not isinstance(data, dict):
        raise ProfileError(f"profile {path}: got {_got(data)}; expected {schema['x-expected']}, e.g.\n{_ROOT_EXAMPLE}")
    merged: dict[str, tuple[list[str], str]] = {}   # a common param several labs declare alike: one line
    for e in errors:
        for line in _message(e, schema, lines).splitlines():
            m = re.match(r"^(.*) \(as (\S+)'s parameters cell declares it\); e\.g\. (.*)$", line)
            key, src, example = (m.group(1), m.group(2), m.group(3)) if m else (line, None, "")
            srcs, first = merged.setdefault(key, ([], example))
            srcs.extend([src] if src else [])
    out = []
    for key, (srcs, example) in merged.items():
        if srcs:
            key = f"{key} (as {' and '.join(srcs)} declare{'s' if len(srcs) == 1 else ''} it); e.g. {example}"
        line_no = re.match(r"^line (\d+),", key)
        out.append((int(line_no.group(1)) if line_no else 0, key))
    problems = "\n".join("  - " + text for _, text in sorted(out, key=lambda t: t[0]))
    raise ProfileError(f"profile {path} does not match its schema (nothing was run):\n{problems}")


def load_yaml(path: Path):
    """The YAML of a profile, or a ProfileError naming the file and line."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
        what = getattr(exc, "problem", None) or str(exc)
        raise ProfileError(f"profile {path} is not valid YAML:{where}: {what}; compare with ci/profiles/cpu-tiny.yaml, "
                           f"e.g.\n{_ROOT_EXAMPLE}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"profile {path} cannot be read ({exc})") from exc


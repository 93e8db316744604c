"""Each lab's results.json: written atomically, stamped with a schema version, read back strictly.

Why atomic: a notebook killed half-way must never leave a half-written file that a later lab
or the report would take as complete. Why versioned: later labs and the instructor's grading
read these files; a changed layout must fail loudly, not be misread.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

SCHEMA = "quant-lab/results"
SCHEMA_VERSION = 1
RESULTS_FILE = "results.json"


class ResultsError(ValueError):
    """A results file is missing, incomplete, or of another schema."""


# The layout every lab writes (write_results) and every reader may rely on; checked with jsonschema on read.
RESULTS_SCHEMA = {
    "type": "object",
    "required": ["schema", "schema_version", "lab", "status", "headline", "verdicts", "figures", "data"],
    "properties": {
        "lab": {"type": "string"},
        "status": {"type": "string"},
        "written_at": {"type": "string"},
        "platform": {"type": "object"},
        "headline": {"type": "object"},
        "verdicts": {"type": "array", "items": {"type": "object", "required": ["verdict"],
                                                "properties": {"verdict": {"enum": ["ok", "warn", "fail", "info"]}}}},
        "figures": {"type": "array", "items": {"type": "string"}},
        "data": {"type": "object"},
    },
}


def _jsonable(value: Any) -> Any:
    """Turn numpy/torch scalars, paths and tuples into plain JSON; refuse NaN/Inf silently turning into null."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        value = value.item()  # numpy / torch scalar
    if hasattr(value, "tolist") and callable(value.tolist):
        return _jsonable(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        # JSON has no NaN; keep it visible as a string rather than crash or drop it.
        return str(value)
    return value


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write text to a temporary file beside `path`, fsync it, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_json(path: str | os.PathLike, payload: Any) -> Path:
    """JSON through atomic_write_text; NaN/Inf become the strings "nan"/"inf", never bare NaN."""
    return atomic_write_text(path, json.dumps(_jsonable(payload), indent=2, allow_nan=False) + "\n")


def write_jsonl(records: Iterable[dict], path: str | os.PathLike, keys: Iterable[str] | None = None) -> Path:
    """One JSON object per line (only `keys` of each record if given), written atomically."""
    keys = tuple(keys) if keys is not None else None
    lines = [json.dumps({k: r[k] for k in keys} if keys else r, ensure_ascii=False) for r in records]
    return atomic_write_text(path, "\n".join(lines) + "\n")


def read_jsonl(path: str | os.PathLike, check: Callable[[Any], str | None] | None = None) -> list[dict]:
    """Read a jsonl file, every line checked, so a malformed file fails here, naming the file and line.

    check(record) returns why a record is wrong (or None); blank lines are skipped. Raises ValueError.
    """
    out = []
    for i, raw in enumerate(Path(path).read_bytes().splitlines(), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path} line {i} is not UTF-8 text (byte {exc.start + 1} of the line); "
                             "save the file as UTF-8") from exc
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} line {i} is not JSON ({exc.msg})") from exc
        why = check(rec) if check else (None if isinstance(rec, dict) else "is not a JSON object")
        if why:
            raise ValueError(f"{path} line {i} {why}")
        out.append(rec)
    return out


def write_results(
    lab_dir: str | os.PathLike,
    lab: str,
    *,
    headline: dict[str, Any] | None = None,
    verdicts: list[dict[str, str]] | None = None,
    data: dict[str, Any] | None = None,
    figures: list[str] | None = None,
    platform: dict[str, Any] | None = None,
) -> Path:
    """Write a lab's results.json, marked complete. Call it once, at the end of the lab.

    headline: the few numbers the run report shows, as {label: value}.
    verdicts: [{"check": ..., "verdict": "ok"|"warn"|"fail"|"info", "detail": ...}].
    data: everything else a later lab may read.
    """
    for v in verdicts or []:
        if v.get("verdict") not in {"ok", "warn", "fail", "info"}:
            raise ResultsError(f"verdict must be ok/warn/fail/info, got {v!r}")
    payload = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "lab": lab,
        "status": "complete",
        "written_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "platform": platform or {},
        "headline": headline or {},
        "verdicts": verdicts or [],
        "figures": figures or [],
        "data": data or {},
    }
    return atomic_write_json(Path(lab_dir) / RESULTS_FILE, payload)


def read_results(lab_dir: str | os.PathLike) -> dict[str, Any]:
    """Read a lab's results.json; raise ResultsError with what to do if it is absent or not ours."""
    path = Path(lab_dir) / RESULTS_FILE
    if not path.is_file():
        raise ResultsError(
            f"{path} does not exist: run that lab first (python -m ci.run ... or its notebook)."
        )
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path} is not valid JSON at line {exc.lineno} column {exc.colno} ({exc.msg}): "
                           "cut short or edited; rerun that lab.") from exc
    except (UnicodeDecodeError, OSError) as exc:
        raise ResultsError(f"{path} cannot be read ({exc}); rerun that lab.") from exc
    if not isinstance(payload, dict):
        raise ResultsError(f"{path} holds a JSON {type(payload).__name__}, not a results object; rerun that lab.")
    if payload.get("schema") != SCHEMA:
        raise ResultsError(f"{path} is not a quant-lab results file (schema={payload.get('schema')!r}).")
    if payload.get("schema_version") != SCHEMA_VERSION:
        raise ResultsError(
            f"{path} has schema_version {payload.get('schema_version')}, this code reads "
            f"{SCHEMA_VERSION}: rerun that lab with this version of the course."
        )
    if payload.get("status") != "complete":
        raise ResultsError(f"{path} is not marked complete; rerun that lab.")
    import jsonschema

    problem = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(RESULTS_SCHEMA).iter_errors(payload))
    if problem is not None:
        key = ".".join(map(str, problem.absolute_path)) or problem.message.split("'")[1]
        raise ResultsError(f"{path}: {key}: {problem.message} (not the layout write_results writes); "
                           "rerun that lab.")
    return payload

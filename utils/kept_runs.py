"""Figures read from the kept runs under docs/device-runs/, never typed by hand.

Each GPU measurement the course quotes lives in one tracked file there; a lesson or a report that
needs one reads it through `kept_figure`, which returns it with the machine and the date it was measured
on, so that the number cannot drift from its source and never appears without them.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

KEPT_RUNS = Path(__file__).resolve().parents[1] / "docs" / "device-runs"


@dataclass(frozen=True)
class KeptFigure:
    value: float
    machine: str     # e.g. "NVIDIA H200"
    date: str        # YYYY-MM-DD
    source: str      # the file, relative to docs/device-runs, and the keys read

    def row(self) -> dict:
        """A table row: value, machine, date, source."""
        return {"value": self.value, "machine": self.machine, "date": self.date, "source": self.source}


def kept_runs(root: Path = KEPT_RUNS) -> list[str]:
    """The kept runs' folder names."""
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def _load(run: str, file: str, root: Path) -> dict:
    folder = root / run
    if not folder.is_dir():
        raise FileNotFoundError(f"run {run!r}: no kept run of that name in {root}; kept runs: {kept_runs(root)}")
    path = folder / file
    if not path.is_file():
        have = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.json"))
        raise FileNotFoundError(f"file {file!r}: not in the kept run {run}; its JSON files: {have}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"file {run}/{file} is not valid JSON ({exc}): restore it from git") from None


def machine_and_date(run: str, root: Path = KEPT_RUNS, meta: dict | None = None) -> tuple[str, str]:
    """Where and when a kept run was measured: the `meta` of the benchmark file a figure comes from (device,
    date), where given; else the platform record of any of its labs' results.json, and its run.json's start.
    Else the date its folder name begins with. A kept run may hold benchmark files from several machines,
    so a benchmark's own meta names its figure's machine."""
    folder = root / run
    if not folder.is_dir():
        raise FileNotFoundError(f"run {run!r}: no kept run of that name in {root}; kept runs: {kept_runs(root)}")
    machine = date = None
    if isinstance(meta, dict) and meta.get("device"):
        machine, date = meta["device"], str(meta.get("date") or "")[:10] or None
    else:
        for res in sorted(folder.glob("*/results.json")):
            platform = json.loads(res.read_text()).get("platform") or {}
            if platform.get("device_name"):
                machine = platform["device_name"]
                break
    if date is None and (folder / "run.json").is_file():
        started = json.loads((folder / "run.json").read_text()).get("started") or ""
        date = started[:10] or None
    if date is None and (m := re.match(r"(\d{4})(\d{2})(\d{2})", run)):
        date = "-".join(m.groups())
    if machine is None or date is None:
        raise ValueError(f"run {run!r}: its machine ({machine}) or date ({date}) is not recorded "
                         "(a results.json with a platform record or the benchmark file's meta.device, a run.json "
                         "with 'started'); quote it by hand with the machine and date from its README instead")
    return machine, date


def kept_figure(run: str, file: str, *keys: str | int, root: Path = KEPT_RUNS) -> KeptFigure:
    """The number at `keys` in a kept run's JSON file, with its machine and date.

    kept_figure("20261125-121339-h200", "01_env/results.json", "headline", "copy GB/s")
    """
    node = _load(run, file, root)
    meta = node.get("meta") if isinstance(node, dict) else None
    for i, key in enumerate(keys):
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            where = "/".join(map(str, keys[:i])) or "the top"
            have = list(node)[:20] if isinstance(node, dict) else f"a {type(node).__name__}"
            raise KeyError(f"keys {keys}: {key!r} is not at {where} of {run}/{file}; there: {have}") from None
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        raise ValueError(f"keys {keys} of {run}/{file} hold {node!r}, not a number")
    machine, date = machine_and_date(run, root, meta)
    return KeptFigure(float(node), machine, date, f"{run}/{file}: {' / '.join(map(str, keys))}")

"""No measured figure is typed by hand: utils.kept_runs reads one from a kept run, and a scan of the course's
text finds figures stated without their machine and date.

The rule the scan applies:
- Scanned: every lab notebook (markdown cells; code cells' comments: code's own numbers are parameters,
  exercise inputs or computed), README.md, docs/*.md (the top level; docs/device-runs/ is where the figures
  live) and ci/profiles/*.yaml (comments). Generated files (docs/bad-inputs.md) are not scanned.
- A figure is a number or range with a unit of time (µs, us, ms, s, min), of rate (GB/s, TB/s, GFLOP/s,
  TFLOP/s, TOP/s), a percentage (%), a multiplier (×, x) or a "-fold" word (twofold, fivefold, ...).
- It is not a measurement, and is allowed, when it is
  - a setting or bound: right after <, >, ≤, ≥, =, ±, ~= or one of at, near, exceed, below, above, under,
    over, past, within, at most, at least, up to, every, limit, cap, target, timeout, budget, threshold, or
    right before limit, time limit, cap, timeout, budget, target, deadline;
  - a band of a verdict: right before healthy, degraded, critical, expected, investigate, suspect, pass, fail;
  - a shape or formula: a multiplier between numbers (2×2, 128 × 256) or before "(" (4 × (u + ...));
  - a scale factor: a multiplier followed by larger, smaller, wider, narrower, more or fewer;
  - a statistic's level: a percentage followed by interval, CI or confidence, or in a sentence that defines
    a percentile.
- Any other figure is a measurement. It is allowed only in a sentence (markdown, soft-wrapped lines joined),
  a table row or a comment line that names a machine (H100, H200, RTX 4090, MI300, CPU, ...) and a date
  (YYYY-MM-DD); a table row may take them from its header row. Otherwise read it through utils.kept_runs
  in a code cell, or name the machine and date.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from utils import kept_runs

ROOT = Path(__file__).resolve().parents[1]
GENERATED = {"docs/bad-inputs.md"}
# Flagged text left as it is, each with the reason (the test fails once one is fixed: the list only shrinks).
KNOWN: set = set()

UNIT = r"(?:µs|us|ms|s|min|GB/s|TB/s|GFLOP/s|TFLOP/s|TOP/s|%|×|x)"
FIGURE = re.compile(r"(?<![\w.^/-])(\d+(?:[.,]\d+)*(?:\s?[-–]\s?\d+(?:\.\d+)?)?)\s?(" + UNIT + r")(?![\w/])"
                    r"|\b(two|three|four|five|six|seven|eight|nine|ten)fold\b", re.I)
SETTING = re.compile(r"(?:[<>≤≥=±]|~=|\b(?:at|near|exceed|below|above|under|over|past|within|at most|at least|up to|every|"
                     r"limit|cap|target|timeout|budget|threshold)\b)\s*(?:\*\*)?\s*$", re.I)
SETTING_AFTER = re.compile(r"\s*(?:time\s+)?(?:limit|cap|timeout|budget|target|deadline)\b", re.I)
VERDICT = re.compile(r"[\s`'\"*]*(healthy|degraded|critical|expected|investigate|suspect|pass|fail)", re.I)
MACHINE = re.compile(r"\b(?:H100|H200|A100|RTX\s?4090|4090|MI300X?|CPU)\b")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")


def measured(line: str) -> list[str]:
    """The figures in a sentence that the rule counts as measurements."""
    found = []
    for m in FIGURE.finditer(line):
        before, after = line[:m.start()], line[m.end():]
        unit = (m.group(2) or "").lower()
        if SETTING.search(before) or SETTING_AFTER.match(after):
            continue
        if unit in ("×", "x") and re.match(r"\s*(\d|\(|(larger|smaller|wider|narrower|more|fewer)\b)", after, re.I):
            continue                                # a shape, a formula or a scale factor
        if unit == "%" and (re.match(r"\s*(interval|CI|confidence)\b", after, re.I) or "percentile" in line):
            continue
        if VERDICT.match(after):
            continue
        found.append(m.group(0))
    return found


def dated(line: str) -> bool:
    return bool(MACHINE.search(line) and DATE.search(line))


def sentences(text: str) -> list[str]:
    """A markdown text cut into the units the rule reads: sentences (soft-wrapped lines joined, a list item
    or quote line starting a new one) and table rows, a row carrying its table's header row; fenced code
    and headings left out."""
    units, para, header, fenced = [], [], "", False

    def flush():
        if para:
            units.extend(re.split(r"(?<=[.!?])\s+(?=[A-Z*`(\[\"])", " ".join(para)))
            para.clear()
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            flush()
            fenced = not fenced
            continue
        if fenced:
            continue
        if stripped.startswith("|"):
            flush()
            header = header or stripped
            units.append(stripped if stripped == header or dated(stripped) else f"{stripped} {header}")
            continue
        header = ""
        if not stripped or stripped.startswith("#"):
            flush()
            continue
        if re.match(r"([-*>]|\d+\.)\s", stripped):
            flush()
        para.append(stripped)
    flush()
    return units


def scanned_lines(root: Path = ROOT):
    """(file, unit) for every unit of text the rule reads: markdown sentences and table rows, comment lines."""
    def comments(text):
        return [m.group(1) for m in re.finditer(r"(?:^|\s)#\s?(.*)$", text, re.M)]

    for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        rel = str(p.relative_to(root))
        if p.exists() and rel not in GENERATED:
            yield from ((rel, u) for u in sentences(p.read_text()))
    for p in sorted((root / "ci" / "profiles").glob("*.yaml")):
        yield from ((str(p.relative_to(root)), c) for c in comments(p.read_text()))
    for nb in sorted((root / "labs").glob("*/*.ipynb")):
        rel = str(nb.relative_to(root))
        for cell in json.loads(nb.read_text())["cells"]:
            text = "".join(cell["source"])
            if cell["cell_type"] == "markdown":
                yield from ((rel, u) for u in sentences(text))
            elif cell["cell_type"] == "code":
                yield from ((rel, c) for c in comments(text))


def undated_figures(root: Path = ROOT) -> list[tuple[str, str, list[str]]]:
    return [(name, line, figs) for name, line in scanned_lines(root) if (figs := measured(line)) and not dated(line)]


def test_no_measured_figure_without_its_machine_and_date():
    found = undated_figures()
    fixed = {k for k in KNOWN if not any(n == k[0] and k[1] in line for n, line, _ in found)}
    assert not fixed, f"fixed, take them out of KNOWN: {sorted(fixed)}"
    left = [f"{name}: {figs} in: {line.strip()[:160]}" for name, line, figs in found
            if not any(n == name and text in line for n, text in KNOWN)]
    assert not left, ("measured figures typed without machine and date (read them with utils.kept_runs, or "
                      "name the machine and YYYY-MM-DD on the line):\n" + "\n".join(left))


@pytest.mark.parametrize("line", [
    "cosine ≥ 0.99 healthy", "a 24 GiB cap", "a 30 s time limit", "timeout_s: 30", "within 10 %",
    "below 5 % expected, 5–10 % investigate, above 10 % suspect", "the 2×2 table", "a 128 × 256 × 64 tile",
    "`4 × (u_out + √K · u_fp32)`", "made 256× larger moves", "the 95 % interval", "every 50 ms",
    "at most 1.2e-7", "about 1 FLOP per byte",
])
def test_settings_shapes_and_formulas_are_not_measurements(line):
    assert measured(line) == []


@pytest.mark.parametrize("line, figures", [
    ("torch._int_mm reached 127.6 TOP/s while bf16 reached 786.7 TFLOP/s", ["127.6 TOP/s", "786.7 TFLOP/s"]),
    ("about 5x faster per step", ["5x"]), ("cuts that about fivefold", ["fivefold"]),
    ("a decode step cost 110 ms (BF16)", ["110 ms"]), ("17-21 % faster in short bursts", ["17-21 %"]),
    ("12.0 us hot against 15.4 us cold", ["12.0 us", "15.4 us"]), ("took 111 s", ["111 s"]),
    ("golden 9.2 min per model", ["9.2 min"]), ("3,366 GB/s copy", ["3,366 GB/s"]),
])
def test_measurements_are_found(line, figures):
    assert measured(line) == figures


def test_a_machine_and_a_date_on_the_line_or_the_table_header_allow_a_figure(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "On the H200 (2026-11-25) the GEMV took 11.7 µs.\n"
        "The GEMV took 11.7 µs on the H200.\n"
        "| decision | measured (H200, 2026-11-24) |\n|---|---|\n| tile | 12.5 us |\n\n"
        "| decision | measured |\n|---|---|\n| tile | 13.1 us |\n")
    found = [(line.split(" |")[0] if line.startswith("|") else line, figs) for _, line, figs in undated_figures(tmp_path)]
    assert found == [("The GEMV took 11.7 µs on the H200.", ["11.7 µs"]), ("| tile", ["13.1 us"])]


# utils.kept_runs

RUN = "20261125-121339-h200"


def test_kept_figure_reads_the_number_with_its_machine_and_date():
    f = kept_runs.kept_figure(RUN, "01_env/results.json", "headline", "matmul int8 TOP/s (n=8192)")
    raw = json.loads((kept_runs.KEPT_RUNS / RUN / "01_env" / "results.json").read_text())
    assert f.value == raw["headline"]["matmul int8 TOP/s (n=8192)"]
    assert (f.machine, f.date) == ("NVIDIA H200", "2026-11-25")
    assert f.source == f"{RUN}/01_env/results.json: headline / matmul int8 TOP/s (n=8192)"
    assert f.row()["machine"] == "NVIDIA H200"


def test_kept_figure_reads_into_lists():
    f = kept_runs.kept_figure(RUN, "01_env/results.json", "data", "ceilings", "matmul", 3, "tflops")
    assert f.value > 0


def _kept(tmp_path, results=None, run_json=None, name="20261201-000000-x"):
    run = tmp_path / name
    (run / "01_env").mkdir(parents=True)
    (run / "01_env" / "results.json").write_text(json.dumps(results or {"platform": {"device_name": "RTX 4090"},
                                                                         "headline": {"copy GB/s": 900.5, "ok": True}}))
    if run_json is not None:
        (run / "run.json").write_text(json.dumps(run_json))
    return name


def test_date_from_run_json_else_the_folder_name(tmp_path):
    a = _kept(tmp_path, run_json={"started": "2026-12-02T10:00:00+00:00"})
    assert kept_runs.machine_and_date(a, tmp_path) == ("RTX 4090", "2026-12-02")
    b = _kept(tmp_path, name="20261203-lab-x")
    assert kept_runs.kept_figure(b, "01_env/results.json", "headline", "copy GB/s", root=tmp_path).date == "2026-12-03"


def test_a_benchmarks_meta_names_the_machine_and_date(tmp_path):
    run = tmp_path / "20261204-bench-x" / "run1"
    run.mkdir(parents=True)
    (run / "bench.json").write_text(json.dumps({"meta": {"device": "NVIDIA H100 80GB HBM3", "date": "2026-12-05 10:00 UTC"},
                                                 "rows": [{"seconds": 12.5}]}))
    f = kept_runs.kept_figure("20261204-bench-x", "run1/bench.json", "rows", 0, "seconds", root=tmp_path)
    assert (f.value, f.machine, f.date) == (12.5, "NVIDIA H100 80GB HBM3", "2026-12-05")
    # each benchmark file names its own machine: another run in the same folder, on another card
    (tmp_path / "20261204-bench-x" / "run2").mkdir()
    (tmp_path / "20261204-bench-x" / "run2" / "bench.json").write_text(json.dumps(
        {"meta": {"device": "NVIDIA H200"}, "rows": [{"seconds": 9.0}]}))
    g = kept_runs.kept_figure("20261204-bench-x", "run2/bench.json", "rows", 0, "seconds", root=tmp_path)
    assert (g.machine, g.date) == ("NVIDIA H200", "2026-12-04")                     # the folder's date
    (run / "bench.json").write_text(json.dumps({"meta": {"torch": "2.11"}, "rows": [{"seconds": 1.0}]}))
    with pytest.raises(ValueError, match=r"machine \(None\)"):
        kept_runs.kept_figure("20261204-bench-x", "run1/bench.json", "rows", 0, "seconds", root=tmp_path)


def test_bad_requests_say_what_is_there(tmp_path):
    from bad_input_table import record
    name = _kept(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"run 'nope'.*kept runs: \['20261201-000000-x'\]") as e:
        kept_runs.kept_figure("nope", "01_env/results.json", "headline", root=tmp_path)
    record("kept run", "a run that is not kept", str(e.value))
    with pytest.raises(FileNotFoundError, match=r"file '02_models/results.json'.*01_env/results.json") as e:
        kept_runs.kept_figure(name, "02_models/results.json", "headline", root=tmp_path)
    record("kept run", "a file the run does not have", str(e.value))
    with pytest.raises(KeyError, match=r"'copy' is not at headline.*copy GB/s") as e:
        kept_runs.kept_figure(name, "01_env/results.json", "headline", "copy", root=tmp_path)
    record("kept run", "a key the file does not have", str(e.value))
    with pytest.raises(ValueError, match="not a number"):
        kept_runs.kept_figure(name, "01_env/results.json", "headline", "ok", root=tmp_path)
    bare = _kept(tmp_path, results={"headline": {"x": 1}}, name="nodate")
    with pytest.raises(ValueError, match=r"machine \(None\)"):
        kept_runs.kept_figure(bare, "01_env/results.json", "headline", "x", root=tmp_path)

"""Time a whole grading round: STUDENTS students x every lab, as a class would hand them in.

    nice .venv/bin/python scripts/bench_grading.py [--students 30] [--sandbox auto] [--out DIR]

Each student's lab is one of three kinds, in turn: complete (the source notebook), blank (the release,
untouched) or one wrong answer (a solution returning 0). The round is `python -m ci.grade`, timed
whole; the table gives the round, the release, and the seconds per submission (median, max) from the
round's summary.json, with the machine and the date. Nothing is written outside --out (a new folder;
default: a temporary one, removed after).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ci import grade  # noqa: E402

SOLUTION = re.compile(r"### BEGIN SOLUTION.*?### END SOLUTION", re.S)


def make_class(subs: Path, students: int, release: Path) -> int:
    labs = grade.graded_labs()
    n = 0
    for i in range(students):
        for j, (lab, nb_path) in enumerate(labs.items()):
            kind = (i + j) % 3
            if kind == 1:
                nb = nbformat.read(release / lab / f"{lab}.ipynb", as_version=4)
            else:
                nb = nbformat.read(nb_path, as_version=4)
                if kind == 2:
                    first = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution"))
                    first.source = SOLUTION.sub("return 0", first.source)
            (subs / f"student{i:02d}").mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, subs / f"student{i:02d}" / f"{lab}.ipynb")
            n += 1
    return n


def cpu_model() -> str:
    try:
        return next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--students", type=int, default=30)
    ap.add_argument("--sandbox", default="auto", choices=("auto", "bwrap", "none"))
    ap.add_argument("--out", type=Path, help="a new folder for the round (default: temporary)")
    a = ap.parse_args(argv)
    if a.students < 1:
        ap.error("--students must be at least 1")
    if a.out is not None and a.out.exists() and any(a.out.iterdir()):
        ap.error(f"--out {a.out} exists and is not empty: give a new folder")
    tmp = tempfile.TemporaryDirectory(prefix="bench-grading-")
    base = a.out or Path(tmp.name)
    assert grade.main(["--release-only", "--out", str(base / "release")]) == 0
    n = make_class(base / "submissions", a.students, base / "release" / "course" / "release")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "ci.grade", "--submissions", str(base / "submissions"),
                        "--out", str(base / "round"), "--sandbox", a.sandbox], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        print(r.stdout[-2000:], r.stderr[-4000:], file=sys.stderr)
        return 1
    s = json.loads((base / "round" / "summary.json").read_text())
    secs = [x["seconds"] for x in s["submissions"]]
    print(f"| machine | date (UTC) | sandbox | submissions | round (s) | release + answer key (s) | "
          f"per submission median / max (s) |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {cpu_model()}, {os.cpu_count()} cores | {datetime.now(timezone.utc):%Y-%m-%d %H:%M} | "
          f"{s['sandbox'].split(':')[0]} | {n} ({a.students} students x {len(s['labs'])} labs) | {wall:.0f} | "
          f"{s['release_seconds']} | {statistics.median(secs):.1f} / {max(secs):.1f} |")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The run report: every lab's headline numbers and verdicts in one Markdown and one HTML page.

The report reads only what the labs wrote (run.json and each lab's results.json): it recomputes
nothing, so what the instructor reads is exactly what the notebooks measured.
"""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from .results import ResultsError, read_results
from .runs import RUN_MANIFEST

_ICON = {"ok": "OK", "warn": "WARN", "fail": "FAIL", "info": "info"}


def format_value(value: Any) -> str:
    if isinstance(value, float):
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3e}"
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(format_value(v) for v in value)
    return str(value)


def _gather(run_dir: Path) -> tuple[dict, list[tuple[str, dict | None, str]]]:
    manifest = json.loads((run_dir / RUN_MANIFEST).read_text()) if (run_dir / RUN_MANIFEST).is_file() else {}
    labs = [entry["lab"] for entry in manifest.get("labs", [])] or sorted(
        p.name for p in run_dir.iterdir() if p.is_dir())
    out = []
    for lab in labs:
        try:
            out.append((lab, read_results(run_dir / lab), ""))
        except ResultsError as exc:
            status = next((e.get("status") for e in manifest.get("labs", []) if e["lab"] == lab), "")
            out.append((lab, None, status or str(exc)))
    return manifest, out


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fallback_warnings(labs: list[tuple[str, dict | None, str]]) -> list[str]:
    """A line per lab whose recorded models fell back to the embedded fixture."""
    from .fetch import fallback_warning

    return [f"{lab}: {w}" for lab, res, _ in labs if (w := fallback_warning(res))]


def _html_figure(path: Path, rel: str) -> str:
    """The figure inlined as a data URI, so report.html shows it when opened alone (no folder beside it)."""
    import base64
    import mimetypes

    if not path.is_file():
        return f"<p><i>figure missing: {html.escape(rel)}</i></p>"
    mime = mimetypes.guess_type(path.name)[0] or "image/png"
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (f"<figure><img src='data:{mime};base64,{data}' alt='{html.escape(rel)}' style='max-width:900px'>"
            f"<figcaption>{html.escape(rel)}</figcaption></figure>")


def build_report(run_dir: str | Path) -> tuple[Path, Path]:
    """Write report.md and report.html into run_dir; return their paths."""
    from .results import atomic_write_text

    run_dir = Path(run_dir)
    manifest, labs = _gather(run_dir)
    title = f"quant-lab run {run_dir.name}"
    status = manifest.get("status", "unknown")
    md = [f"# {title}", "", f"- profile: `{manifest.get('profile', '?')}`", f"- status: **{status}**",
          f"- started: {manifest.get('started', '?')}; finished: {manifest.get('finished', '-')}"]
    hp = [f"<h1>{html.escape(title)}</h1><ul>",
          f"<li>profile: <code>{html.escape(str(manifest.get('profile', '?')))}</code></li>",
          f"<li>status: <b>{html.escape(status)}</b></li>",
          f"<li>started: {html.escape(str(manifest.get('started', '?')))}; "
          f"finished: {html.escape(str(manifest.get('finished', '-')))}</li></ul>"]
    for warning in _fallback_warnings(labs):   # first lines: the numbers below are not the asked-for models'
        md += ["", f"> **WARNING: {warning}**"]
        hp.append(f"<p style='color:#b00'><b>WARNING: {html.escape(warning)}</b></p>")
    failure = manifest.get("failure")
    if failure:
        word = "INTERRUPTED" if status == "interrupted" else "FAILED"
        msg = (f"{word} in {failure.get('notebook')} at cell {failure.get('cell')}: "
               f"{failure.get('ename')}: {failure.get('evalue')}")
        md += ["", f"> {msg}"]
        hp.append(f"<p style='color:#b00'><b>{html.escape(msg)}</b></p>")
    for lab, res, why in labs:
        md += ["", f"## {lab}"]
        hp.append(f"<h2>{html.escape(lab)}</h2>")
        if res is None:
            md.append(f"_no complete results: {why}_")
            hp.append(f"<p><i>no complete results: {html.escape(why)}</i></p>")
            continue
        rows = [[k, format_value(v)] for k, v in res["headline"].items()]
        if rows:
            md += ["", _md_table(["headline", "value"], rows)]
            hp.append(_html_table(["headline", "value"], rows))
        vrows = [[v.get("check", ""), _ICON.get(v["verdict"], v["verdict"]), v.get("detail", "")]
                 for v in res["verdicts"]]
        if vrows:
            md += ["", _md_table(["check", "verdict", "detail"], vrows)]
            hp.append(_html_table(["check", "verdict", "detail"], vrows))
        for fig in res.get("figures", []):
            rel = f"{lab}/{fig}"
            md += ["", f"![{fig}]({rel})"]
            hp.append(_html_figure(run_dir / lab / fig, rel))
    style = ("<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto}"
             "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px}"
             "th{background:#eee}figcaption{font-size:80%;color:#555}</style>")
    md_path = atomic_write_text(run_dir / "report.md", "\n".join(md) + "\n")
    html_path = atomic_write_text(run_dir / "report.html",
                                  f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
                                  f"</title>{style}</head><body>{''.join(hp)}</body></html>\n")
    return md_path, html_path

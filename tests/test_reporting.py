import json

from utils import reporting, results


def test_report_gathers_headlines_verdicts_and_failure(tmp_path):
    results.write_results(tmp_path / "01_env", "01_env", headline={"copy GB/s": 2989.123, "tiny": 1e-7},
                          verdicts=[{"check": "matmul <b>", "verdict": "ok", "detail": "x|y"}],
                          figures=["figures/ceilings.png"])
    (tmp_path / "run.json").write_text(json.dumps({
        "profile": "cpu-tiny", "status": "failed",
        "labs": [{"lab": "01_env", "status": "complete"}, {"lab": "02_models", "status": "failed"}],
        "failure": {"notebook": "labs/02_models/02_models.ipynb", "cell": "[3]", "ename": "OSError",
                    "evalue": "no model"}}))
    md_path, html_path = reporting.build_report(tmp_path)
    md, page = md_path.read_text(), html_path.read_text()
    assert "| copy GB/s | 2989 |" in md and "1.000e-07" in md
    assert "x\\|y" in md  # a pipe in a cell must not break the Markdown table
    assert "FAILED in labs/02_models/02_models.ipynb at cell [3]: OSError: no model" in md
    assert "## 02_models" in md and "no complete results: failed" in md
    assert "![figures/ceilings.png](01_env/figures/ceilings.png)" in md
    assert "matmul &lt;b&gt;" in page and "<b>failed</b>" in page  # escaped user text, real markup


def test_format_value():
    assert reporting.format_value(0.5) == "0.5"
    assert reporting.format_value(123456.0) == "1.235e+05"
    assert reporting.format_value([1.0, "a"]) == "1, a"


def test_html_report_embeds_its_figures_and_gives_the_times(tmp_path):
    import base64

    png = b"\x89PNG\r\n\x1a\n" + b"fake image bytes"
    (tmp_path / "01_env" / "figures").mkdir(parents=True)
    (tmp_path / "01_env" / "figures" / "ceilings.png").write_bytes(png)
    results.write_results(tmp_path / "01_env", "01_env", figures=["figures/ceilings.png", "figures/gone.png"])
    (tmp_path / "run.json").write_text(json.dumps({
        "profile": "cpu-tiny", "status": "complete", "started": "2026-11-25T10:00:00+00:00",
        "finished": "2026-11-25T10:07:30+00:00", "labs": [{"lab": "01_env", "status": "complete"}]}))
    _, html_path = reporting.build_report(tmp_path)
    page = html_path.read_text()
    # opened alone (mailed, uploaded as a CI artefact) the page still shows its figures
    assert f"src='data:image/png;base64,{base64.b64encode(png).decode()}'" in page
    assert "01_env/figures/ceilings.png" in page                       # still named
    assert "figure missing: 01_env/figures/gone.png" in page          # said, not a broken image
    assert "2026-11-25T10:00:00+00:00" in page and "2026-11-25T10:07:30+00:00" in page

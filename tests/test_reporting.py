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


def test_report_shows_the_logit_check_over_all_positions_and_non_finite_verdicts(tmp_path):
    headline = {"logit cosine worst / p1 / mean": "0.8517 / 0.9866 / 0.9991", "logit verdict": "degraded",
                "top-1 changed %": 9.254, "logit positions": 1502}
    verdicts = [{"check": "logit check, all positions", "verdict": "warn",
                 "detail": "1502 positions of 50 prompts: worst 0.8517 (critical), p1 0.9866 (degraded)"},
                {"check": "first module below threshold (propagated)", "verdict": "fail",
                 "detail": "model.layers.2.mlp: non-finite (96 values NaN/Inf)"}]
    results.write_results(tmp_path / "04_divergence", "04_divergence", headline=headline, verdicts=verdicts,
                          data={"logit_check": {"cosine_p1": float("nan")}})
    md_path, html_path = reporting.build_report(tmp_path)
    md, page = md_path.read_text(), html_path.read_text()
    for text in ("| logit cosine worst / p1 / mean | 0.8517 / 0.9866 / 0.9991 |", "| top-1 changed % | 9.254 |",
                 "| logit positions | 1502 |", "worst 0.8517 (critical), p1 0.9866 (degraded)",
                 "| first module below threshold (propagated) | FAIL | model.layers.2.mlp: non-finite (96 values"):
        assert text in md, text
    assert "non-finite (96 values NaN/Inf)" in page and "top-1 changed %" in page

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


def test_report_shows_lab04_logit_check_and_non_finite_verdicts(tmp_path):
    """Lab 04's verdict rows, made by its helpers from a model with an Inf weight, read in the report."""
    import copy

    import torch

    from tests.test_divergence import prompts, tiny_qwen2
    from utils import divergence as dv
    from utils import localize as lz
    golden = tiny_qwen2()
    bad = copy.deepcopy(golden)
    with torch.no_grad():
        bad.model.layers[2].mlp.down_proj.weight[0, 0] = float("inf")
    ids = prompts(2)
    rows = lz.compare_layers(bad, ids, lz.golden_layer_capture(golden, ids), "propagated")
    lg, lt = dv.corpus_logits(golden, ids), dv.corpus_logits(bad, ids)
    check, healthy = dv.logit_check(lg, lt), dv.logit_check(lg, [x.clone() for x in lg])
    kl = dv.kl_summary(dv.kl_token_stats(lg, lt, ids))
    verdicts = [dv.logit_check_verdict(check, rows), dv.logit_check_verdict(healthy, rows, "healthy copy"),
                dv.kl_verdict(kl, rows), lz.layer_verdict(rows, "propagated")]
    headline = {"logit cosine worst / p1 / mean": "0.8517 / 0.9866 / 0.9991", "top-1 changed %": 9.254,
                "logit positions": healthy["positions"]}
    results.write_results(tmp_path / "04_divergence", "04_divergence", headline=headline, verdicts=verdicts)
    md_path, html_path = reporting.build_report(tmp_path)
    md, page = md_path.read_text(), html_path.read_text()
    nf = next(r for r in rows if r["module"] == "model.layers.2.mlp")["nonfinite"]
    for text in ("| logit cosine worst / p1 / mean | 0.8517 / 0.9866 / 0.9991 |", "| top-1 changed % | 9.254 |",
                 f"| logit positions | {healthy['positions']} |",
                 "| logit check, all positions (report thresholds) | FAIL | non-finite: ",
                 "first module with NaN/Inf: model.layers.2.mlp",
                 f"| first module failing the rule (propagated) | FAIL | model.layers.2.mlp: non-finite ({nf} NaN/Inf",
                 "| KL statistics | FAIL | non-finite: KL is NaN/Inf at ",
                 f"| healthy copy | OK | {healthy['positions']} positions of 2 prompts, cosine / normalized L2: worst 1.0000 / 0 (healthy",
                 "top-1 changed at 0 positions", "Rule: the verdict is that of the mean cosine"):
        assert text in md, text
    assert "first module with NaN/Inf: model.layers.2.mlp" in page and "top-1 changed %" in page


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


def test_an_interrupted_run_is_reported_as_interrupted_not_failed(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({
        "profile": "cpu-tiny", "status": "interrupted",
        "labs": [{"lab": "03_eval", "status": "interrupted"}],
        "failure": {"notebook": "labs/03_eval/03_eval.ipynb", "cell": "[5]", "ename": "Interrupted",
                    "evalue": "interrupted by SIGTERM"}}))
    md = reporting.build_report(tmp_path)[0].read_text()
    assert "INTERRUPTED in labs/03_eval/03_eval.ipynb at cell [5]" in md and "FAILED" not in md

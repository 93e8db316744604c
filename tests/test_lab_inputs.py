"""What a lab reads from earlier labs: the model folders and the GSM8K questions."""
import subprocess
from pathlib import Path
import sys

import pytest

from utils import lab_inputs


def test_resolve_models_reads_lab02_else_fixture_only(tmp_path):
    from utils import results
    empty = tmp_path / "run0"
    empty.mkdir()
    fb = lab_inputs.resolve_models(str(empty), "fixture", "fixture")
    assert fb["source"] == "fixture" and fb["golden"].endswith("bf16") and "no Lab 02" in fb["note"]
    assert fb["used"] == "golden: fixture tiny-qwen2-gsm/bf16; int4: fixture tiny-qwen2-gsm/gptq-int4" and not fb["fallback"]
    with pytest.raises(results.ResultsError, match="Lab 02"):
        lab_inputs.resolve_models(str(empty), "Qwen/Qwen2.5-7B-Instruct", "fixture")
    run = tmp_path / "run1"
    results.write_results(run / "02_models", "02_models", data={
        "models": {"golden": {"path": "/m/g", "id": "g", "source": "local"},
                   "int4": {"path": "/m/q", "id": "q", "source": "local"}},
        "gsm8k": {"train": None, "test": "/d/test.jsonl", "source": "local"}})
    got = lab_inputs.resolve_models(str(run), "x", "y")
    assert (got["golden"], got["int4"], got["test"], got["source"]) == ("/m/g", "/m/q", "/d/test.jsonl", "local")
    assert got["used"] == "golden: local g; int4: local q" and got["fallback"] is False
    run2 = tmp_path / "run2"        # a fallback recorded by Lab 02 is named in what Lab 04 reports
    results.write_results(run2 / "02_models", "02_models", data={
        "models": {"golden": {"path": "/f/g", "id": "tiny-qwen2-gsm/bf16", "source": "fixture", "fallback": True,
                              "requested": "Qwen/Qwen2.5-7B-Instruct", "note": "fallback: no network"},
                   "int4": {"path": "/m/q", "id": "q", "source": "local"}}})
    fell = lab_inputs.resolve_models(str(run2), "x", "y")
    assert fell["fallback"] is True and "FIXTURE tiny-qwen2-gsm/bf16 instead of Qwen/Qwen2.5-7B-Instruct" in fell["used"]


def test_gsm8k_questions(tmp_path):
    f = tmp_path / "test.jsonl"
    f.write_text('{"question": "a?", "answer": "#### 1"}\n{"question": "b?", "answer": "#### 2"}\n')
    assert lab_inputs.gsm8k_questions(str(f), None) == ["a?", "b?"]
    assert lab_inputs.gsm8k_questions(str(f), 1) == ["a?"]
    with pytest.raises(FileNotFoundError, match="Lab 02"):
        lab_inputs.gsm8k_questions(str(tmp_path / "nope.jsonl"), 5)
    with pytest.raises(ValueError, match="offline"):
        lab_inputs.gsm8k_questions(None, 5, offline=True)


def test_capture_does_not_import_divergence():
    """The layering: capture (low) never pulls in divergence (the lab's analysis on top of it), not even
    when it compares two captures."""
    from pathlib import Path
    code = ("import utils.capture, sys; assert 'utils.divergence' not in sys.modules\n"
            "import torch; from utils import capture as c\n"
            "m = {'n_prompts': 1, 'modules': ['model.layers.0']}\n"
            "t = {'ids/0': torch.ones(3), 'logits/0': torch.ones(3, 4), 'model.layers.0/0': torch.ones(3, 2)}\n"
            "c.compare_captures(c.Capture(t, m), c.Capture(dict(t), m))\n"
            "assert 'utils.divergence' not in sys.modules, 'compare_captures imported utils.divergence'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])


def test_empty_quantlab_folders_mean_unset_not_the_current_folder(monkeypatch, tmp_path):
    """Path("") is the current folder: a notebook's own lab folder would fill with runs or model snapshots."""
    from utils import fetch, runs
    monkeypatch.setenv("QUANTLAB_RUNS", "")
    monkeypatch.setenv("QUANTLAB_MODELS", " ")
    assert runs.runs_root() == runs.REPO_ROOT / "runs"
    assert fetch.default_cache_dir() == Path.home() / ".cache" / "quant-lab" / "models"


@pytest.mark.parametrize("kw, message", [
    ({"cache_dir": "FILE"}, r"cache_dir: .*afile is a file, not a folder"),
    ({"revision": ""}, r"revision: '' must name a modelscope revision"),
    ({"timeout_s": float("nan")}, r"fetch_timeout_s: nan must be a finite number of seconds > 0"),
    ({"timeout_s": "60"}, r"fetch_timeout_s: '60' must be a finite number"),
])
def test_fetch_settings_of_a_hub_model_are_checked_before_any_folder_is_made(tmp_path, kw, message):
    from utils import fetch
    (tmp_path / "afile").write_text("")
    kw = {"cache_dir": tmp_path / "cache", **kw}
    if kw["cache_dir"] == "FILE":
        kw["cache_dir"] = tmp_path / "afile"
    with pytest.raises(fetch.FetchError, match=message):
        fetch.resolve_model("Qwen/Qwen2.5-7B-Instruct", "golden", offline=False, **kw)
    assert not (tmp_path / "cache").exists()

"""Lab 04 run on a pair whose second model scales every logit (the final norm's weight times s): the lab's logit
verdict and its per-layer `logits` row agree, and both see the scaling that cosine cannot."""
import json
import os
import shutil
from pathlib import Path

import pytest

from utils import divergence as dv
from utils import localize as lz
from utils import results
from utils.fixture import fixture_paths

REPO = Path(__file__).resolve().parents[1]
FIX = fixture_paths()
SMALL = {"device": "cpu", "gsm8k_limit": 4, "kl_prompts": 4, "kl_max_tokens": 32, "batch_size": 4,
         "layer_prompts": 2, "layer_max_tokens": 16, "plant_fault_layer": -1, "reference_capture": "",
         "capture_prompts": 1, "capture_max_tokens": 8, "capture_cpu_fp32": False, "determinism_runs": 2}


def scaled_copy(dest: Path, s: float) -> Path:
    """The fixture's golden model with model.norm.weight times s: every logit times s, nothing else changed."""
    from safetensors.torch import load_file, save_file
    shutil.copytree(FIX["golden"], dest)
    tensors = load_file(str(dest / "model.safetensors"))
    tensors["model.norm.weight"] = (tensors["model.norm.weight"].float() * s).to(tensors["model.norm.weight"].dtype)
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


@pytest.mark.parametrize("s, expected", [(0.1, "critical"), (1.3, "degraded")])
def test_lab04_logit_verdict_and_logits_row_agree_on_a_scaling(tmp_path, monkeypatch, s, expected):
    import papermill

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    monkeypatch.delenv("QUANTLAB_GPTQ_BACKEND", raising=False)
    scaled = scaled_copy(tmp_path / "scaled", s)
    run_dir = tmp_path / "run"
    results.write_results(run_dir / "02_models", "02_models", data={
        "models": {"golden": {"path": str(FIX["golden"]), "id": "fixture/bf16", "source": "fixture"},
                   "int4": {"path": str(scaled), "id": f"golden, final norm x{s}", "source": "local"}},
        "gsm8k": {"test": str(FIX["test"]), "source": "fixture"}})
    nb = REPO / "labs" / "04_divergence" / "04_divergence.ipynb"
    papermill.execute_notebook(str(nb), str(tmp_path / "out.ipynb"), cwd=str(nb.parent), progress_bar=False,
                               parameters={"run_dir": str(run_dir), **SMALL})
    res = results.read_results(run_dir / "04_divergence")
    logit_row = next(v for v in res["verdicts"] if v["check"].startswith("logit check, all positions"))
    layer_row = next(r for r in res["data"]["layers"] if r["module"] == "logits" and r["mode"] == "propagated")
    check = res["data"]["logit_check"]
    assert check["cosine_mean"] == pytest.approx(1.0, abs=1e-4)                        # cosine cannot see it
    assert check["rel_l2_mean"] == pytest.approx(abs(s - 1), rel=0.02)
    assert lz.module_verdict(layer_row) == check["verdict"] == res["headline"]["logit verdict"] == expected
    assert logit_row["verdict"] == dv.VERDICT_STATUS[expected], json.dumps(logit_row)
    assert f"logits row (propagated): {expected}" in logit_row["detail"]

"""The Int4 kernel choice (gptq_backend) reaches the loader, lm-eval's model arguments and results.json;
ROCm gets only kernels that work there; Lab 03's speed levers reach lm-eval; the report's anchors."""
import json
import os
from pathlib import Path

import pytest

from ci import run as chain
from utils import anchors, models
from utils import evaluation as ev
from utils.eval_settings import EvalSettings
from utils.platform import PlatformRecord

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "fixtures" / "tiny-qwen2-gsm"
DATA = {"train": FIX / "data" / "train.jsonl", "test": FIX / "data" / "test.jsonl"}


def record(backend):
    return PlatformRecord(backend=backend, vendor="", device_name=f"simulated {backend}", device="cuda")


def test_gptq_backend_policy(monkeypatch):
    monkeypatch.delenv(models.GPTQ_ENV, raising=False)
    assert models.gptq_backend("cpu") == "auto"
    assert models.gptq_backend("cuda", record=record("cuda")) == "quantlab"           # the course's kernel
    assert models.gptq_backend("cuda", record=record("musa")) == "gptq_triton"
    assert models.gptq_backend("cuda", "gptq_marlin", record=record("cuda")) == "gptq_marlin"
    assert models.gptq_backend("cuda", "GPTQ_Torch ", record=record("cuda")) == "gptq_torch"
    monkeypatch.setenv(models.GPTQ_ENV, "gptq_exllama_v2")            # the override beats the parameter
    assert models.gptq_backend("cuda", "gptq_marlin", record=record("cuda")) == "gptq_exllama_v2"


def test_auto_picks_quantlab_only_for_a_4bit_checkpoint(monkeypatch, tmp_path):
    import json

    monkeypatch.delenv(models.GPTQ_ENV, raising=False)
    monkeypatch.setattr(models, "gptq_backend", lambda device, requested="auto", **kw:
                        "quantlab" if requested in ("auto", "quantlab") else requested)   # an NVIDIA GPU's choice
    for bits, auto, named in ((4, "quantlab", "quantlab"), (8, "gptq_triton", "quantlab")):
        d = tmp_path / f"b{bits}"
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "gptq", "bits": bits}}))
        assert models.checkpoint_kernel(d, "cuda") == auto
        assert models.checkpoint_kernel(d, "cuda", "quantlab") == named     # asked for by name: kept, refused later


def test_rocm_gets_only_kernels_that_work_there(monkeypatch):
    monkeypatch.delenv(models.GPTQ_ENV, raising=False)
    rocm = record("rocm")
    assert models.gptq_backend("cuda", record=rocm) == "gptq_torch"                # auto: never "auto" there
    assert models.gptq_backend("cuda", "gptq_triton", record=rocm) == "gptq_triton"
    for cuda_only in ("gptq_marlin", "gptq_machete", "gptq_exllama_v2", "auto_trainable"):
        with pytest.raises(ValueError, match=f"gptq_backend='{cuda_only}' is not a GPTQ kernel that works on ROCm"):
            models.gptq_backend("cuda", cuda_only, record=rocm)
    assert models.gptq_backend("cuda", "gptq_marlin", record=rocm, rocm_safe=False) == "gptq_marlin"
    monkeypatch.setenv(models.GPTQ_ENV, "gptq_marlin")
    with pytest.raises(ValueError, match=r"\$QUANTLAB_GPTQ_BACKEND='gptq_marlin'"):
        models.gptq_backend("cuda", record=rocm)


def test_rocm_profile_selects_rocm_safe_kernels_in_every_lab_that_loads_the_int4_model(tmp_path, monkeypatch):
    monkeypatch.delenv(models.GPTQ_ENV, raising=False)
    prof, labs = chain.load_profile("rocm"), chain.discover_labs()
    chain.check_common_params(prof, labs)                  # rocm_safe_kernels is read, not dropped
    for lab in ("02_models", "03_eval", "04_divergence"):
        params = chain.lab_parameters(prof, lab, labs[lab], tmp_path)
        assert params["rocm_safe_kernels"] is True, lab
        chosen = models.gptq_backend("cuda", params.get("gptq_backend", "auto"), record=record("rocm"),
                                     rocm_safe=params["rocm_safe_kernels"])
        assert chosen in models.ROCM_SAFE_GPTQ, (lab, chosen)
    cuda = chain.load_profile("rtx4090")
    assert "rocm_safe_kernels" not in cuda["params"]


def test_model_args_carry_the_kernel_and_max_length(monkeypatch):
    golden, int4 = str(FIX / "bf16"), str(FIX / "gptq-int4")
    assert ev.model_args(int4, gptq_backend="gptq_torch", max_length=1024) == {
        "pretrained": int4, "dtype": "auto", "max_length": 1024, "gptq_backend": "gptq_torch"}
    assert ev.model_args(golden, gptq_backend="gptq_torch") == {"pretrained": golden, "dtype": "auto"}
    with pytest.raises(ev.EvalInputError, match="max_length: 200 must be a whole number of tokens above max_gen_toks"):
        ev.model_args(golden, max_length=200, max_gen_toks=256)
    # vllm (not installable next to this torch): its arguments, with vllm pretended present
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    args = ev.model_args(int4, "vllm", max_length=1536, gptq_backend="gptq_marlin", tensor_parallel_size=2)
    assert args == {"pretrained": int4, "dtype": "auto", "tensor_parallel_size": 2, "data_parallel_size": 1,
                    "max_gen_toks": 256, "max_length": 1536, "quantization": "gptq_marlin"}
    assert ev.model_args(int4, "vllm", gptq_backend="gptq_triton")["quantization"] == "gptq"
    assert "quantization" not in ev.model_args(golden, "vllm", gptq_backend="gptq_marlin")
    import ast
    import lm_eval.models                  # vllm_causallms imports vllm at once: read its signature instead
    tree = ast.parse((Path(lm_eval.models.__file__).parent / "vllm_causallms.py").read_text())
    init = next(f for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "VLLM"
                for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    accepted = {a.arg for a in init.args.args}
    assert set(args) <= accepted, set(args) - accepted          # every key is one lm-eval's vllm model takes


def test_the_kernel_and_max_length_reach_lm_eval_and_the_results(tmp_path, monkeypatch):
    monkeypatch.delenv(models.GPTQ_ENV, raising=False)
    run = ev.run_gsm8k(str(FIX / "gptq-int4"), tmp_path, label="int4", data_files=DATA, settings=EvalSettings(
        batch_size=2, limit=2, max_gen_toks=16, max_length=2048, gptq_backend="gptq_torch_aten"))
    s = run["settings"]
    assert s["gptq_backend"] == "gptq_torch_aten" and s["gptq_kernels"] == ["TorchAtenLinear"], s
    assert s["max_length"] == 2048 and 0 < s["prompt_tokens"]["max"] < 2048 - 16
    lm_results = next(tmp_path / p for p in run["lm_eval_files"] if Path(p).name.startswith("results_"))
    margs = json.loads(lm_results.read_text())["config"]["model_args"]
    assert margs["gptq_backend"] == "gptq_torch_aten" and margs["max_length"] == 2048, margs
    golden = ev.run_gsm8k(str(FIX / "bf16"), tmp_path, label="golden", data_files=DATA, settings=EvalSettings(
        batch_size=2, limit=2, max_gen_toks=16, gptq_backend="gptq_torch_aten"))
    assert golden["settings"]["gptq_backend"] is None and golden["settings"]["gptq_kernels"] is None
    # a max_length that cuts the prompts is an error naming it, not a silently different benchmark
    short = run["settings"]["prompt_tokens"]["max"] // 2
    with pytest.raises(ev.EvalInputError, match=f"max_length: {short} is too short"):
        ev.run_gsm8k(str(FIX / "bf16"), tmp_path, label="cut", data_files=DATA,
                     settings=EvalSettings(batch_size=2, limit=2, max_gen_toks=16, max_length=short))


def test_lab03_records_the_kernel_and_the_anchor_verdict(tmp_path, monkeypatch):
    import papermill
    from utils import results

    monkeypatch.delenv(models.GPTQ_ENV, raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    run_dir = tmp_path / "run"
    results.write_results(run_dir / "02_models", "02_models", data={
        "models": {"golden": {"path": str(FIX / "bf16"), "id": "fixture/bf16", "source": "fixture"},
                   "int4": {"path": str(FIX / "gptq-int4"), "id": "fixture/gptq-int4", "source": "fixture"}},
        "gsm8k": {"train": str(DATA["train"]), "test": str(DATA["test"]), "source": "fixture"}})
    nb = REPO / "labs" / "03_eval" / "03_eval.ipynb"
    papermill.execute_notebook(str(nb), str(tmp_path / "out.ipynb"), cwd=str(nb.parent), progress_bar=False,
                               parameters={"run_dir": str(run_dir), "device": "cpu", "gsm8k_limit": 2,
                                           "batch_size": 2, "max_gen_toks": 16, "max_length": 2048,
                                           "gptq_backend": "gptq_torch_aten"})
    res = results.read_results(run_dir / "03_eval")
    assert res["headline"]["int4 GPTQ kernel"] == "gptq_torch_aten"
    assert res["data"]["gptq_backend"] == "gptq_torch_aten"
    assert res["data"]["per_model"]["int4"]["settings"]["gptq_kernels"] == ["TorchAtenLinear"]
    assert res["data"]["per_model"]["golden"]["settings"]["max_length"] == 2048
    anchor = [v for v in res["verdicts"] if v["check"] == anchors.CHECK]
    assert anchor and anchor[0]["verdict"] == "info" and "does not apply" in anchor[0]["detail"]


def _run(acc, err=0.011, n=1319):
    return {"n": n, "accuracy": {"flexible-extract": {"acc": acc, "stderr": err},
                                 "strict-match": {"acc": acc, "stderr": err}}}


def test_report_anchors_apply_only_to_qwen25_7b_instruct_5shot_full():
    assert anchors.is_report_model("Qwen/Qwen2.5-7B-Instruct")
    assert anchors.is_report_model("/data/models/qwen2.5-7b-instruct/")
    assert not anchors.is_report_model("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4")
    assert not anchors.is_report_model("fixture/bf16")
    other = anchors.report_anchor_checks("fixture/bf16", _run(0.3), _run(0.2), 5)
    assert [r["verdict"] for r in other] == ["info"] and "does not apply" in other[0]["detail"]
    subset = anchors.report_anchor_checks("Qwen/Qwen2.5-7B-Instruct", _run(0.8, n=64), _run(0.5, n=64), 5)
    assert [r["verdict"] for r in subset] == ["info"] and "on 64" in subset[0]["detail"]
    zero_shot = anchors.report_anchor_checks("Qwen/Qwen2.5-7B-Instruct", _run(0.8), _run(0.5), 0)
    assert [r["verdict"] for r in zero_shot] == ["info"]


def test_report_anchors_verdicts():
    q = "Qwen/Qwen2.5-7B-Instruct"
    healthy = anchors.report_anchor_checks(q, _run(0.790), _run(0.760), 5, "gptq_marlin")
    assert [r["verdict"] for r in healthy] == ["ok", "ok"]
    broken = anchors.report_anchor_checks(q, _run(0.785), _run(0.7399), 5, "gptq_triton")
    assert broken[1]["verdict"] == "fail" and "quantized operators are wrong" in broken[1]["detail"]
    assert "gptq_triton" in broken[1]["detail"]
    assert anchors.report_anchor_checks(q, _run(0.785), _run(0.740), 5)[1]["verdict"] == "ok"   # the floor itself
    far = anchors.report_anchor_checks(q, _run(0.70), _run(0.69), 5)                 # 8.5 points off the report
    assert far[0]["verdict"] == "warn" and far[1]["verdict"] == "fail"
    near = anchors.report_anchor_checks(q, _run(0.785 - 0.030), _run(0.75), 5)      # within 2 x hypot(1.1, 1.1)
    assert near[0]["verdict"] == "ok"

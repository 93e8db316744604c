"""scripts/rehearsal_summary.py: per-lab windows from the timestamped chain log, peaks within them,
Lab 03's extrapolation to 1,319 problems, and the rehearsal profile's shape."""
import importlib.util
import json
import math
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def summary():
    spec = importlib.util.spec_from_file_location("rehearsal_summary", REPO / "scripts" / "rehearsal_summary.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_windows_peaks_and_extrapolation(tmp_path, summary):
    work, run = tmp_path / "w", tmp_path / "run"
    (work / "logs").mkdir(parents=True)
    (work / "peaks").mkdir()
    (work / "logs" / "chain.log").write_text(
        "100 [01_env] running labs/01_env/01_env.ipynb\n110 [01_env] complete in 10.0 s\n"
        "110 [03_eval] running labs/03_eval/03_eval.ipynb\n200 [03_eval] complete in 90.0 s\n")
    (work / "logs" / "smi.csv").write_text("105,1024\n109,2048\n150,20480\n205,30000\n")
    (work / "logs" / "host.csv").write_text(f"105,{2**30}\n150,{5 * 2**30}\n")
    (work / "peaks" / "03_eval.json").write_text(json.dumps(
        {"cap": {"applied": True}, "gpu_peak_allocated_gib": 19.5, "gpu_peak_reserved_gib": 20.1,
         "host_peak_rss_gib": 6.0}))
    (work / "logs" / "build.json").write_text(json.dumps({"bf16": {"bytes": 15_231_233_024}, "int4": {"bytes": 5_500_000_000}}))
    (run / "03_eval").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"status": "complete", "labs": [
        {"lab": "01_env", "status": "complete", "seconds": 10.0}, {"lab": "03_eval", "status": "complete", "seconds": 90.0}]}))
    tp = {"seconds": 60.0, "problems": 64, "generated_tokens": 16384, "problems_per_s": 64 / 60, "tokens_per_s": 273.1}
    # two compiled calls measured: 40 s (with the compile) then 20 s for 256 steps
    decode = {"decode": "compiled", "first_call_s": 40.0, "steady_ms_per_step": 1000 * 20 / 256}
    settings = {"batch_size": 32, "max_gen_toks": 256, "gptq_backend": None, "gptq_kernels": None, "decode": decode}
    (run / "03_eval" / "results.json").write_text(json.dumps({"data": {"per_model": {
        "golden": {"throughput": tp, "settings": settings},
        "int4": {"throughput": tp, "settings": {**settings, "gptq_backend": "gptq_triton",
                                                "gptq_kernels": ["TritonV2QuantLinear"]}}}}}))
    s = summary.summarize(run, work)
    labs = {l["lab"]: l for l in s["labs"]}
    assert labs["01_env"]["smi_peak_gib"] == 2.0 and labs["03_eval"]["smi_peak_gib"] == 20.0
    assert labs["03_eval"]["host_used_peak_gib"] == 5.0 and labs["03_eval"]["gpu_peak_reserved_gib"] == 20.1
    g = {r["model"]: r for r in s["lab03"]}["golden"]
    calls = math.ceil(1319 / 32)                                          # 42, the last one of 7 problems
    assert g["extrapolated_1319_min"] == pytest.approx((calls * 20 + 2 * 20) / 60)  # the compile paid twice
    assert g["ms_per_step"] == pytest.approx(1000 * 20 / 256)
    floor = 1000 * 15_231_233_024 / summary.RTX4090_GBPS                 # 15.1 ms: below the 78 ms measured
    assert g["rtx4090_step_floor_ms"] == pytest.approx(floor)
    assert g["rtx4090_estimate_1319_min"] == pytest.approx(g["extrapolated_1319_min"])
    # a step faster than a 4090 can read the weights: its bandwidth floor decides
    (run / "03_eval" / "results.json").write_text(json.dumps({"data": {"per_model": {"golden": {"throughput": tp,
        "settings": {**settings, "decode": {**decode, "steady_ms_per_step": 5.0, "first_call_s": 1.28}}}}}}))
    g = summary.summarize(run, work)["lab03"][0]
    assert g["rtx4090_estimate_1319_min"] == pytest.approx(floor * calls * 256 / 60000)
    md = summary.markdown(s)
    assert "EXTRAPOLATION" in md and "gptq_triton (TritonV2QuantLinear)" in md and "| 03_eval | complete | 90.0 |" in md


def test_rehearsal_profile_is_rtx4090_with_local_models_and_the_cap():
    from ci import run as chain

    reh, real = chain.load_profile("rehearsal-7b"), chain.load_profile("rtx4090")
    assert reh["env"]["QUANTLAB_GPU_MEMORY_GIB"] == "24" and reh["params"]["offline"] is True
    assert Path(reh["params"]["golden_model"]).name == "bf16" and reh["params"]["gsm8k_limit"] == 64
    for lab in ("01_env", "05_kernels", "04_divergence"):
        differs = {k for k in real["labs"][lab] if real["labs"][lab][k] != reh["labs"][lab].get(k)}
        assert differs <= {"reference_capture"}, (lab, differs)
    assert reh["labs"]["03_eval"] == real["labs"]["03_eval"]


@pytest.mark.parametrize("part", ["part3", "bench2"])
def test_rehearsal_script_refuses_an_unknown_part_before_any_work(part, tmp_path):
    import subprocess

    done = subprocess.run(["bash", str(REPO / "scripts" / "rehearsal_7b.sh"), part], cwd=REPO, capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out")}, timeout=30)
    assert done.returncode == 2 and f"unknown part '{part}'" in done.stderr
    assert not (tmp_path / "out").exists()      # it stopped before making folders or installing wheels

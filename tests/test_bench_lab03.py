"""scripts/bench_lab03.py: bad settings are refused before any work, an earlier run is never overwritten,
and a CPU run compares each setting with its model's baseline (the GPU run is the device machine's job)."""
import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "fixtures" / "tiny-qwen2-gsm"
spec = importlib.util.spec_from_file_location("bench_lab03", REPO / "scripts" / "bench_lab03.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def _args(out, *settings, device="cpu"):
    return ["--golden", str(FIXTURE / "bf16"), "--int4", str(FIXTURE / "gptq-int4"), "--data", str(FIXTURE / "data"),
            "--limit", "2", "--max-gen-toks", "16", "--device", device, "--out", str(out), "--settings", *settings]


@pytest.mark.parametrize("bad, says", [("gold:eager:4", "model golden or int4"), ("golden:eager", "model:decode:batch"),
                                       ("golden:eager:0", "positive integer"), ("golden:eager:x", "positive integer"),
                                       ("golden:fast:4", "decode 'fast' is not one of")])
def test_bad_setting_is_refused_naming_it(bad, says, tmp_path):
    with pytest.raises(SystemExit) as refused:
        bench.main(_args(tmp_path / "out", bad))
    assert f"--settings: {bad!r}" in str(refused.value.code) and says in str(refused.value.code)
    assert not (tmp_path / "out").exists()


def test_cuda_without_a_gpu_says_what_to_do(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the refusal is for one without")
    with pytest.raises(SystemExit, match="--device cuda: torch sees no GPU"):
        bench.main(_args(tmp_path / "out", "golden:eager:2", device="cuda"))
    assert not (tmp_path / "out").exists()


def test_cpu_run_compares_with_the_baseline_and_never_overwrites(tmp_path):
    out = tmp_path / "out"
    assert bench.main(_args(out, "golden:eager:2", "golden:eager:1", "golden:compiled:2")) == 1  # compiled: no GPU
    saved = json.loads((out / "bench_lab03.json").read_text())
    first, second, compiled = saved["rows"]
    assert first["status"] == second["status"] == "ok" and first["baseline"] == second["baseline"] == "golden:eager:2"
    # greedy decoding is deterministic on CPU: batch 1 gives the same answers as batch 2
    assert second["vs_baseline"] == {"compared": 2, "identical_generations": 2, "identical_scores": 2}
    assert second["extrapolated_s"] > 0 and second["decode_run"]["calls"] == 2
    assert compiled["status"] == "failed" and "decode: 'compiled'" in compiled["error"] and "GPU" in compiled["error"]
    table = (out / "bench_lab03.md").read_text()
    assert "| golden:eager:1 | - | 1 | ok |" in table and "- golden:compiled:2: EvalInputError" in table
    before = (out / "bench_lab03.json").read_bytes()
    with pytest.raises(SystemExit, match="already holds an earlier run"):
        bench.main(_args(out, "golden:eager:2"))
    assert (out / "bench_lab03.json").read_bytes() == before

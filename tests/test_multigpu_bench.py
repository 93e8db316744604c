"""scripts/multigpu_bench.py: how `full` picks its number of problems from the warm-up, what its md claims
(never the whole test set unless it ran), a whole `full` part on two CPU processes, and a shard that fails
kept as the finding (the GPU runs are the device machine's job: scripts/multigpu_7b.sh)."""
import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "fixtures" / "tiny-qwen2-gsm"
sys.path.insert(0, str(REPO / "scripts"))
spec = importlib.util.spec_from_file_location("multigpu_bench", REPO / "scripts" / "multigpu_bench.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
import multigpu_md as md  # noqa: E402


def _warm(calls=((16, 30.0), (16, 2.56), (8, 20.0)), wall=60.0, gen=40.0, n=40):
    """A warm-up launch's result as run_gsm8k_parallel returns it (only what plan_limit reads): 256 steps a call."""
    per_call = [{"batch": b, "steps": 256, "seconds": sec} for b, sec in calls]
    return {"n": n, "parallel": {"wall_seconds": wall, "workers": [
        {"throughput": {"seconds": gen}, "decode": {"per_call": per_call}}]}}


def test_the_whole_test_set_when_both_launches_fit():
    p = bench.plan_limit(_warm(), target=1319, gpus=2, batch=16, max_gen_toks=256, seconds=1000)
    # fixed 20 s; a full call 2.56 s, x 1.1 to be safe; a warm compile half of the cold one (30 - 2.56); the
    # smaller last batch (7 on 1 GPU, 4 and 3 on 2) compiles its own shape: 20 - 2.56 more, as in the warm-up
    assert bench.CALL_SAFETY == 1.1 and p["limit"] == 1319 and p["why"] == ""
    assert (p["call_s"], p["warm_compile_s"], p["smaller_last_batch_s"]) == pytest.approx((2.816, 13.72, 17.44))
    assert p["predicted_s"][1] == pytest.approx(20 + 13.72 + 83 * 2.816 + 17.44)
    assert p["predicted_s"][2] == pytest.approx(20 + 13.72 + 42 * 2.816 + 17.44)


def test_the_most_problems_that_fit_below_the_whole_set():
    p = bench.plan_limit(_warm(), target=1319, gpus=2, batch=16, max_gen_toks=256, seconds=300)
    n = p["limit"]
    assert n == 864 and sum(p["predicted_s"].values()) <= 300            # a multiple of 32: no smaller last batch
    assert p["predicted_s"][1] == pytest.approx(20 + 13.72 + 54 * 2.816)
    over = bench.plan_limit(_warm(), target=n + 32, gpus=2, batch=16, max_gen_toks=256, seconds=300)
    assert over["limit"] == n                                           # 32 more would not have fitted
    assert "1,319 would take about 454 s" in p["why"]


def test_nothing_runs_when_not_even_one_round_fits_and_it_says_why():
    p = bench.plan_limit(_warm(), target=1319, gpus=2, batch=16, max_gen_toks=256, seconds=60)
    assert p["limit"] is None and "even 32 problems" in p["why"] and "60 s left" in p["why"]


def test_without_a_smaller_warm_up_batch_its_compile_counts_cold_unless_the_recorder_pads():
    warm = _warm(calls=((16, 30.0), (16, 2.56)), n=32)
    p = bench.plan_limit(warm, target=1319, gpus=2, batch=16, max_gen_toks=256, seconds=1000)
    assert p["smaller_last_batch_s"] == pytest.approx(30 - 2.56)
    warm["parallel"]["workers"][0]["decode"]["pads_smaller_batches"] = True
    p = bench.plan_limit(warm, target=1319, gpus=2, batch=16, max_gen_toks=256, seconds=1000)
    assert p["smaller_last_batch_s"] == 0.0 and p["predicted_s"][1] == pytest.approx(20 + 13.72 + 83 * 2.816)


def test_without_a_steady_call_the_first_one_is_the_rate():
    p = bench.plan_limit(_warm(calls=((16, 30.0),), n=16), target=64, gpus=2, batch=16, max_gen_toks=256,
                         seconds=10_000)
    assert p["call_s"] == pytest.approx(33.0) and p["warm_compile_s"] == 0.0 and p["limit"] == 64


def test_a_longer_warm_up_call_is_counted_by_its_steps():
    """The warm-up generates more tokens a call than the launches (to fill the static cache): its steady rate
    is per step, and its first call's compile is what that call cost beyond its own steps."""
    warm = _warm(calls=((16, 30.0 + 449 * 0.01), (16, 7.05), (8, 7.05)))
    for c in warm["parallel"]["workers"][0]["decode"]["per_call"]:
        c["steps"] = 705
    p = bench.plan_limit(warm, target=1319, gpus=2, batch=16, max_gen_toks=256, seconds=1000)
    assert p["call_s"] == pytest.approx(2.56 * 1.1) and p["warm_compile_s"] == pytest.approx(0.5 * (30 - 2.56))
    assert p["smaller_last_batch_s"] == pytest.approx(0.0)


def test_the_warm_up_fills_the_static_cache_only_for_a_compiled_decode(tmp_path):
    """Its longest prompt is counted as lm-eval builds it (checked against a run of lm-eval on the same
    problems); a compiled warm-up then generates up to max_length, so its cache is as long as a launch's."""
    from utils import evaluation as ev
    from utils.eval_settings import EvalSettings

    data = ev.data_files_from_folder(FIXTURE / "data")
    s = EvalSettings(limit=4, max_gen_toks=4, batch_size=4, max_length=2048)
    longest = bench.longest_prompt(str(FIXTURE / "bf16"), data, 4, s, tmp_path)
    run = ev.run_gsm8k(str(FIXTURE / "bf16"), tmp_path, label="p", data_files=data, settings=s)
    assert longest == run["settings"]["prompt_tokens"]["max"] > 100
    compiled = bench.warmup_settings(s.replace(decode="compiled", device="cuda"), 32, longest)
    assert compiled.limit == 32 and compiled.max_gen_toks == 2048 - longest and compiled.max_length == 2048
    eager = bench.warmup_settings(s, 32, longest)
    assert eager.limit == 32 and eager.max_gen_toks == 4


@pytest.mark.parametrize("ran, target, says, never", [
    (1319, 1319, "**All 1,319 problems**", "Not all"),
    (960, 1319, "**Not all 1,319 problems: 960**", "All 1,319"),
    (64, 64, "The first 64 of the 1,319 problems", "All 1,319"),
    (None, 1319, "**No full run**: even 32", "All 1,319"),
    ("failed", 1319, "**No comparison**: a launch did not complete", "speed-up of")])
def test_the_md_claims_the_whole_test_set_only_when_it_ran(ran, target, says, never):
    failed = {2: "gpus=2: ... timed out after 23 s"} if ran == "failed" else {}
    ran = None if ran == "failed" else ran
    detail = {"total": 1319, "target": target, "ran": ran, "gpus": 2, "failed": failed,
              "plan": {"seconds": 300, "why": "even 32 problems ..." if ran is None else "1,319 would take 454 s"},
              "speedup_wall": None if ran is None else 1.84, "speedup_generation": 1.95}
    text = " ".join(md.full_notes(detail, 1.8))
    assert says in text and never not in text, text
    if ran:
        assert "target of 1.8x is met" in text
    assert "**not met**" in " ".join(md.full_notes({**detail, "ran": 1319, "speedup_wall": 1.43}, 1.8))


def test_a_full_part_on_two_cpu_processes_writes_a_kept_run(tmp_path, monkeypatch):
    monkeypatch.setenv("MULTIGPU_CALL", "run(kind='nvidia-h100-x2', command='bash scripts/multigpu_7b.sh')")
    args = ["full", "--model", str(FIXTURE / "bf16"), "--data", str(FIXTURE / "data"), "--limit", "8", "--batch", "2",
            "--gpus", "2", "--warmup", "4", "--deadline", str(time.time() + 900), "--max-gen-toks", "12",
            "--device", "cpu",
            "--target-speedup", "1.8", "--name", "t", "--out", str(tmp_path)]
    assert bench.main(args) == 0
    run = json.loads((tmp_path / "t.json").read_text())
    d = run["detail"]
    assert d["ran"] == 8 and d["plan"]["limit"] == 8 and d["warmup"]["n"] == 8 and not d["failed"]
    assert 700 < d["plan"]["seconds"] < 900                              # the deadline, less the warm-up
    assert [r["GPUs"] for r in run["rows"]] == [1, 2] and [r["problems"] for r in run["rows"]] == [8, 8]
    assert "speed-up, wall" in run["rows"][1] and d["compare"]["n"] == 8
    intro, phases = d["tables"]["Where each launch's wall time went, per rank (s)"]
    assert [(r["launch"], r["rank"]) for r in phases] == [("warm-up, 2 GPUs", 0), ("warm-up, 2 GPUs", 1), ("1 GPU", 0),
                                                          ("2 GPUs", 0), ("2 GPUs", 1)]   # every card warmed
    assert all(r["load s"] > 0 and r["calls"] >= 1 for r in phases) and "add up to the launch's wall" in intro
    text = (tmp_path / "t.md").read_text()
    assert text.startswith("# Lab 03 beyond one GPU: t (full)") and "run(kind='nvidia-h100-x2'" in text
    assert "python scripts/multigpu_bench.py full --model" in text and "lm_eval 0.4" in text
    assert "The first 8 of the" in text and "target of 1.8x" in text and "McNemar p" in text
    assert "The plan, from the warm-up's rank 0:" in text
    with pytest.raises(SystemExit, match="exists already"):               # never overwritten
        bench.main(args)


def test_a_full_part_split_over_two_calls_compares_the_kept_1_gpu_run(tmp_path, monkeypatch):
    """--one-only keeps the warm-up and the 1-GPU launch; --baseline then runs only the N-GPU launch on the same
    problems, with no warm-up where this machine's compile caches are there, and claims the speed-up."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    common = ["full", "--model", str(FIXTURE / "bf16"), "--data", str(FIXTURE / "data"), "--limit", "6", "--batch", "2",
              "--gpus", "2", "--warmup", "2", "--deadline", str(time.time() + 900), "--max-gen-toks", "8",
              "--device", "cpu", "--out", str(tmp_path)]
    assert bench.main(common + ["--one-only", "--keep", str(tmp_path / "keep"), "--name", "one"]) == 0
    one = json.loads((tmp_path / "one.json").read_text())
    assert [r["GPUs"] for r in one["rows"]] == [1] and one["detail"]["ran"] is None
    assert "**The 1-GPU launch only** (6 problems)" in (tmp_path / "one.md").read_text()
    kept = tmp_path / "keep" / "one-1gpu.json"
    assert json.loads(kept.read_text())["n"] == 6
    (tmp_path / "inductor" / "fxgraph").mkdir(parents=True, exist_ok=True)   # the first call's caches, here
    assert bench.main(common + ["--baseline", str(kept), "--target-speedup", "1.8", "--name", "many"]) == 0
    many = json.loads((tmp_path / "many.json").read_text())
    d = many["detail"]
    assert "warmup" not in d and d["ran"] == 6 and d["compare"]["n"] == 6 and d["baseline"]["path"] == str(kept)
    assert [r["GPUs"] for r in many["rows"]] == [1, 2] and "speed-up, wall" in many["rows"][1]
    _, phases = d["tables"]["Where each launch's wall time went, per rank (s)"]
    assert [r["launch"] for r in phases] == ["1 GPU (the earlier call)", "2 GPUs", "2 GPUs"]
    text = (tmp_path / "many.md").read_text()
    assert "The 1-GPU launch is an earlier call's" in text and "found the compile caches" in text
    other = [a if a != "2" or common[i - 1] != "--batch" else "4" for i, a in enumerate(common)]
    with pytest.raises(SystemExit, match="batch 2 there, 4 here"):             # not the same thing measured
        bench.main(other + ["--baseline", str(kept), "--name", "many-bs4"])
    with pytest.raises(SystemExit, match="--baseline: .* is not a 1-GPU run kept by"):
        bench.main(common + ["--baseline", str(tmp_path / "one.md"), "--name", "many-md"])
    with pytest.raises(SystemExit, match="without --one-only"):
        bench.main(common + ["--baseline", str(kept), "--one-only", "--name", "many-both"])
    with pytest.raises(SystemExit, match="--keep: cannot make .* give a folder this user can write"):
        bench.main(common + ["--one-only", "--keep", str(tmp_path / "one.md" / "keep"), "--name", "keep-bad"])
    assert not (tmp_path / "keep-bad-work").exists()                      # refused before any launch
    with pytest.raises(SystemExit, match="--one-only and --keep: only with `full`"):
        bench.main(["compare"] + common[1:] + ["--keep", str(tmp_path / "k2"), "--name", "cmp"])


def test_a_shard_that_fails_is_kept_as_the_finding(tmp_path, monkeypatch):
    def refuse(*a, **k):
        raise ValueError("device_map with several GPUs is not supported for this quantization method")

    monkeypatch.setattr(bench.ep, "evaluate", refuse)
    args = ["shard", "--model", str(FIXTURE / "gptq-int4"), "--data", str(FIXTURE / "data"), "--limit", "4",
            "--max-gen-toks", "8", "--name", "int4-shard", "--out", str(tmp_path)]
    assert bench.main(args) == 0
    text = (tmp_path / "int4-shard.md").read_text()
    assert "**Finding: this model did not run sharded** (GPTQ-Int4" in text
    assert "ValueError: device_map with several GPUs is not supported" in text and "| failed |" in text
    js = json.loads((tmp_path / "int4-shard.json").read_text())
    assert "Traceback" in js["detail"]["traceback"] and js["versions"]["transformers"]

"""Lab 03's data-parallel path: lm-eval under accelerate launch, here two CPU processes over gloo on the
fixture, compared sample for sample with one process; a worker's failure is named by its rank."""
import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from bad_input_table import record
from utils import evaluation as ev
from utils import eval_parallel as ep
from utils.eval_settings import EvalSettings

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "fixtures" / "tiny-qwen2-gsm" / "bf16"
SETTINGS = EvalSettings(limit=6, max_gen_toks=48, batch_size=1)


@pytest.fixture(scope="module")
def data():
    return ev.data_files_from_folder(REPO / "fixtures" / "tiny-qwen2-gsm" / "data")


def test_two_cpu_processes_agree_with_one_at_batch_size_1(tmp_path, data):
    """Batch size 1 is batch-invariant: every problem runs alone, so how the problems are split over the
    processes cannot change its numerics; the 2-process run must equal the 1-process run exactly."""
    one = ev.run_gsm8k(str(MODEL), tmp_path, label="one", data_files=data, settings=SETTINGS)
    two = ep.run_gsm8k_parallel(str(MODEL), tmp_path, label="two", gpus=2, data_files=data, settings=SETTINGS,
                                timeout_s=600)
    assert two["n"] == one["n"] == 6 and [p["doc_id"] for p in two["problems"]] == list(range(6))
    c = ep.compare(one, two)
    assert c["differing_generations"] == 0 and c["differing_scores_strict-match"] == 0 and c["mcnemar_p"] == 1.0
    assert two["accuracy"] == one["accuracy"]
    workers = two["parallel"]["workers"]
    assert [w["rank"] for w in workers] == [0, 1] and all(w["world_size"] == 2 for w in workers)
    # lm-eval split the problems: 3 each (rank r takes r, r+2, ...), not 6 twice
    assert [w["throughput"]["problems"] for w in workers] == [3, 3]
    assert all(w["host_peak_rss_gib"] > 0 for w in workers) and two["throughput"]["problems"] == 6
    samples = next(tmp_path / p for p in two["lm_eval_files"] if Path(p).name.startswith("samples_"))
    logged = {json.loads(line)["doc_id"] for line in samples.read_text().splitlines()}
    assert logged == set(range(6))                       # rank 0 gathered every rank's samples
    row = ep.row("2 processes", two, one)
    assert row["GPUs"] == 2 and row["differing generations"] == 0 and row["wall s"] > 0
    for w in workers:                                    # each rank's own decode loop, and where its time went
        assert w["decode"]["decode"] == "eager" and w["decode"]["calls"] == 3 and w["decode"]["batches"] == [1]
        phases = ep.worker_phases(w, two["parallel"]["launched_at"], two["parallel"]["wall_seconds"])
        assert all(v >= 0 for v in phases.values()), phases
        assert phases["load"] > 0 and phases["lm-eval"] > 0 and phases["start"] > 0.5   # a new interpreter
        assert abs(sum(phases.values()) - two["parallel"]["wall_seconds"]) < 1e-6


class _NoLaunch:
    """A launcher that exits at once without starting a worker (the config is what is looked at)."""
    pid, returncode = 0, 1

    def __init__(self, *args, **kwargs):
        self.args = args

    def poll(self):
        return 1

    def wait(self, *args):
        return 1


def test_every_worker_gets_the_lab_settings_decode_included_on_its_own_device(monkeypatch, tmp_path, data):
    """What a rank evaluates with is the lab's settings as written before the launch, only its device
    changed: decode 'compiled' (each rank compiles its own step over its own static cache), batch size and
    lengths reach every worker; the GPU cap comes from the environment the launcher passes on."""
    monkeypatch.setattr(ep.subprocess, "Popen", _NoLaunch)
    monkeypatch.setenv("QUANTLAB_GPU_MEMORY_GIB", "24")
    lab = EvalSettings.from_params(device="cuda", decode="compiled", batch_size=16, max_length=2048, gsm8k_limit=64,
                                   max_gen_toks=256, seed=7, gptq_backend="gptq_triton")
    with pytest.raises(ep.WorkerError, match="gpus=1: .*rank 0: never started"):
        ep.run_gsm8k_parallel(str(MODEL), tmp_path, label="cfg", gpus=1, data_files=data, settings=lab)
    cfg = json.loads((tmp_path / "workers" / "cfg" / "config.json").read_text())
    for device in ("cuda:0", "cuda:1"):
        s = ep.worker_settings(cfg, device)
        assert s == lab.replace(device=device) and s.decode == "compiled" and s.max_length == 2048
    assert {k: getattr(ep.worker_settings(cfg, "cpu"), k) for k in ep.LOAD_KEYS} == {
        **{k: getattr(lab, k) for k in ep.LOAD_KEYS}}


def test_compiled_decode_on_cpu_workers_fails_in_every_worker_naming_it(tmp_path, data):
    """The lab's decode setting reaches the worker processes: 'compiled' needs a GPU, and two CPU workers
    each refuse it (with eager in a worker instead, this run would pass)."""
    with pytest.raises(ep.WorkerError) as exc:
        ep.run_gsm8k_parallel(str(MODEL), tmp_path, label="compiled", gpus=2, data_files=data, timeout_s=600,
                              settings=EvalSettings(limit=4, max_gen_toks=8, batch_size=2, decode="compiled"))
    msg = str(exc.value)
    assert "gpus=2: worker rank" in msg and "of 2 failed" in msg, msg
    failed = re.findall(r"rank (\d) failed: ([^;]*)", msg)          # a rank the launcher stopped first: not listed
    assert failed and all("decode: 'compiled' replays the decode step as CUDA graphs and needs a GPU" in why
                          for _, why in failed), msg


def _launch(tmp_path, data, model, result):
    try:
        result["run"] = ep.run_gsm8k_parallel(str(model), tmp_path, label="x", gpus=2, data_files=data,
                                              timeout_s=600, settings=EvalSettings(
                                                  limit=24, max_gen_toks=96, batch_size=1,
                                                  param="golden_model (Lab 02)"))
    except Exception as exc:  # noqa: BLE001
        result["error"] = exc


def test_a_killed_worker_fails_the_run_naming_its_rank(tmp_path, data):
    """A worker killed mid-run (as the kernel's OOM killer would) leaves no status of its own; the launcher's
    root cause names it, the other rank is stopped, and no result is returned."""
    result = {}
    t = threading.Thread(target=_launch, args=(tmp_path, data, MODEL, result))
    t.start()
    status = tmp_path / "workers" / "x" / "rank1.json"
    deadline = time.monotonic() + 300
    while not status.is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    os.kill(json.loads(status.read_text())["pid"], signal.SIGKILL)
    t.join(600)
    err = result.get("error")
    assert isinstance(err, ep.WorkerError) and "run" not in result, result
    assert "gpus=2: worker rank 1 of 2 failed" in str(err) and "SIGKILL" in str(err), err
    assert "No result of this run is kept as complete" in str(err)
    record("data-parallel workers (gpus)", "a worker process killed mid-run (rank 1)", str(err))


def _copy_model(dst: Path) -> Path:
    dst.mkdir()
    for f in MODEL.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_a_damaged_weight_file_is_refused_before_any_worker_starts(tmp_path, data):
    broken = _copy_model(tmp_path / "broken")
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    result = {}
    _launch(tmp_path, data, broken, result)
    err = result.get("error")
    assert isinstance(err, ev.EvalInputError) and "golden_model (Lab 02):" in str(err), result
    assert "no readable safetensors header" in str(err) and not (tmp_path / "workers").exists()
    record("data-parallel workers (gpus)", "a damaged weight file (caught before the workers start)", str(err))


def test_a_worker_that_cannot_load_the_model_names_rank_and_reason(tmp_path, data):
    """Weights that do not fit the config load in no worker: the lab's failure names a rank and why."""
    broken = _copy_model(tmp_path / "broken")
    cfg = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**cfg, "intermediate_size": cfg["intermediate_size"] // 2}))
    result = {}
    _launch(tmp_path, data, broken, result)
    err = result.get("error")
    assert isinstance(err, ep.WorkerError), result
    assert "worker rank" in str(err) and "of 2 failed" in str(err)
    assert "golden_model (Lab 02):" in str(err) and "does not load as a hf model" in str(err)
    assert (tmp_path / "workers" / "x" / "rank0.log").is_file()
    record("data-parallel workers (gpus)", "weights that do not fit the config (every worker fails to load)", str(err))


@pytest.mark.parametrize("bad", [0, -1, "2", 2.0, True])
def test_gpus_must_be_a_whole_number_at_least_1(bad):
    with pytest.raises(ev.EvalInputError, match=r"gpus: .* must be a whole number >= 1") as exc:
        ep.check_gpus(bad, "cpu")
    record("data-parallel workers (gpus)", f"gpus = {bad!r}", str(exc.value))


def test_more_gpus_than_the_machine_shows_is_refused():
    assert ep.check_gpus(2, "cuda", visible=2) == 2 and ep.check_gpus(3, "cpu") == 3
    with pytest.raises(ev.EvalInputError, match="gpus: 4 worker processes need 4 GPUs, but this machine shows 2") as exc:
        ep.check_gpus(4, "cuda", visible=2)
    record("data-parallel workers (gpus)", "gpus = 4 on a machine with 2 GPUs", str(exc.value))


def _problems(gens, right):
    return {"problems": [{"doc_id": i, "generation": g, "strict-match": r, "flexible-extract": r}
                         for i, (g, r) in enumerate(zip(gens, right))]}


def test_compare_counts_differences_and_runs_the_paired_test():
    a = _problems(["x", "y", "z", "w Question:"], [1, 1, 0, 1])
    b = _problems(["x", "y2", "z2", "w "], [1, 0, 0, 1])
    c = ep.compare(a, b)
    assert c["differing_generations"] == 3 and c["differing_scores_strict-match"] == 1
    assert c["first_differing"] == 1 and c["table"]["golden_only"] == 1 and c["mcnemar_p"] == 1.0
    assert ep.compare(a, b, stops=("Question:",))["differing_generations"] == 2   # "w Question:" vs "w ": the stop cut
    with pytest.raises(ValueError, match="same problems"):
        ep.compare(a, _problems(["x"], [1]))


def test_lab04_stops_after_a_sharded_lab03_and_only_then():
    from utils import lab_inputs

    for lab03 in (None, {"data": {}}, {"data": {"beyond_one_gpu": {"gpus": 2, "shard": False}}}):
        lab_inputs.check_whole_model(lab03)              # one process held the whole model: nothing to say
    with pytest.raises(RuntimeError, match="Lab 03 ran with shard = True.*cannot run here") as exc:
        lab_inputs.check_whole_model({"data": {"beyond_one_gpu": {"gpus": 1, "shard": True}}})
    record("Lab 04 after Lab 03", "Lab 03 sharded the model over several GPUs", str(exc.value))


def test_shard_plans_the_device_map_for_the_cap(monkeypatch):
    monkeypatch.delenv("QUANTLAB_GPU_MEMORY_GIB", raising=False)
    assert ep.shard_memory() == {}
    monkeypatch.setenv("QUANTLAB_GPU_MEMORY_GIB", "24")
    assert ep.shard_memory() == {"max_memory_per_gpu": "18.0GiB"}
    args = ev.model_args(str(MODEL), parallelize=True)
    assert args["parallelize"] is True and args["max_memory_per_gpu"] == "18.0GiB"


def _running(pid: int, wait_s: float = 15) -> bool:
    """Whether pid is still a live process (a zombie waiting to be reaped is not) after up to wait_s."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        if state == "Z":
            return False
        time.sleep(0.5)
    return True


def test_workers_past_the_time_limit_are_stopped_and_the_run_fails(tmp_path, data):
    with pytest.raises(ep.WorkerError, match="gpus=2: .*timed out after 3 s") as exc:
        ep.run_gsm8k_parallel(str(MODEL), tmp_path, label="slow", gpus=2, data_files=data, timeout_s=3,
                              settings=EvalSettings(limit=24, max_gen_toks=96, batch_size=1))
    assert "No result of this run is kept as complete" in str(exc.value)
    for r in (0, 1):                                    # no worker outlives the failed run
        st = tmp_path / "workers" / "slow" / f"rank{r}.json"
        if st.is_file():
            assert not _running(json.loads(st.read_text())["pid"]), f"rank {r} still runs"
    record("data-parallel workers (gpus)", "workers still running at the time limit (3 s)", str(exc.value))


def test_agreement_runs_the_lab_settings_at_the_comparison_size_and_batch_1(monkeypatch, tmp_path):
    """The comparison keeps every lab setting but the number of problems, the batch size and sharding."""
    calls = []

    def fake(path, out_dir, *, label, gpus, data_files, settings):
        calls.append((label, gpus, settings))
        return {"n": 1, "problems": [{"doc_id": 0, "generation": "#### 1", "strict-match": 1, "flexible-extract": 1}],
                "settings": settings.as_dict(), "throughput": {"seconds": 1.0},
                "accuracy": {"strict-match": {"acc": 1.0}}, "parallel": {"gpus": gpus, "wall_seconds": 2.0}}
    monkeypatch.setattr(ep, "run_gsm8k_parallel", fake)
    lab = EvalSettings.from_params(gsm8k_limit=50, batch_size=8, max_gen_toks=96, seed=7, shard=True, device="cuda")
    rows = ep.agreement("m", tmp_path, problems=4, gpus=2, data_files=None, settings=lab)
    assert [(label, g, s.batch_size) for label, g, s in calls] == [
        ("compare-bs8-1gpu", 1, 8), ("compare-bs8-2gpu", 2, 8), ("compare-bs1-1gpu", 1, 1), ("compare-bs1-2gpu", 2, 1)]
    for _, _, s in calls:
        assert (s.limit, s.parallelize, s.max_gen_toks, s.seed, s.device) == (4, False, 96, 7, "cuda")
    assert [r["batch"] for r in rows] == [8, 8, 1, 1] and lab.limit == 50

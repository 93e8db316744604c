"""GSM8K through lm-eval's own task, offline: same prompts and filters as the built-in task, bad input.

The real GSM8K (../shared/data/gsm8k beside the clone) goes through the same offline task path the
lab uses, on the fixture model, with a small limit.
"""
import json
import os
from pathlib import Path

import pytest

from bad_input_table import record
from utils import evaluation as ev
from utils.eval_settings import EvalSettings

REPO = Path(__file__).resolve().parents[1]
GSM8K = (REPO / ".." / "shared" / "data" / "gsm8k").resolve()
STANDIN = Path(os.environ.get("QUANTLAB_STANDIN", "/work/standin/tiny-qwen2-gsm"))


def fixture_model() -> Path:
    """The fixture's golden model (the stand-in with the same layout until the fixture is committed)."""
    committed = REPO / "fixtures" / "tiny-qwen2-gsm" / "bf16"
    return committed if (committed / "config.json").is_file() else STANDIN / "bf16"


@pytest.fixture(scope="module")
def real_files():
    return ev.data_files_from_folder(GSM8K)


@pytest.fixture(scope="module")
def tasks(real_files, tmp_path_factory):
    """The built-in gsm8k task (its hub download redirected to the same local files) and our local one."""
    import datasets
    from lm_eval.api import task as task_mod

    real_load = datasets.load_dataset

    def offline_hub(path, name=None, **kw):
        assert (path, name) == ("openai/gsm8k", "main"), (path, name)
        return real_load("json", data_files={k: str(v) for k, v in real_files.items()})

    task_dir = ev.write_local_task(real_files, tmp_path_factory.mktemp("task")).parent
    local = ev.task_manager(task_dir).load([ev.LOCAL_TASK])["tasks"][ev.LOCAL_TASK]
    mp = pytest.MonkeyPatch()
    mp.setattr(task_mod.datasets, "load_dataset", offline_hub)
    try:
        builtin = ev.task_manager().load([ev.BUILTIN_TASK])["tasks"][ev.BUILTIN_TASK]
    finally:
        mp.undo()
    return builtin, local


def test_local_task_config_is_the_builtin_one(tasks):
    builtin, local = tasks
    b, l = builtin.config.to_dict(), local.config.to_dict()
    # metadata records which yaml file each was loaded from; the task version must be the same
    assert l["metadata"].pop("config_source") != b["metadata"].pop("config_source")
    assert l["metadata"] == b["metadata"] == {"version": 3.0}
    for key in ("doc_to_text", "doc_to_target", "target_delimiter", "fewshot_delimiter", "filter_list",
                "generation_kwargs", "metric_list", "num_fewshot", "fewshot_split", "training_split",
                "test_split", "output_type", "fewshot_config"):
        assert l.get(key) == b.get(key), key
    differing = {k for k in set(b) | set(l) if b.get(k) != l.get(k)}
    assert differing <= set(ev.DATA_KEYS), differing
    assert l["dataset_path"] == "json" and b["dataset_path"] == "openai/gsm8k"
    assert [f["name"] for f in l["filter_list"]] == list(ev.FILTERS)
    assert "Question:" in l["generation_kwargs"]["until"]


def test_rendered_five_shot_context_matches_builtin(tasks):
    builtin, local = tasks
    assert len(local.eval_docs) == 1319 and len(local.training_docs()) == 7473
    for doc_id in (0, 7, 1318):
        contexts = []
        for task in (builtin, local):
            task.set_fewshot_seed(1234)
            contexts.append(task.fewshot_context(task.eval_docs[doc_id], num_fewshot=5))
        assert contexts[0] == contexts[1]
        ctx = contexts[1]
        assert ctx.count("Question: ") == 6 and ctx.count("#### ") == 5
        assert ctx.endswith("Question: " + local.eval_docs[doc_id]["question"] + "\nAnswer:")


def test_real_gsm8k_through_offline_path_on_fixture_model(real_files, tmp_path, tasks):
    run = ev.run_gsm8k(str(fixture_model()), tmp_path, label="golden", data_files=real_files,
                       settings=EvalSettings(batch_size=3, limit=3, max_gen_toks=48))
    assert run["task"] == ev.LOCAL_TASK and run["n"] == 3
    assert [p["doc_id"] for p in run["problems"]] == [0, 1, 2]
    assert run["problems"][0]["target"] == "18"
    for f in ev.FILTERS:  # lm-eval's aggregate is the mean of its own per-sample outcomes
        acc = sum(p[f] for p in run["problems"]) / 3
        assert run["accuracy"][f]["acc"] == pytest.approx(acc)
    names = [Path(p).name for p in run["lm_eval_files"]]
    assert any(n.startswith("results_") for n in names) and any(n.startswith("samples_") for n in names)
    sample_file = next(tmp_path / p for p in run["lm_eval_files"] if Path(p).name.startswith("samples_"))
    logged = [json.loads(line) for line in sample_file.read_text().splitlines()]
    assert len(logged) == 3 * len(ev.FILTERS)
    _, local = tasks  # the prompt lm-eval sent is the built-in 5-shot rendering of the same doc
    local.set_fewshot_seed(1234)
    assert logged[0]["arguments"]["gen_args_0"]["arg_0"] == local.fewshot_context(local.eval_docs[0], 5)
    assert logged[0]["arguments"]["gen_args_0"]["arg_1"]["max_gen_toks"] == 48
    tp = run["throughput"]
    assert tp["problems"] == 3 and tp["seconds"] > 0 and tp["generated_tokens"] >= 0


def _write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = json.dumps({"question": "1+1?", "answer": "1+1=<<1+1=2>>2\n#### 2"})


def test_bad_data_names_the_parameter(tmp_path):
    with pytest.raises(ev.EvalInputError, match="gsm8k_data: .* is not a folder"):
        ev.data_files_from_folder(tmp_path / "nope")
    _write(tmp_path / "d" / "train.jsonl", [GOOD])
    with pytest.raises(ev.EvalInputError, match="gsm8k_data: the test file .* does not exist"):
        ev.data_files_from_folder(tmp_path / "d")
    _write(tmp_path / "d" / "test.jsonl", [GOOD, "{not json"])
    with pytest.raises(ev.EvalInputError, match="gsm8k_data: .*test.jsonl line 2 is not JSON"):
        ev.data_files_from_folder(tmp_path / "d")
    _write(tmp_path / "d" / "test.jsonl", [GOOD, json.dumps({"question": "q", "answer": "no marker"})])
    with pytest.raises(ev.EvalInputError, match="line 2 is not a GSM8K record"):
        ev.data_files_from_folder(tmp_path / "d")
    _write(tmp_path / "d" / "test.jsonl", [""])
    with pytest.raises(ev.EvalInputError, match="holds no problems"):
        ev.data_files_from_folder(tmp_path / "d")
    _write(tmp_path / "d" / "test.jsonl", [GOOD])
    assert set(ev.data_files_from_folder(tmp_path / "d")) == {"train", "test"}


def test_bad_model_and_backend_name_the_parameter(tmp_path):
    with pytest.raises(ev.EvalInputError, match="backend: 'tgi' is not supported"):
        ev.model_args(str(fixture_model()), "tgi")
    with pytest.raises(ev.EvalInputError, match="int4_model: .* is not a model folder"):
        ev.load_lm(str(tmp_path / "missing"), param="int4_model")
    broken = tmp_path / "broken"
    _write(broken / "config.json", ['{"model_type": "qwen2"}'])
    with pytest.raises(ev.EvalInputError, match="golden_model: .* does not load as a hf model"):
        ev.load_lm(str(broken), param="golden_model", device="cpu", batch_size=1)
    from importlib.util import find_spec
    if find_spec("vllm") is None:
        with pytest.raises(ev.EvalInputError, match="backend: 'vllm' is not installed"):
            ev.model_args(str(fixture_model()), "vllm")


def test_bad_run_settings_fail_before_any_output(tmp_path):
    for kw, name in (({"gsm8k_limit": 0}, "gsm8k_limit"), ({"limit": 2.5}, "gsm8k_limit"),
                     ({"num_fewshot": -1}, "num_fewshot"), ({"max_gen_toks": 0}, "max_gen_toks"),
                     ({"backend": "nope"}, "backend"), ({"batch_size": 0}, "batch_size"),
                     ({"batch_size": "auto:x"}, "batch_size"), ({"max_batch_size": 0}, "max_batch_size"),
                     ({"max_length": 100, "max_gen_toks": 200}, "max_length"),
                     ({"backend": "vllm", "decode": "compiled"}, "decode"), ({"bach_size": 4}, "bach_size"),
                     ({"apply_chat_template": "False"}, "apply_chat_template"), ({"shard": "no"}, "shard"),
                     ({"fewshot_as_multiturn": True}, "fewshot_as_multiturn"), ({"dtype": "bf16"}, "dtype"),
                     ({"decode": "fast"}, "decode"), ({"device": ""}, "device")):
        with pytest.raises(ev.EvalInputError, match=f"^{name}: ") as err:
            EvalSettings.from_params(**kw)
        record("evaluation settings", f"{kw}", str(err.value))
    assert not any(tmp_path.rglob("*"))


def test_settings_variants_are_checked_and_keep_the_lab_names():
    s = EvalSettings.from_params(gsm8k_limit=4, shard=True, batch_size="auto:2", device="cuda")
    assert (s.limit, s.parallelize, s.batch_size) == (4, True, "auto:2")
    assert s.replace(batch_size=1).batch_size == 1 and s.batch_size == "auto:2"      # frozen: a new object
    with pytest.raises(ev.EvalInputError, match="^gsm8k_limit: "):
        s.replace(limit=0)
    assert EvalSettings.from_params(**s.as_dict()) == s


def _sample(doc_id, filt, right, gen):
    return {"doc_id": doc_id, "doc": {"question": f"q{doc_id}", "answer": f"x\n#### {doc_id}"},
            "resps": [[gen]], "filtered_resps": [str(doc_id) if right else "[invalid]"], "filter": filt,
            "exact_match": float(right)}


def test_per_problem_rows_outcomes_and_flips():
    samples_g = [_sample(i, f, i % 2 == 0, f"g{i}") for f in ev.FILTERS for i in range(4)]
    samples_q = [_sample(i, f, i == 0, f"q{i}") for f in ev.FILTERS for i in range(4)]
    g = {"problems": ev._per_problem(samples_g)}
    q = {"problems": ev._per_problem(samples_q)}
    assert ev.outcomes(g, "strict-match") == [1, 0, 1, 0]
    assert ev.outcomes(q, "flexible-extract") == [1, 0, 0, 0]
    flips = ev.flipped(g, q, "strict-match")
    assert [f["doc_id"] for f in flips] == [2]
    assert flips[0]["golden_generation"] == "g2" and flips[0]["int4_generation"] == "q2"
    assert flips[0]["golden_right"] and not flips[0]["int4_right"] and flips[0]["target"] == "2"
    with pytest.raises(ev.EvalInputError, match="primary_filter"):
        ev.outcomes(g, "loose")


def test_choose_data_order_and_offline_refusal(tmp_path, real_files):
    assert ev.choose_data(str(GSM8K), None, offline=True) == real_files
    lab02 = {"train": str(real_files["train"]), "test": str(real_files["test"]), "source": "fixture"}
    assert ev.choose_data("", lab02, offline=True) == real_files
    assert ev.choose_data("", {"train": None, "test": None, "source": "hub"}, offline=False) is None
    with pytest.raises(ev.EvalInputError, match="gsm8k_data: this run is offline"):
        ev.choose_data("", {"train": None, "test": None}, offline=True)
    with pytest.raises(ev.EvalInputError, match="gsm8k_data .*Lab 02.* does not exist"):
        ev.choose_data("", {"train": str(tmp_path / "a"), "test": str(tmp_path / "b")}, offline=True)


def test_dtype_policy_follows_utils_models(tmp_path):
    plain = tmp_path / "plain"
    _write(plain / "config.json", ['{"model_type": "qwen2"}'])
    gptq = tmp_path / "gptq"
    _write(gptq / "config.json", ['{"model_type": "qwen2", "quantization_config": {"quant_method": "gptq"}}'])
    assert ev.resolve_dtype(plain, "cpu") == "float32" and ev.resolve_dtype(gptq, "cpu") == "bfloat16"
    assert ev.resolve_dtype(plain, "cuda") == "bfloat16" and ev.resolve_dtype(gptq, "cuda:1") == "float16"
    assert ev.resolve_dtype(plain, "cuda", "float32") == "float32"


@pytest.mark.parametrize("bad, message", [({"gsm8k_data": "/no/such/gsm8k"}, "gsm8k_data"),
                                          ({"backend": "tgi"}, "backend"),
                                          ({"decode": "compiled"}, "decode: 'compiled' .* needs a GPU"),
                                          ({"gpus": 0}, "gpus: got 0; expected int at least 1"),
                                          ({"endpoint": "localhost:8000"}, "endpoint: 'localhost:8000' is not an http")])
def test_lab_notebook_bad_input_leaves_no_results(tmp_path, monkeypatch, bad, message):
    """The lab itself: a bad parameter stops it with the parameter named, and no results.json appears."""
    import papermill
    from utils import results

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))

    run_dir = tmp_path / "run"
    model = str(fixture_model())
    results.write_results(run_dir / "02_models", "02_models", data={
        "models": {k: {"path": model, "id": "fixture", "source": "fixture"} for k in ("golden", "int4")},
        "gsm8k": {"train": str(GSM8K / "train.jsonl"), "test": str(GSM8K / "test.jsonl"), "source": "fixture"}})
    nb = REPO / "labs" / "03_eval" / "03_eval.ipynb"
    with pytest.raises(papermill.PapermillExecutionError, match=message):
        papermill.execute_notebook(str(nb), str(tmp_path / "out.ipynb"), cwd=str(nb.parent), progress_bar=False,
                                   parameters={"run_dir": str(run_dir), "device": "cpu", "gsm8k_limit": 2,
                                               "batch_size": 2, **bad})
    assert not (run_dir / "03_eval" / "results.json").exists()


def test_int4_model_goes_to_lm_eval_with_the_chosen_gptq_kernel(monkeypatch):
    """lm-eval would pass the checkpoint's own quantization_config; load_lm must keep our kernel choice."""
    int4 = REPO / "fixtures" / "tiny-qwen2-gsm" / "gptq-int4"
    kernels = {}
    for choice in ("gptq_torch", "gptq_torch_aten"):
        monkeypatch.setenv("QUANTLAB_GPTQ_BACKEND", choice)
        lm = ev.load_lm(str(int4), device="cpu", batch_size=1, param="int4_model")
        kernels[choice] = {type(m).__name__ for n, m in lm.model.named_modules() if n.endswith("_proj")}
        assert lm.generate_until  # a usable lm-eval wrapper, not the raw model
    assert kernels["gptq_torch"] != kernels["gptq_torch_aten"], kernels
    assert all(len(k) == 1 for k in kernels.values()), kernels


def test_a_sharded_int4_model_keeps_the_chosen_gptq_kernel(monkeypatch):
    """shard: true on a GPTQ checkpoint goes through the course's loader with accelerate's device map, not lm-eval's
    parallelize (which would let GPTQModel choose: on Hopper, Machete, which downloads CUTLASS at load time)."""
    from utils import models

    int4 = REPO / "fixtures" / "tiny-qwen2-gsm" / "gptq-int4"
    calls, real = [], models.load_model

    def on_cpu(path, device, dtype=None, backend="auto", param="model", shard=False, max_memory_per_gpu=None):
        calls.append({"device": device, "backend": backend, "shard": shard, "per_gpu": max_memory_per_gpu})
        return real(path, "cpu", dtype, backend=backend, param=param)     # a CPU cannot shard; the call is the test

    monkeypatch.setattr(models, "load_model", on_cpu)
    monkeypatch.setenv("QUANTLAB_GPU_MEMORY_GIB", "24")
    monkeypatch.setenv("QUANTLAB_GPTQ_BACKEND", "gptq_torch")
    lm = ev.load_lm(str(int4), device="cpu", batch_size=1, param="int4_model", parallelize=True)
    assert calls == [{"device": "cuda", "backend": "auto", "shard": True,          # the policy resolves auto inside
                      "per_gpu": "18.0GiB"}], calls
    assert {type(m).__name__ for n, m in lm.model.named_modules() if n.endswith("_proj")} == {"TorchLinear"}


def test_load_model_shards_only_a_gptq_checkpoint():
    from utils import models

    with pytest.raises(ValueError, match="splits a GPTQ checkpoint") as e:
        models.load_model(REPO / "fixtures" / "tiny-qwen2-gsm" / "bf16", "cpu", shard=True)
    record("load_model", "shard=True on an unquantized model", str(e.value))


def test_prompt_lengths_count_each_problem_once_as_the_tokenizer_does():
    from utils.models import load_tokenizer

    tok = load_tokenizer(str(Path(__file__).resolve().parents[1] / "fixtures" / "tiny-qwen2-gsm" / "bf16"))
    texts = ["Question: 3 + 4?\nAnswer:", "Question: a much longer problem with 12 and 345 in it?\nAnswer:"]
    samples = [{"doc_id": i, "arguments": [[t, {}]]} for i, t in enumerate(texts) for _ in ("strict", "flexible")]
    got = ev.prompt_lengths(tok, samples)
    want = [len(tok.encode(t, add_special_tokens=False)) for t in texts]
    assert got == {"n": 2, "max": max(want), "mean": sum(want) / 2} and want[0] < want[1]
    assert ev.prompt_lengths(tok, []) == {"n": 0, "max": 0, "mean": 0.0}

"""GSM8K through lm-evaluation-harness's own `gsm8k` task, online or over local data files.

Why not a hand-written loop: the prompt ("Question: ...\\nAnswer:", 5-shot from train), the stop
sequences, the two answer filters (strict-match, flexible-extract) and the exact_match metric are
what published GSM8K numbers mean. Offline, we write a tiny task yaml that `include`s the installed
gsm8k.yaml and swaps only the data source (dataset_path: json + data_files), so every other line of
the task is the harness's own. What this module adds: input checks that name the bad parameter,
lm-eval's own output files kept in the lab folder, per-problem outcomes for the paired test, and
throughput (problems/s, generated tokens/s of the generation phase).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .decode import TimedGeneration, prepare_decode
from .eval_settings import EvalInputError, EvalSettings
from .prompt_cache import cache_templates
from .gsm_synth import read_gsm8k
from .gptq import gptq_kernel_classes
from .models import is_gptq
from .results import atomic_write_text

BUILTIN_TASK = "gsm8k"
LOCAL_TASK = "gsm8k_local"
FILTERS = ("strict-match", "flexible-extract")
BACKENDS = ("hf", "vllm")
VLLM_PINS = ("vLLM 0.33.0 (the newest on PyPI, 2026-11-26) requires torch==2.14.0 and transformers<5.21, and the "
             "course pins torch 2.13.0 and transformers 5.23.0, so it cannot be installed beside them")# The keys a local variant may change; everything else must equal the installed task config.
DATA_KEYS = ("task", "tag", "dataset_path", "dataset_name", "dataset_kwargs")


def builtin_task_yaml() -> Path:
    """The installed lm-eval gsm8k task config (the single source of the prompt, filters, metric)."""
    import lm_eval.tasks

    path = Path(lm_eval.tasks.__file__).parent / "gsm8k" / "gsm8k.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"lm-eval has no {path}: is lm-eval 0.4.x installed?")
    return path


def check_gsm8k_files(train: str | Path, test: str | Path, param: str = "gsm8k_data") -> dict[str, Path]:
    """Check two GSM8K jsonl files (openai/gsm8k layout: question, answer ending '#### N').

    Every line is read: a malformed file must fail here, naming the parameter, file and line,
    not half-way through an evaluation.
    """
    out = {}
    for split, path in (("train", train), ("test", test)):
        path = Path(path) if path else None
        if path is None or not path.is_file():
            raise EvalInputError(f"{param}: the {split} file {path} does not exist; give a folder holding "
                                 "train.jsonl and test.jsonl in the openai/gsm8k layout")
        try:
            n = len(read_gsm8k(path))
        except ValueError as exc:
            raise EvalInputError(f"{param}: {exc}") from exc
        if n == 0:
            raise EvalInputError(f"{param}: {path} holds no problems")
        out[split] = path.resolve()
    return out


def data_files_from_folder(folder: str | Path, param: str = "gsm8k_data") -> dict[str, Path]:
    """A local GSM8K folder: train.jsonl (few-shot examples) and test.jsonl (the problems)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise EvalInputError(f"{param}: {folder} is not a folder; give a folder holding train.jsonl "
                             "and test.jsonl (openai/gsm8k layout), or leave it empty for the default")
    return check_gsm8k_files(folder / "train.jsonl", folder / "test.jsonl", param)


def choose_data(gsm8k_data: str | Path | None, lab02_gsm8k: dict | None, offline: bool) -> dict[str, Path] | None:
    """Which GSM8K: the gsm8k_data folder if given, else Lab 02's fixture files, else (online) the hub.

    Returns {"train", "test"} paths, or None for the hub dataset through the built-in task.
    """
    if gsm8k_data:
        return data_files_from_folder(gsm8k_data)
    g = lab02_gsm8k or {}
    if g.get("train") and g.get("test"):
        return check_gsm8k_files(g["train"], g["test"], param="gsm8k_data (empty: Lab 02's data files)")
    if offline:
        raise EvalInputError("gsm8k_data: this run is offline and Lab 02 recorded no local GSM8K files; give "
                             "a folder holding train.jsonl and test.jsonl (e.g. ../shared/data/gsm8k)")
    return None


def write_local_task(data_files: dict[str, Path], task_dir: str | Path, task_name: str = LOCAL_TASK) -> Path:
    """Write <task_dir>/<task_name>.yaml: the installed gsm8k task with only its data source swapped
    (atomically: data-parallel workers write the same file at once)."""
    task_dir = Path(task_dir)
    task_dir.mkdir(parents=True, exist_ok=True)
    cfg = {"include": str(builtin_task_yaml()), "task": task_name, "tag": None,
           "dataset_path": "json", "dataset_name": None,
           "dataset_kwargs": {"data_files": {"train": str(data_files["train"]),
                                             "test": str(data_files["test"])}}}
    return atomic_write_text(task_dir / f"{task_name}.yaml", yaml.safe_dump(cfg, sort_keys=False))


def task_manager(task_dir: str | Path | None = None):
    """lm-eval's TaskManager: the built-in tasks, or only our local task folder when given.

    The local yaml includes the installed gsm8k.yaml by absolute path, so indexing the ~20 s worth of
    built-in task folders is not needed for it.
    """
    from lm_eval.tasks import TaskManager

    if task_dir:
        return TaskManager(include_path=str(task_dir), include_defaults=False)
    return TaskManager()


def resolve_dtype(model_path: str | Path, device: str, dtype: str = "auto") -> str:
    """"auto": utils.models.default_dtype, so Labs 02-04 compute alike (float32 on CPU but bfloat16 for
    GPTQ there; bfloat16 for BF16 checkpoints on a GPU, float16 for GPTQ on a GPU)."""
    if dtype != "auto":
        return str(dtype)
    from utils.models import default_dtype

    try:
        return str(default_dtype(model_path, device)).replace("torch.", "")
    except (OSError, ValueError):
        return "auto"  # model_args/load_lm report the bad folder with the parameter's name


def model_args(model_path: str, backend: str = "hf", *, dtype: str = "auto", parallelize: bool = False,
               tensor_parallel_size: int = 1, data_parallel_size: int = 1, max_gen_toks: int = 256,
               max_length: int | None = None, gptq_backend: str | None = None,
               param: str = "model") -> dict[str, Any]:
    """The lm-eval model_args for a backend; refuses an unknown backend or a model folder that is absent.

    max_length: prompt + generated tokens at most (lm-eval's own argument; None: the model's maximum,
    which is also the length lm-eval's automatic batch size probes at). gptq_backend: the GPTQModel kernel
    of a GPTQ checkpoint (hf: load_lm loads it with that kernel; vllm: "gptq_marlin" or "gptq" become its
    `quantization`); not set for an unquantized model.
    """
    if backend not in BACKENDS:
        raise EvalInputError(f"backend: {backend!r} is not supported; use one of {list(BACKENDS)}")
    path = Path(str(model_path))
    if not (path.is_dir() and (path / "config.json").is_file()):
        raise EvalInputError(f"{param}: {model_path} is not a model folder (no config.json there); give the "
                             "path of a local checkpoint (Lab 02 resolves hub ids to local paths)")
    if max_length is not None and (int(max_length) != max_length or max_length <= max_gen_toks):
        raise EvalInputError(f"max_length: {max_length!r} must be a whole number of tokens above max_gen_toks "
                             f"({max_gen_toks}): the prompt and the generation share it; None means the model's")
    from .fetch import FetchError, check_weight_files
    try:
        check_weight_files(path, param)
    except FetchError as exc:
        raise EvalInputError(str(exc)) from exc
    quantized = is_gptq(path)
    if backend == "vllm":
        from importlib.util import find_spec

        if find_spec("vllm") is None:
            raise EvalInputError(f"backend: 'vllm' is not installed on this machine: {VLLM_PINS}. Use backend='hf', "
                                 "or serve the model with vLLM elsewhere and give its URL as endpoint")
        args = {"pretrained": str(path), "dtype": dtype, "tensor_parallel_size": int(tensor_parallel_size),
                "data_parallel_size": int(data_parallel_size), "max_gen_toks": int(max_gen_toks)}
        if max_length is not None:
            args["max_length"] = int(max_length)
        if quantized and gptq_backend not in (None, "auto"):
            args["quantization"] = "gptq_marlin" if gptq_backend == "gptq_marlin" else "gptq"
        return args
    args = {"pretrained": str(path), "dtype": dtype}
    if max_length is not None:
        args["max_length"] = int(max_length)
    if quantized:
        args["gptq_backend"] = gptq_backend or "auto"
    if parallelize:
        from .gpu_cap import shard_memory  # HF naive pipeline over all visible GPUs (accelerate device_map)
        args.update(parallelize=True, **shard_memory())
    return args


def load_lm(model_path: str, *, backend: str = "hf", device: str = "cpu", batch_size: int | str = "auto",
            max_batch_size: int | None = 64, param: str = "model", **kwargs):
    """Build lm-eval's model wrapper (the same call simple_evaluate makes), naming the parameter on failure."""
    import lm_eval.api.registry

    kwargs["dtype"] = resolve_dtype(model_path, device, kwargs.get("dtype", "auto"))
    args = model_args(model_path, backend, param=param, **kwargs)
    kernel = args.pop("gptq_backend", None)          # ours, not an lm-eval argument
    extra = {"batch_size": batch_size, "max_batch_size": max_batch_size,
             "device": None if backend == "vllm" or args.get("parallelize") else device}
    try:
        if backend == "hf" and is_gptq(args["pretrained"]):
            # lm-eval passes the checkpoint's own quantization_config to from_pretrained, so the GPTQModel
            # kernel cannot be chosen through model_args (GPTQModel's own choice on Hopper, Machete, downloads
            # CUTLASS at load); load it with utils.models' kernel policy instead, sharded too (its device map).
            import torch
            from lm_eval.models.huggingface import HFLM

            from .models import load_model, load_tokenizer

            shard = bool(args.get("parallelize"))
            model = load_model(args["pretrained"], "cuda" if shard else device, getattr(torch, args["dtype"], None),
                               backend=kernel, shard=shard, max_memory_per_gpu=args.get("max_memory_per_gpu"))
            return HFLM(pretrained=model, tokenizer=load_tokenizer(args["pretrained"]), batch_size=batch_size,
                        max_batch_size=max_batch_size, max_length=args.get("max_length"))
        return lm_eval.api.registry.get_model(backend).create_from_arg_obj(args, extra)
    except Exception as exc:  # noqa: BLE001 - any load failure is the model parameter's problem
        raise EvalInputError(f"{param}: {model_path} does not load as a {backend} model "
                             f"({type(exc).__name__}: {exc})") from exc


def _per_problem(samples: list[dict]) -> list[dict]:
    """One row per problem from lm-eval's per-sample log (it has one record per problem and filter)."""
    rows: dict[int, dict] = {}
    for s in samples:
        row = rows.setdefault(s["doc_id"], {"doc_id": s["doc_id"], "question": s["doc"]["question"],
                                            "target": s["doc"]["answer"].split("#### ")[-1].strip(),
                                            "generation": s["resps"][0][0]})
        row[s["filter"]] = int(s["exact_match"])
        row[f"{s['filter']}_answer"] = s["filtered_resps"][0]
    return [rows[k] for k in sorted(rows)]


def run_gsm8k(model_path: str, out_dir: str | Path, *, label: str, data_files: dict[str, Path] | None,
              settings: EvalSettings, lm=None) -> dict:
    """Evaluate one model on GSM8K with lm-eval; keep lm-eval's outputs under out_dir/lm_eval/<label>/.

    settings: how (utils.eval_settings, checked when built). lm: an lm-eval model already built (a
    data-parallel worker's, a served model's) instead of loading one. data_files None: the hub dataset
    through the built-in task (needs internet). Returns {"label", "model_path", "task", "accuracy":
    {filter: {"acc", "stderr"}}, "n", "problems", "throughput", "lm_eval_files" (relative to out_dir), "settings"}.
    """
    from lm_eval.loggers import EvaluationTracker

    s = settings
    lab_out = Path(out_dir)
    out_dir = lab_out / "lm_eval" / label
    task, tm = _task(data_files, out_dir)
    kernel = s.gptq_backend if is_gptq(model_path) else None
    if lm is None:
        lm = load_lm(model_path, backend=s.backend, device=s.device, batch_size=s.batch_size, param=s.param,
                     dtype=s.dtype, parallelize=s.parallelize, tensor_parallel_size=s.tensor_parallel_size,
                     data_parallel_size=s.data_parallel_size, max_gen_toks=s.max_gen_toks, max_length=s.max_length,
                     max_batch_size=s.max_batch_size, gptq_backend=kernel)
    try:
        recorder = prepare_decode(lm, s.decode) if s.backend == "hf" else None
    except ValueError as exc:
        raise EvalInputError(str(exc)) from exc
    timer = TimedGeneration(lm)
    lm.generate_until = timer
    cache_templates()
    tracker = EvaluationTracker(output_path=str(out_dir))
    res = _simple_evaluate(lm, model_path, task, tm, tracker, s, kernel)
    if res is None:  # a data-parallel rank > 0: rank 0 gathered its samples (utils.eval_parallel)
        return {"label": label, "rank": lm.rank, "throughput": {"seconds": timer.seconds, "problems": timer.requests,
                                                                "generated_tokens": timer.tokens},
                "decode": recorder.summary() if recorder else {"decode": s.backend}}
    samples = res["samples"][task]
    prompts = prompt_lengths(lm.tokenizer, samples)
    if s.max_length is not None and prompts["max"] + s.max_gen_toks > s.max_length:
        raise EvalInputError(f"max_length: {s.max_length} is too short for this GSM8K: the longest prompt has "
                             f"{prompts['max']} tokens + max_gen_toks {s.max_gen_toks}, so lm-eval cut prompts "
                             f"from the left; set max_length >= {prompts['max'] + s.max_gen_toks}")
    problems = _per_problem(samples)
    r = res["results"][task]
    accuracy = {f: {"acc": float(r[f"exact_match,{f}"]), "stderr": float(r[f"exact_match_stderr,{f}"])}
                for f in FILTERS}
    saved = _save(tracker, res, task, out_dir, lab_out)       # last: lm-eval rewrites the samples as it saves them
    secs = timer.seconds
    record = {**{k: v for k, v in s.as_dict().items() if k not in UNRECORDED},
              "batch_sizes": res["config"].get("batch_sizes"), "prompt_tokens": prompts, "gptq_backend": kernel,
              "decode": recorder.summary() if recorder else {"decode": s.backend},
              "gptq_kernels": gptq_kernel_classes(getattr(lm, "_model", None)),
              "dtype": resolve_dtype(model_path, s.device, s.dtype),
              "data": {k: str(v) for k, v in (data_files or {}).items()} or "hub:openai/gsm8k",
              "lm_eval_version": _lm_eval_version()}
    return {"label": label, "model_path": str(model_path), "task": task, "n": len(problems),
            "accuracy": accuracy, "problems": problems, "lm_eval_files": saved,
            "throughput": {"seconds": secs, "problems": timer.requests, "generated_tokens": timer.tokens,
                           "problems_per_s": timer.requests / secs if secs > 0 else None,
                           "tokens_per_s": timer.tokens / secs if secs > 0 else None},
            "settings": record}


# settings fields results.json has never recorded (how the model was placed, not what was evaluated)
UNRECORDED = ("parallelize", "tensor_parallel_size", "data_parallel_size", "param")


def _task(data_files: dict[str, Path] | None, out_dir: Path):
    """(task name, TaskManager): the local variant over data_files, or the built-in hub task."""
    if data_files is None:
        return BUILTIN_TASK, task_manager()
    files = check_gsm8k_files(data_files.get("train"), data_files.get("test"))
    return LOCAL_TASK, task_manager(write_local_task(files, out_dir / "task").parent)


def _simple_evaluate(lm, model_path, task: str, tm, tracker, s: EvalSettings, kernel: str | None):
    """lm-eval's own evaluation call with every seed set and the per-sample log kept."""
    from lm_eval import simple_evaluate

    margs = {"pretrained": str(model_path), "backend": s.backend, "max_length": s.max_length,
             "max_batch_size": s.max_batch_size, "gptq_backend": kernel}
    return simple_evaluate(model=lm, model_args=margs, tasks=[task], num_fewshot=s.num_fewshot,
                           batch_size=s.batch_size, device=s.device, limit=s.limit, log_samples=True,
                           evaluation_tracker=tracker, apply_chat_template=s.apply_chat_template,
                           fewshot_as_multiturn=s.fewshot_as_multiturn, gen_kwargs={"max_gen_toks": s.max_gen_toks},
                           task_manager=tm, random_seed=s.seed, numpy_random_seed=s.seed, torch_random_seed=s.seed,
                           fewshot_random_seed=s.seed)


def _save(tracker, res: dict, task: str, out_dir: Path, lab_out: Path) -> list[str]:
    """lm-eval's own results and samples files under out_dir; their paths relative to the lab folder. The
    samples are lm-eval's to rewrite as it saves them (no copy): the caller has read what it needs."""
    tracker.save_results_aggregated(results={k: v for k, v in res.items() if k != "samples"}, samples=res["samples"])
    tracker.save_results_samples(task_name=task, samples=res["samples"][task])
    saved = sorted(str(p.relative_to(lab_out)) for p in out_dir.rglob("*.json*")
                   if p.name.startswith(("results_", "samples_")))
    if not any(Path(p).name.startswith("samples_") for p in saved):
        raise RuntimeError(f"lm-eval did not write its per-sample log under {out_dir}")
    return saved


def prompt_lengths(tokenizer, samples: list[dict]) -> dict:
    """Token counts of the prompts lm-eval built (one per problem): what max_length must hold. One batched
    call: the fast tokenizer encodes a list in parallel, where one call per prompt took seconds a run."""
    prompts = list({s["doc_id"]: s["arguments"][0][0] for s in samples}.values())
    counts = [len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"]] if prompts else []
    return {"n": len(counts), "max": max(counts, default=0), "mean": sum(counts) / max(1, len(counts))}


def _lm_eval_version() -> str:
    from importlib.metadata import version

    return version("lm_eval")


def outcomes(run: dict, filt: str) -> list[int]:
    """0/1 per problem (doc_id order) under one filter, from run_gsm8k's result."""
    if filt not in FILTERS:
        raise EvalInputError(f"primary_filter: {filt!r} is not one of {list(FILTERS)}")
    return [p[filt] for p in run["problems"]]


def flipped(golden: dict, int4: dict, filt: str, n: int = 5) -> list[dict]:
    """Up to n problems whose outcome differs between the models, with both generations."""
    rows = []
    for g, q in zip(golden["problems"], int4["problems"]):
        if g["doc_id"] != q["doc_id"]:
            raise ValueError("the two runs did not score the same problems in the same order")
        if g[filt] != q[filt]:
            rows.append({"doc_id": g["doc_id"], "question": g["question"], "target": g["target"],
                         "golden_right": bool(g[filt]), "golden_answer": g[f"{filt}_answer"],
                         "golden_generation": g["generation"], "int4_right": bool(q[filt]),
                         "int4_answer": q[f"{filt}_answer"], "int4_generation": q["generation"]})
    return rows[:n]


def accuracy_table(runs: dict[str, dict]):
    """pandas table: one row per model and filter, accuracy +- stderr in %, and throughput."""
    import pandas as pd

    rows = []
    for name, run in runs.items():
        tp = run["throughput"]
        for f in FILTERS:
            a = run["accuracy"][f]
            rows.append({"model": name, "filter": f, "n": run["n"], "accuracy %": 100 * a["acc"],
                         "± stderr": 100 * a["stderr"], "problems/s": tp["problems_per_s"],
                         "gen tokens/s": tp["tokens_per_s"]})
    return pd.DataFrame(rows).round(2)


def plot_accuracy(runs: dict[str, dict], title: str = "GSM8K accuracy (lm-eval gsm8k), ± 1 stderr"):
    """Grouped bars: accuracy per filter for each model, with lm-eval's stderr as error bars."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    width = 0.8 / max(1, len(runs))
    for i, (name, run) in enumerate(runs.items()):
        xs = [j + i * width for j in range(len(FILTERS))]
        acc = [100 * run["accuracy"][f]["acc"] for f in FILTERS]
        err = [100 * run["accuracy"][f]["stderr"] for f in FILTERS]
        bars = ax.bar(xs, acc, width, yerr=err, capsize=3, label=name)
        for bar, v, e in zip(bars, acc, err):             # above the error bar, not on it
            ax.annotate(f"{v:.1f}", (bar.get_x() + bar.get_width() / 2, v + e), xytext=(0, 2),
                        textcoords="offset points", ha="center", va="bottom", fontsize=8)
    ax.set_xticks([j + width * (len(runs) - 1) / 2 for j in range(len(FILTERS))], FILTERS)
    ax.set_ylabel("accuracy %")
    ax.set_ylim(0, 112)                                      # room for the labels over 100 %
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig

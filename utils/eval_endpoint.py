"""Lab 03 on a model behind an OpenAI-compatible server, through lm-eval's own `local-completions` model.

Why: a model too large for the course's card is usually already served (vLLM, SGLang, `transformers serve`),
and lm-eval's README recommends this route for the largest models. The task is the same lm-eval `gsm8k`
(prompt, stop sequences, filters, exact_match): only who generates changes. lm-eval sends each prompt as
text to <endpoint>/completions (temperature 0, the task's stop sequences, max_tokens) one request at a time,
so the server never batches the course's problems together: its answers match the in-process path at
batch size 1 in the same dtype, not necessarily at a larger batch (padding changes the numerics).
A server that is down, slow or answers with errors stops the lab with the URL named; lm-eval's silent
placeholder for an empty answer is refused too, so a run is never complete on answers it did not get.
"""
from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import urlparse

from . import evaluation as ev
from .eval_settings import EvalSettings

# settings that describe how a model runs here, left at their defaults for a served one
SERVER_KEYS = ("decode", "parallelize", "device", "gptq_backend", "max_batch_size", "tensor_parallel_size",
               "data_parallel_size", "dtype")


class EndpointError(RuntimeError):
    """The server at the endpoint is down, slow, or answered with an error; the message names the URL."""


def task_stop_sequences() -> tuple[str, ...]:
    """The gsm8k task's stop sequences (its `until`), read from the installed task config. Some servers
    (transformers serve 5.23) keep the stop sequence at the end of the text they return, where the in-process
    path cuts it; no stop sequence holds a digit, so neither filter's answer changes."""
    import yaml

    cfg = yaml.safe_load(ev.builtin_task_yaml().read_text())
    return tuple(cfg["generation_kwargs"]["until"])


def completions_url(endpoint: str) -> str:
    """<base>/completions from a base URL such as http://host:8000/v1 (a URL already ending in /completions
    is kept); anything but an http(s) URL is refused, naming the parameter."""
    parsed = urlparse(str(endpoint).strip())
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ev.EvalInputError(f"endpoint: {endpoint!r} is not an http(s) URL; give the server's OpenAI base URL, "
                                "e.g. http://localhost:8000/v1, or leave it empty to load the models in this kernel")
    base = str(endpoint).strip().rstrip("/")
    return base if base.endswith("/completions") else base + "/completions"


def check_endpoint(endpoint: str, served_name: str, timeout_s: float = 30.0) -> dict:
    """One real completion request (1 token) before the evaluation: the server is up, answers within
    timeout_s, serves `served_name`, and speaks the OpenAI completions format. Returns its answer's timing."""
    import requests

    url = completions_url(endpoint)
    t0 = time.monotonic()
    try:
        r = requests.post(url, json={"model": served_name, "prompt": "Question: 1+1?\nAnswer:", "max_tokens": 1,
                                     "temperature": 0}, timeout=timeout_s)
    except requests.Timeout:
        raise EndpointError(f"endpoint: {url} did not answer within {timeout_s:.0f} s (endpoint_timeout_s); is the "
                            "server overloaded or still loading? Nothing was evaluated") from None
    except requests.RequestException as exc:
        raise EndpointError(f"endpoint: {url} does not answer ({type(exc).__name__}: {str(exc)[:200]}); start the "
                            "server there or fix the URL. Nothing was evaluated") from None
    if not r.ok:
        raise EndpointError(f"endpoint: {url} answered HTTP {r.status_code} for model {served_name!r}: "
                            f"{r.text.strip()[:300]}; check that the server serves that model. Nothing was evaluated")
    try:
        text = r.json()["choices"][0]["text"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise EndpointError(f"endpoint: {url} answered, but not in the OpenAI completions format "
                            f"(choices[0].text): {r.text.strip()[:200]}. Nothing was evaluated") from None
    return {"url": url, "served_name": served_name, "probe_seconds": time.monotonic() - t0, "probe_text": text}


def load_endpoint_lm(endpoint: str, tokenizer_path: str, served_name: str, *, timeout_s: float = 300,
                     retries: int = 3, num_concurrent: int = 1, max_gen_toks: int = 256, seed: int = 1234):
    """lm-eval's `local-completions` model: text prompts (the server tokenizes), the local tokenizer only
    for counting tokens."""
    import lm_eval.api.registry

    args = {"model": served_name, "base_url": completions_url(endpoint), "tokenizer_backend": "huggingface",
            "tokenizer": str(tokenizer_path), "tokenized_requests": False, "num_concurrent": int(num_concurrent),
            "max_retries": int(retries), "timeout": int(timeout_s), "max_gen_toks": int(max_gen_toks),
            "seed": int(seed)}
    return lm_eval.api.registry.get_model("local-completions").create_from_arg_obj(args, {"batch_size": 1})


def run_gsm8k_endpoint(endpoint: str, model_path: str, out_dir: str | Path, *, label: str,
                       served_name: str | None = None, timeout_s: float = 300, retries: int = 3,
                       num_concurrent: int = 1, data_files: dict[str, Path] | None,
                       settings: EvalSettings) -> dict:
    """evaluation.run_gsm8k's result with the generations from the server at `endpoint`.

    model_path: the local folder of the served model (its tokenizer counts tokens; its path is also the
    name `transformers serve` knows it by, the default served_name). settings: the lab's (what is evaluated;
    how the model is placed, batched and decoded is the server's business: one request at a time).
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ev.EvalInputError(f"endpoint_timeout_s: {timeout_s!r} must be a number of seconds > 0 (how long one "
                                "request to the server may take)")
    served_name = served_name or str(model_path)
    defaults = EvalSettings()                               # the server's business, not lm-eval's here
    settings = settings.replace(**{k: getattr(defaults, k) for k in SERVER_KEYS}, backend="local-completions",
                                batch_size=1)
    probe = check_endpoint(endpoint, served_name, timeout_s=min(timeout_s, 60))
    lm = load_endpoint_lm(endpoint, model_path, served_name, timeout_s=timeout_s, retries=retries,
                          num_concurrent=num_concurrent, max_gen_toks=settings.max_gen_toks, seed=settings.seed)
    t0 = time.monotonic()
    try:
        run = ev.run_gsm8k(model_path, out_dir, label=label, data_files=data_files, settings=settings, lm=lm)
    except ev.EvalInputError:
        raise
    except Exception as exc:  # noqa: BLE001 - a failure mid-run is the server's, named by its URL
        raise EndpointError(f"endpoint: {probe['url']} failed during the evaluation after {retries} tries per "
                            f"request ({type(exc).__name__}: {str(exc).strip()[:300]}); the run is not complete "
                            "and Lab 03 wrote no results") from exc
    from lm_eval.models.api_models import LMEVAL_MODEL_NONE_ANSWER_PLACEHOLDER as EMPTY

    empty = [p["doc_id"] for p in run["problems"] if p["generation"] == EMPTY]
    if empty:
        raise EndpointError(f"endpoint: {probe['url']} returned no text for {len(empty)} of {run['n']} problems "
                            f"(doc_id {empty[:5]}); lm-eval would score them as wrong answers. The run is not complete")
    run["wall_seconds"] = time.monotonic() - t0
    run["settings"].update(endpoint=probe["url"], served_name=served_name, batch_size=1,
                           num_concurrent=num_concurrent)
    return run

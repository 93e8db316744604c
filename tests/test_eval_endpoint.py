"""Lab 03 on a served model: lm-eval's local-completions against a real `transformers serve` started here on
the fixture model, compared with the in-process path; a server that is down, slow or answers with errors
stops the run with its URL named."""
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from bad_input_table import record
from utils import eval_endpoint as ee
from utils import eval_parallel as ep
from utils import evaluation as ev
from utils.eval_settings import EvalSettings

REPO = Path(__file__).resolve().parents[1]
MODEL = str(REPO / "fixtures" / "tiny-qwen2-gsm" / "bf16")
SETTINGS = EvalSettings(limit=6, max_gen_toks=64)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`transformers serve` on the fixture, float32 on the CPU like the in-process path; its base URL."""
    port = _port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    cli = Path(sys.executable).with_name("transformers")
    proc = subprocess.Popen([str(cli), "serve", MODEL, "--port", str(port), "--device", "cpu", "--dtype", "float32"],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    deadline = time.monotonic() + 180
    while True:
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok:
                break
        except requests.RequestException:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"transformers serve did not come up: {log.read_text()[-2000:]}")
        time.sleep(1)
    yield f"http://127.0.0.1:{port}/v1"
    proc.terminate()
    proc.wait(30)


@pytest.fixture(scope="module")
def data():
    return ev.data_files_from_folder(REPO / "fixtures" / "tiny-qwen2-gsm" / "data")


def test_served_model_scores_like_the_in_process_path(server, data, tmp_path):
    served = ee.run_gsm8k_endpoint(server, MODEL, tmp_path, label="served", data_files=data, settings=SETTINGS)
    here = ev.run_gsm8k(MODEL, tmp_path, label="here", data_files=data, settings=SETTINGS.replace(batch_size=1))
    assert served["n"] == here["n"] == 6 and served["settings"]["backend"] == "local-completions"
    assert served["settings"]["endpoint"] == server + "/completions"
    # the same prompts reached the server: lm-eval's per-sample log holds the in-process path's prompts
    c = ep.compare(here, served, stops=ee.task_stop_sequences())
    assert c["differing_generations"] == 0 and c["differing_scores_strict-match"] == 0, c
    assert c["differing_scores_flexible-extract"] == 0 and served["accuracy"] == here["accuracy"]
    # what differs: the server keeps the stop sequence the in-process path cuts
    raw = ep.compare(here, served)["differing_generations"]
    kept = sum(p["generation"].endswith("Question:") for p in served["problems"])
    assert raw == kept


def test_a_server_that_is_down_is_named(data, tmp_path):
    url = f"http://127.0.0.1:{_port()}/v1"
    with pytest.raises(ee.EndpointError, match=f"endpoint: {url}/completions does not answer") as exc:
        ee.run_gsm8k_endpoint(url, MODEL, tmp_path, label="x", data_files=data, settings=SETTINGS)
    assert "Nothing was evaluated" in str(exc.value) and not (tmp_path / "lm_eval").exists()
    record("served model (endpoint)", "no server at the URL", str(exc.value))


def test_a_server_that_never_answers_is_named(data, tmp_path):
    """A server that accepts the connection and then says nothing (overloaded, hung)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    held = []
    threading.Thread(target=lambda: [held.append(sock.accept()) for _ in range(4)], daemon=True).start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    try:
        with pytest.raises(ee.EndpointError, match=f"endpoint: {url}/completions did not answer within 2 s") as exc:
            ee.run_gsm8k_endpoint(url, MODEL, tmp_path, label="x", data_files=data, timeout_s=2, settings=SETTINGS)
    finally:
        sock.close()
    record("served model (endpoint)", "a server that accepts and never answers (timeout 2 s)", str(exc.value))


def test_a_server_answering_with_an_error_is_named(server, data, tmp_path):
    with pytest.raises(ee.EndpointError, match=f"endpoint: {server}/completions answered HTTP") as exc:
        ee.run_gsm8k_endpoint(server, MODEL, tmp_path, label="x", data_files=data, served_name="no/such-model",
                              settings=SETTINGS)
    assert "no/such-model" in str(exc.value)
    record("served model (endpoint)", "a model name the server does not serve", str(exc.value))


@pytest.mark.parametrize("bad", ["localhost:8000/v1", "ftp://host/v1", "http://"])
def test_an_endpoint_that_is_not_a_url_is_refused(bad):
    with pytest.raises(ev.EvalInputError, match="endpoint: .* is not an http\\(s\\) URL") as exc:
        ep.check_modes(1, False, "hf", bad, "golden", "cpu")
    record("served model (endpoint)", f"endpoint = {bad!r}", str(exc.value))


@pytest.mark.parametrize("args, message", [
    ((2, True, "hf", "", "golden", "cuda"), "shard: True .* set one of them"),
    ((2, False, "vllm", "", "golden", "cuda"), "gpus: applies to backend 'hf'"),
    ((1, True, "hf", "", "golden", "cpu"), "shard: True splits the model over GPUs"),
    ((1, False, "hf", "http://h:1/v1", "both", "cpu"), "endpoint_model: 'both' must be")])
def test_modes_that_cannot_go_together_are_refused(args, message):
    ep.check_modes(args[0], False, "hf", "", "golden", args[5], visible=2)     # each setting alone is fine
    with pytest.raises(ev.EvalInputError, match=message) as exc:
        ep.check_modes(*args, visible=2)
    record("Lab 03 beyond one GPU", f"gpus={args[0]}, shard={args[1]}, backend={args[2]!r}, "
                                    f"endpoint_model={args[4]!r} on {args[5]}", str(exc.value))


def test_vllm_refusal_names_the_versions():
    from importlib.util import find_spec
    if find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: the refusal does not apply")
    with pytest.raises(ev.EvalInputError, match=r"torch==2\.14\.0 .* torch 2\.13\.0 and transformers 5\.23\.0") as exc:
        ev.model_args(MODEL, "vllm")
    record("Lab 03 beyond one GPU", "backend = 'vllm' where vLLM cannot be installed", str(exc.value))


@pytest.mark.parametrize("bad", [0, -5, "30", None])
def test_a_request_time_limit_must_be_positive_seconds(bad, data, tmp_path):
    with pytest.raises(ev.EvalInputError, match="endpoint_timeout_s: .* must be a number of seconds > 0") as exc:
        ee.run_gsm8k_endpoint("http://127.0.0.1:9/v1", MODEL, tmp_path, label="x", data_files=data, timeout_s=bad,
                              settings=EvalSettings())
    record("served model (endpoint)", f"endpoint_timeout_s = {bad!r}", str(exc.value))


@pytest.mark.parametrize("bad", [-1, 2.5, "16"])
def test_compare_problems_must_be_a_whole_number(bad, tmp_path):
    with pytest.raises(ev.EvalInputError, match="compare_problems: .* must be a whole number") as exc:
        ep.agreement(MODEL, tmp_path, problems=bad, gpus=2, data_files=None,
                     settings=EvalSettings(batch_size=1))
    record("Lab 03 beyond one GPU", f"compare_problems = {bad!r}", str(exc.value))

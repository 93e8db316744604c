"""utils.decode: how Lab 03's generate loop runs, what it records, and the extrapolation to 1,319 problems."""
from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from utils import decode
from utils import evaluation as ev
from utils.eval_settings import EvalSettings

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-qwen2-gsm"
DATA = {"train": FIX / "data" / "train.jsonl", "test": FIX / "data" / "test.jsonl"}


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(FIX / "bf16"))
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(FIX / "bf16"), dtype=torch.float32).eval()
    return model, tok


def _fake_lm(device_type="cuda", max_length=2048):
    model = SimpleNamespace(device=torch.device(device_type), generate=lambda **kw: None, config=None)
    return SimpleNamespace(model=model, max_length=max_length)


def test_bad_settings_name_the_parameter():
    with pytest.raises(ValueError, match=r"decode: 'fast' is not one of \['eager', 'compiled'\]"):
        decode.prepare_decode(_fake_lm(), "fast")
    with pytest.raises(ValueError, match="decode: 'compiled' .* needs a GPU; this model is on cpu"):
        decode.prepare_decode(_fake_lm("cpu"), "compiled")
    with pytest.raises(ValueError, match="max_length is 32768"):      # Qwen2.5's own maximum: 32k slots per sequence
        decode.prepare_decode(_fake_lm(max_length=32768), "compiled")
    with pytest.raises(ValueError, match="needs lm-eval's hf model"):
        decode.prepare_decode(SimpleNamespace(model=None), "eager")


def test_static_cache_reused_across_batches_gives_the_eager_tokens(tiny):
    """The cache the compiled mode hands to generate: one per batch size, reset per call. Left-padded
    prompts of different lengths, three calls in a row, greedy: the tokens the default cache gives."""
    model, tok = tiny
    rec = decode.DecodeRecorder(model, "compiled", cache_len=256)
    batches = [["Question: Tom has 3 apples and buys 4 more. How many?\nAnswer:", "Question: 2 + 2?\nAnswer:"],
               ["Question: A train goes 60 km in 1 hour. How far in 3 hours?\nAnswer:", "Question: 9 - 4?\nAnswer:"],
               ["Question: 5 * 6?\nAnswer:"]]
    for prompts in batches:
        ids = tok(prompts, return_tensors="pt", padding=True)
        kw = dict(input_ids=ids["input_ids"], attention_mask=ids["attention_mask"], max_new_tokens=24,
                  do_sample=False, pad_token_id=tok.pad_token_id)
        eager = model.generate(**kw)
        static = model.generate(**kw, past_key_values=rec._static_cache(len(prompts)))
        assert torch.equal(eager, static), prompts
    assert rec._cache_batch == 1                       # the last batch had its own, smaller cache


def test_compiled_mode_that_did_not_compile_is_an_error(tiny):
    model, tok = tiny                                   # on a CPU transformers does not compile the decode step
    rec = decode.DecodeRecorder(model, "compiled", cache_len=128)
    model.generate = rec
    try:
        ids = tok(["Question: 1 + 1?\nAnswer:"], return_tensors="pt")["input_ids"]
        with pytest.raises(RuntimeError, match="did not compile the decode step"):
            model.generate(input_ids=ids, max_new_tokens=4, do_sample=False)
    finally:
        del model.generate                              # the class's generate again


def test_recorder_counts_steps_and_the_steady_cost(tiny):
    model, tok = tiny
    rec = decode.DecodeRecorder(model, "eager", cache_len=None)
    ids = tok(["Question: 1 + 1?\nAnswer:"], return_tensors="pt")["input_ids"]
    for n in (3, 5, 7):
        rec(input_ids=ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    s = rec.summary()
    assert [c["steps"] for c in s["per_call"]] == [3, 5, 7] and s["calls"] == 3 and not s["compiled"]
    later = sorted(c["seconds"] / c["steps"] for c in s["per_call"][1:])
    assert s["steady_ms_per_step"] == pytest.approx(1000 * sum(later) / 2)   # the median of two
    assert s["first_call_s"] == s["per_call"][0]["seconds"] and s["cache_len"] is None


def test_extrapolation_arithmetic():
    eager = {"decode": "eager", "first_call_s": 30.0, "steady_ms_per_step": 100.0}     # 25.6 s per 256-step call
    assert decode.extrapolate_seconds(eager, 16, 256, 1319) == pytest.approx(83 * 25.6 + 4.4)
    compiled = {"decode": "compiled", "first_call_s": 50.0, "steady_ms_per_step": 20.0}   # compile 44.88 s
    assert decode.extrapolate_seconds(compiled, 16, 256, 1319) == pytest.approx(83 * 5.12 + 2 * 44.88)
    assert decode.extrapolate_seconds(compiled, 16, 256, 1312) == pytest.approx(82 * 5.12 + 44.88)  # no last batch
    assert decode.extrapolate_seconds({"decode": "eager", "first_call_s": 1.0, "steady_ms_per_step": None},
                                      16, 256, 1319) is None                            # one call: no steady cost


def test_run_gsm8k_records_the_decode_and_refuses_it_off_hf(tmp_path):
    run = ev.run_gsm8k(str(FIX / "bf16"), tmp_path, label="golden", data_files=DATA,
                       settings=EvalSettings(batch_size=2, limit=4, max_gen_toks=16, decode="eager"))
    d = run["settings"]["decode"]
    assert d["decode"] == "eager" and d["calls"] == math.ceil(4 / 2) and all(c["batch"] == 2 for c in d["per_call"])
    assert json.loads(json.dumps(d)) == d                                   # it goes into results.json as it is
    with pytest.raises(ev.EvalInputError, match="decode: 'compiled' applies to the hf backend only"):
        EvalSettings(backend="vllm", decode="compiled")
    with pytest.raises(ev.EvalInputError, match="decode: 'compiled' .* needs a GPU"):
        ev.run_gsm8k(str(FIX / "bf16"), tmp_path / "c", label="c", data_files=DATA,
                     settings=EvalSettings(limit=2, decode="compiled"))
    assert not any((tmp_path / "c").rglob("results*.json"))

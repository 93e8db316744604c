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
        static = model.generate(**kw, past_key_values=rec._static_cache(len(prompts), None))
        assert torch.equal(eager, static), prompts
    assert rec._cache_batch == 1                       # asked directly, a new batch size gets its own cache


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
    padding = dict(compiled, pads_smaller_batches=True)    # the last 7 problems padded to 16: compiled once
    assert decode.extrapolate_seconds(padding, 16, 256, 1319) == pytest.approx(83 * 5.12 + 44.88)
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


class FakeGenerate:
    """A model whose generate records what it was given and appends `new` tokens that depend on its row
    only (the row's sum, plus the step), as a real model's rows do; marked as compiled."""

    def __init__(self, config, new=3):
        self.config, self.new, self.seen = config, new, []
        self._compiled_call = object()

    def generate(self, input_ids, attention_mask, past_key_values=None, **kwargs):
        self.seen.append({"ids": input_ids.clone(), "mask": attention_mask.clone(), "cache": past_key_values})
        tail = (input_ids.sum(1, keepdim=True) + torch.arange(self.new)) % 500
        return torch.cat([input_ids, tail], 1)


def _batch(rows, width, seed):
    ids = torch.randint(1, 500, (rows, width), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[-1, :2] = 0                                     # the last row left-padded
    return ids, mask


def test_compiled_recorder_pads_a_smaller_batch_to_the_compiled_one():
    from transformers import AutoConfig

    fake = FakeGenerate(AutoConfig.from_pretrained(str(FIX / "bf16")))
    rec = decode.DecodeRecorder(fake, "compiled", cache_len=64)
    outs = [rec(input_ids=ids, attention_mask=mask, max_length=9)
            for ids, mask in (_batch(4, 6, 0), _batch(4, 6, 1), _batch(2, 5, 2))]
    assert [tuple(s["ids"].shape) for s in fake.seen] == [(4, 6), (4, 6), (4, 5)]
    last_ids, last_mask = _batch(2, 5, 2)
    got = fake.seen[-1]
    assert torch.equal(got["ids"][:2], last_ids) and torch.equal(got["mask"][:2], last_mask)
    assert all(torch.equal(got["ids"][r], last_ids[1]) and torch.equal(got["mask"][r], last_mask[1]) for r in (2, 3))
    assert fake.seen[0]["cache"] is fake.seen[1]["cache"] is fake.seen[2]["cache"]    # one static cache
    assert torch.equal(outs[-1], FakeGenerate(None).generate(last_ids, last_mask))   # the real rows only
    s = rec.summary()
    assert [c["padded_rows"] for c in s["per_call"]] == [0, 0, 2] and s["padded_calls"] == 1
    assert [c["batch"] for c in s["per_call"]] == [4, 4, 2] and [c["steps"] for c in s["per_call"]] == [3, 3, 3]
    assert s["pads_smaller_batches"] and s["attention"] == fake.config._attn_implementation
    rec(input_ids=torch.ones(6, 5, dtype=torch.long), attention_mask=torch.ones(6, 5, dtype=torch.long))
    assert fake.seen[-1]["cache"] is not fake.seen[0]["cache"] and rec.calls[-1]["padded_rows"] == 0   # larger: new


def _ones(width):
    ones = torch.ones(4, width, dtype=torch.long)
    return {"input_ids": ones, "attention_mask": ones}


def test_compiled_cache_is_as_long_as_the_first_call_needs_and_grows_when_asked():
    """lm-eval sends its longest prompts first: the cache takes that call's prompt + new tokens, rounded up
    to CACHE_ROUND, capped at max_length; a later call that needs more gets a longer cache, never a shorter."""
    from transformers import AutoConfig

    fake = FakeGenerate(AutoConfig.from_pretrained(str(FIX / "bf16")))
    rec = decode.DecodeRecorder(fake, "compiled", cache_len=2048)
    rec(**_ones(300), max_length=300 + 256)
    assert rec.cache_len == 768 and rec.summary()["max_cache_len"] == 2048
    first = fake.seen[-1]["cache"]
    rec(**_ones(100), max_length=100 + 256)      # shorter: the same cache
    assert rec.cache_len == 768 and fake.seen[-1]["cache"] is first
    rec(**_ones(700), max_new_tokens=256)          # longer: a longer cache
    assert rec.cache_len == 1024 and fake.seen[-1]["cache"] is not first
    rec(**_ones(1900), max_length=1900 + 256)      # capped at max_length
    assert rec.cache_len == 2048 and rec.summary()["cache_len"] == 2048


def test_eager_recorder_never_pads():
    fake = FakeGenerate(None)
    rec = decode.DecodeRecorder(fake, "eager", cache_len=None)
    for ids, mask in (_batch(4, 6, 0), _batch(2, 5, 2)):
        rec(input_ids=ids, attention_mask=mask)
    assert [tuple(s["ids"].shape) for s in fake.seen] == [(4, 6), (2, 5)] and fake.seen[0]["cache"] is None
    assert rec.summary()["padded_calls"] == 0 and not rec.summary()["pads_smaller_batches"]


@pytest.mark.parametrize("attention", ["sdpa", "sdpa_grouped"])
def test_padded_rows_leave_the_real_rows_tokens_unchanged(attention, monkeypatch):
    """The fixture model, a static cache, lm-eval's own gsm8k stop criteria built for the 3 real rows (as HFLM
    builds them): 3 prompts padded to 5 by the recorder give the tokens the 3 alone give, step for step."""
    from lm_eval.models.utils_hf import stop_sequences_criteria
    from transformers import AutoModelForCausalLM, AutoTokenizer, StaticCache

    from utils.attention import use_grouped_attention

    tok = AutoTokenizer.from_pretrained(str(FIX / "bf16"))
    model = AutoModelForCausalLM.from_pretrained(str(FIX / "bf16"), dtype=torch.float32).eval()
    if attention == "sdpa_grouped":
        use_grouped_attention(model)
    lines = [json.loads(x)["question"] for x in DATA["test"].read_text().splitlines()[:5]]
    prompts = [f"Question: {q}\nAnswer:" for q in lines]
    until = ["Question:", "</s>", "<|im_end|>", tok.decode(tok.eos_token_id)]       # gsm8k's, plus EOS
    tok.padding_side = "left"

    def kw(texts):
        enc = tok(texts, return_tensors="pt", padding=True)
        stop = stop_sequences_criteria(tok, until, enc["input_ids"].shape[1], len(texts))
        return dict(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], stopping_criteria=stop,
                    max_length=enc["input_ids"].shape[1] + 48, do_sample=False, pad_token_id=tok.pad_token_id)

    alone = model.generate(**kw(prompts[:3]), past_key_values=StaticCache(config=model.config, max_cache_len=256))
    monkeypatch.setattr(model, "_compiled_call", object(), raising=False)   # on a CPU nothing compiles
    rec = decode.DecodeRecorder(model, "compiled", cache_len=256)
    rec(**kw(prompts))                                   # the compiled batch: 5
    padded = rec(**kw(prompts[:3]))
    assert rec.calls[-1]["padded_rows"] == 2 and torch.equal(padded, alone)
    assert rec.summary()["attention"] == attention


def _cuda_lm(takes=True):
    def switch(name):
        if takes:
            model.config._attn_implementation = name
    model = SimpleNamespace(device=torch.device("cuda"), generate=lambda **kw: None, set_attn_implementation=switch,
                            config=SimpleNamespace(_attn_implementation="sdpa"))
    return SimpleNamespace(model=model, max_length=2048)


def test_compiled_decode_runs_the_grouped_attention_and_eager_keeps_the_model_s():
    lm = _cuda_lm()
    assert decode.prepare_decode(lm, "compiled").summary()["attention"] == "sdpa_grouped"
    lm = _cuda_lm()
    assert decode.prepare_decode(lm, "eager").summary()["attention"] == "sdpa"
    says = r"decode: 'compiled' runs the grouped-query attention: .*kept attention 'sdpa'"
    with pytest.raises(ValueError, match=says):
        decode.prepare_decode(_cuda_lm(takes=False), "compiled")

"""The embedded fixture: its problems are right, its splits are honest, its models are what we claim."""
import json
import random
import re

import pytest
import torch

from utils import fixture, gsm_synth, models

PATHS = fixture.fixture_paths()


@pytest.mark.parametrize("template", sorted(gsm_synth.TEMPLATES))
def test_every_template_writes_correct_gsm8k_records(template):
    rng = random.Random(7)
    for _ in range(300):
        rec = gsm_synth.problem(rng, template)
        gsm_synth.check_record(rec)  # raises on a wrong <<expr=value>> or final line
        assert rec["answer"].splitlines()[-1] == f"#### {rec['result']}"
        assert re.search(r"<<[^>]+=\d+>>", rec["answer"])
        assert rec["question"].endswith("?")


def test_check_record_catches_a_wrong_annotation():
    bad = {"question": "q?", "answer": "2*3 = <<2*3=7>>7\n#### 7", "result": 7}
    with pytest.raises(ValueError, match="wrong annotation"):
        gsm_synth.check_record(bad)


def test_generate_split_is_deterministic_distinct_and_excludes():
    a = gsm_synth.generate_split(200, seed=5)
    assert a == gsm_synth.generate_split(200, seed=5)
    assert len({r["question"] for r in a}) == 200
    b = gsm_synth.generate_split(200, seed=5, exclude=[r["question"] for r in a[:50]])
    assert not {r["question"] for r in a[:50]} & {r["question"] for r in b}


def test_committed_splits_are_the_generated_ones_and_disjoint(tmp_path):
    fresh = fixture.make_data(tmp_path)
    for split in ("train", "test"):
        assert fresh[split].read_bytes() == PATHS[split].read_bytes(), f"{split} differs from its generator"
    train = gsm_synth.read_gsm8k(PATHS["train"])
    test = gsm_synth.read_gsm8k(PATHS["test"])
    assert (len(train), len(test)) == (fixture.N_TRAIN, fixture.N_TEST)
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    assert set(train[0]) == {"question", "answer"}  # GSM8K layout, nothing else
    hard = sum(any(w in r["question"] for w in ("rows of", "packs of")) for r in test)
    assert 0.15 < hard / len(test) < 0.45  # the two harder templates keep accuracy below 100%


def _tuples(path):
    return {gsm_synth.signature(r["question"]) for r in gsm_synth.read_gsm8k(path)}


def test_held_out_problems_share_no_template_and_numbers_with_train():
    # A name or an item is no new problem: every (template, numbers) tuple of the test split is unseen.
    shared = _tuples(PATHS["train"]) & _tuples(PATHS["test"])
    assert not shared, f"{len(shared)} (template, numbers) tuples in both splits, e.g. {sorted(shared)[:3]}"
    assert {t for t, _ in _tuples(PATHS["test"])} == set(gsm_synth.TEMPLATES)  # the task mix is kept


def test_the_training_stream_never_draws_a_test_tuple():
    # The golden model trains on an endless stream, not only on train.jsonl.
    test = _tuples(PATHS["test"])
    stream = gsm_synth.iter_problems(gsm_synth.TRAIN_SEED, split="train")
    assert not any((p["template"], p["numbers"]) in test for p in (next(stream) for _ in range(30000)))


@pytest.mark.parametrize("template", sorted(gsm_synth.TEMPLATES))
def test_signature_reads_template_and_numbers_back_from_the_question(template):
    rng = random.Random(3)
    for split in gsm_synth.SPLITS:
        for _ in range(50):
            p = gsm_synth.problem(rng, template, split=split)
            assert gsm_synth.signature(p["question"]) == (template, p["numbers"])
            assert gsm_synth.split_of(template, p["numbers"]) == split
    with pytest.raises(ValueError, match="no template writes"):
        gsm_synth.signature("How many apples are there?")


def test_read_jsonl_names_the_bad_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"question": "q", "answer": "#### 1"}\n{"question": "no answer"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl line 2 is not a GSM8K record"):
        gsm_synth.read_gsm8k(p)


def test_tokenizer_round_trips_fixture_and_real_gsm8k(shared_gsm8k):
    tok = models.load_tokenizer(PATHS["golden"])
    texts = [gsm_synth.render_example(r) for r in gsm_synth.read_gsm8k(PATHS["test"])[:20]]
    texts += [json.loads(line)["answer"] for line in shared_gsm8k.joinpath("test.jsonl").open().readlines()[:20]]
    texts.append("Question: Ünïcode — 42%?\nAnswer:")
    for text in texts:
        assert tok.decode(tok(text).input_ids) == text
    ids = tok("12345").input_ids
    assert [tok.decode([i]) for i in ids] == list("12345")  # digits one by one, as Qwen2 does


def test_golden_model_shape_suits_gptq_group_size():
    cfg = json.loads((PATHS["golden"] / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert cfg["hidden_size"] % 128 == 0 and cfg["intermediate_size"] % 128 == 0
    assert cfg["num_hidden_layers"] == fixture.MODEL_SHAPE["num_hidden_layers"]


def test_int4_twin_uses_qwens_published_gptq_settings():
    q = json.loads((PATHS["int4"] / "config.json").read_text())["quantization_config"]
    assert q["quant_method"] == "gptq"
    assert (q["bits"], q["group_size"], q["sym"], q["desc_act"]) == (4, 128, True, False)
    damp = q.get("damp_percent", q.get("meta", {}).get("damp_percent"))  # GPTQModel keeps it under meta
    assert damp == pytest.approx(0.01)
    assert models.is_gptq(PATHS["int4"]) and not models.is_gptq(PATHS["golden"])


def test_fixture_is_small_enough_to_commit():
    total = sum(p.stat().st_size for p in fixture.FIXTURE_DIR.rglob("*") if p.is_file())
    assert total <= 20 * 2**20, f"fixture is {total / 2**20:.1f} MiB, over the 20 MiB budget"


def _few_shot_accuracy(path, n=12):
    model = models.load_model(path, device="cpu")
    tok = models.load_tokenizer(path)
    test = gsm_synth.read_gsm8k(PATHS["test"])[:n]
    shots = random.Random(1234).sample(gsm_synth.read_gsm8k(PATHS["train"]), 5)
    return fixture.quick_accuracy(model, tok, test, shots, "cpu", batch=n)


def test_golden_fixture_solves_held_out_problems():
    # The official number is lm-eval's (scripts/fixture_accuracy.py); this guards the committed weights.
    assert _few_shot_accuracy(PATHS["golden"]) >= 0.6


def test_int4_twin_loads_and_generates_through_transformers_gptq():
    model = models.load_model(PATHS["int4"], device="cpu")
    projections = {name: m for name, m in model.named_modules() if name.endswith("_proj")}
    assert len(projections) == 7 * fixture.MODEL_SHAPE["num_hidden_layers"]
    for name, m in projections.items():  # every projection is a GPTQModel kernel holding packed Int4
        assert hasattr(m, "qweight") and m.qweight.dtype == torch.int32, name
        assert type(m).__module__.startswith("gptqmodel"), (name, type(m))
    assert _few_shot_accuracy(PATHS["int4"]) >= 0.5

"""The embedded fixture: its problems are right, its splits are honest, its models are what we claim."""
import itertools
import json
import random
import re

import pytest
import torch

from bad_input_table import record
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


def _problems(path):
    """(template, numbers, answer) of every problem in a split, read back from its text alone."""
    return [(*gsm_synth.signature(r["question"]), int(gsm_synth.final_answer(r["answer"])))
            for r in gsm_synth.read_gsm8k(path)]


def _same_problems(test, train):
    """Test problems that are a training problem with its numbers in another order (or the same
    order) and the same answer: one template, one multiset of numbers, one answer. Whatever order
    leaves a template's answer the same (3*7 for 7*3, a*b-g+d for b*a-g+d) is caught, whichever
    templates there are."""
    seen = {(t, tuple(sorted(n)), a) for t, n, a in train}
    return [(t, n, a) for t, n, a in test if (t, tuple(sorted(n)), a) in seen]


def test_no_held_out_problem_is_a_training_problem_with_its_numbers_reordered():
    test, train = _problems(PATHS["test"]), _problems(PATHS["train"])
    shared = _same_problems(test, train)
    assert not shared, f"{len(shared)} of {len(test)} test problems are training problems reordered, e.g. {shared[:3]}"
    assert {t for t, _, _ in test} == set(gsm_synth.TEMPLATES)  # the task mix is kept


def test_the_training_stream_never_draws_a_held_out_problem():
    # The golden model trains on an endless stream, not only on train.jsonl.
    stream = gsm_synth.iter_problems(gsm_synth.TRAIN_SEED, split="train")
    drawn = [(p["template"], p["numbers"], p["result"]) for p in (next(stream) for _ in range(30000))]
    assert not _same_problems(_problems(PATHS["test"]), drawn)


def test_same_problems_finds_a_reordered_copy_under_every_answer_keeping_order():
    # The check above would see each kind of copy: every order of the numbers that keeps the answer.
    rng = random.Random(11)
    for template in gsm_synth.TEMPLATES:
        for _ in range(50):
            p = gsm_synth.problem(rng, template)
            for order in itertools.permutations(p["numbers"]):
                copy = (template, order, p["result"])
                assert _same_problems([copy], [(template, p["numbers"], p["result"])]) == [copy]
    assert not _same_problems([("sub", (9, 4), 5)], [("sub", (4, 9), -5)])


def _box_plus(rng):
    """A template beside the shipped ones: a*b+c is the same computation as b*a+c, not as c*b+a."""
    a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(2, 30)
    q = f"Ali buys {a} boxes of pens with {b} pens in each box and {c} more pens. How many pens does Ali buy?"
    s = f"Ali buys {a}*{b} = <<{a}*{b}={a * b}>>{a * b} pens in boxes.\nIn all {a * b}+{c} = <<{a * b}+{c}={a * b + c}>>{a * b + c} pens.\n#### {a * b + c}"
    return q, s, a * b + c, (a, b, c)


def _sum_of_three(rng):
    a, b, c = (rng.randint(2, 40) for _ in range(3))
    q = f"Bea has {a} coins, {b} coins and {c} coins. How many coins does Bea have?"
    s = f"Bea has {a}+{b} = <<{a}+{b}={a + b}>>{a + b} and {a + b}+{c} = <<{a + b}+{c}={a + b + c}>>{a + b + c}.\n#### {a + b + c}"
    return q, s, a + b + c, (a, b, c)


@pytest.mark.parametrize("extra", [None, _box_plus, _sum_of_three])
def test_split_of_puts_every_answer_keeping_order_of_the_numbers_in_one_split(extra, monkeypatch):
    # Generic over templates, the shipped ones and two more: which orders leave the computation the
    # same is read from each template's own worked solutions, never listed by hand.
    if extra is not None:
        monkeypatch.setitem(gsm_synth.TEMPLATES, extra.__name__, extra)
    templates = [extra.__name__] if extra else sorted(gsm_synth.TEMPLATES)
    rng = random.Random(5)
    for template in templates:
        for _ in range(200):
            p = gsm_synth.problem(rng, template)
            assert gsm_synth.answer_of(template, p["numbers"]) == p["result"]
            for order in itertools.permutations(range(len(p["numbers"]))):
                moved = tuple(p["numbers"][i] for i in order)
                if gsm_synth.answer_of(template, moved) == p["result"]:
                    assert gsm_synth.split_of(template, moved) == gsm_synth.split_of(template, p["numbers"])
    if extra is _box_plus:
        assert gsm_synth.symmetries("_box_plus") == ((0, 1, 2), (1, 0, 2))
    if extra is _sum_of_three:
        assert len(gsm_synth.symmetries("_sum_of_three")) == 6


def test_symmetries_are_read_from_each_template():
    assert {t: gsm_synth.symmetries(t) for t in gsm_synth.TEMPLATES} == {
        "add": ((0, 1), (1, 0)), "mul": ((0, 1), (1, 0)), "sub": ((0, 1),), "times_together": ((0, 1),),
        "half_more": ((0,),), "packs_three_steps": ((0, 1, 2, 3), (1, 0, 2, 3)),
        "orchard_product": ((0, 1, 2), (1, 0, 2))}
    # Every commuted pair of the small templates is one problem: both orders in one split.
    for a in range(2, 13):
        for b in range(2, 13):
            assert gsm_synth.split_of("mul", (a, b)) == gsm_synth.split_of("mul", (b, a))


def test_a_template_whose_steps_do_not_spell_its_result_is_refused(monkeypatch):
    def no_steps(rng):
        a = rng.randint(2, 9)
        return f"Ali has {a} pens. How many?", f"He has them.\n#### {a * 3}", a * 3, (a,)

    monkeypatch.setitem(gsm_synth.TEMPLATES, "no_steps", no_steps)
    with pytest.raises(ValueError, match="template 'no_steps'.*<<expr=value>>") as err:
        gsm_synth.split_of("no_steps", (4,))
    record("fixture template", "a template whose worked solution has no <<expr=value>> steps", str(err.value))


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


def _script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("fixture_accuracy", fixture.REPO / "scripts" / "fixture_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_recorded_accuracy_is_of_the_committed_weights_and_problems():
    # The one place the fixture's accuracy is quoted from; it is refused once weights or problems change.
    rec = fixture.read_accuracy()
    for key in fixture.MODELS:
        e = rec["models"][key]
        assert e["n"] == len(e["strict_match_correct"]) == fixture.N_TEST
        assert e["accuracy"]["strict-match"]["acc"] == pytest.approx(e["strict_match_correct"].count("1") / e["n"])
        assert 0.5 < e["accuracy"]["strict-match"]["acc"] < 0.98  # a model that can lose something


def test_docs_show_the_recorded_accuracy():
    fixture_accuracy = _script()
    docs = fixture_accuracy.DOCS.read_text()
    assert fixture_accuracy.docs_with_table(docs, fixture.accuracy_markdown(fixture.read_accuracy())) == docs


def test_cpu_tiny_lab03_problems_include_flips():
    # Lab 03's paired test needs discordant pairs: problems one model gets right and the other wrong.
    # The record scores all problems at once; with Int4's bf16 activations a borderline problem can
    # depend on which problems share its batch, so the chain's own subset may show more than this.
    import yaml

    profile = yaml.safe_load((fixture.REPO / "ci" / "profiles" / "cpu-tiny.yaml").read_text())
    limit = profile["labs"]["03_eval"]["gsm8k_limit"]
    assert len(fixture.recorded_flips(fixture.read_accuracy(), limit)) >= 1


def _copy_fixture(tmp_path):
    import shutil

    root = tmp_path / "fx"
    for part in ("data", "bf16", "gptq-int4"):
        shutil.copytree(fixture.FIXTURE_DIR / part, root / part)
    shutil.copy(fixture.ACCURACY, root / "accuracy.json")
    return root


@pytest.mark.parametrize("change", ["weights", "problems", "missing"])
def test_a_stale_accuracy_record_is_refused(tmp_path, change):
    root = _copy_fixture(tmp_path)
    fixture.read_accuracy(root, root / "accuracy.json")  # the copy as shipped is accepted
    if change == "weights":
        w = root / "gptq-int4" / "model.safetensors"
        w.write_bytes(w.read_bytes()[:-1] + b"\0")
    elif change == "problems":
        t = root / "data" / "test.jsonl"
        t.write_text(t.read_text().replace("apples", "pears", 1))
    else:
        (root / "accuracy.json").unlink()
    with pytest.raises(ValueError, match=r"accuracy.json.*fixture_accuracy.py --record") as err:
        fixture.read_accuracy(root, root / "accuracy.json")
    record("fixture accuracy", f"accuracy.json after the fixture's {change} changed" if change != "missing"
           else "accuracy.json missing", str(err.value))


def test_fixture_accuracy_record_refuses_a_partial_or_foreign_run(capsys):
    fixture_accuracy = _script()
    paths = fixture.fixture_paths()
    cases = {"another model as int4": ["--model", str(paths["golden"]), "--data", str(paths["test"].parent), "--record", "int4"],
             "a subset": ["--model", str(paths["golden"]), "--data", str(paths["test"].parent), "--record", "golden",
                          "--limit", "3", "--machine", "x"],
             "no machine": ["--model", str(paths["golden"]), "--data", str(paths["test"].parent), "--record", "golden"]}
    for case, argv in cases.items():
        assert fixture_accuracy.main(argv) == 2
        message = capsys.readouterr().err
        assert "--record" in message
        record("fixture accuracy", f"--record with {case}", message)
    assert fixture.read_accuracy()  # nothing was written

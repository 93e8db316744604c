"""Lab 04's divergence tools: streaming metrics, the logit check, KL statistics, and fault localization."""
import copy
import math

import pytest
import torch

from utils import divergence as dv
from utils import metrics


def tiny_qwen2(seed=0, layers=6):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).eval()


def prompts(n=3, length=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 128, (length + k,), generator=g) for k in range(n)]


def plant_fault(model, layer, scale=100.0):
    """A copy with one 16x16 block of layer `layer`'s mlp.down_proj multiplied by `scale` (dv.plant_fault)."""
    bad = copy.deepcopy(model)
    assert dv.plant_fault(bad, layer, scale) == f"model.layers.{layer}.mlp.down_proj"
    assert not torch.equal(bad.model.layers[layer].mlp.down_proj.weight, model.model.layers[layer].mlp.down_proj.weight)
    return bad


def flip_exponent_bit(model, layer, bit=30):
    """A copy with the top exponent bit of one weight of layer `layer`'s mlp.down_proj flipped (x 2^128)."""
    bad = copy.deepcopy(model)
    with torch.no_grad():
        w = bad.model.layers[layer].mlp.down_proj.weight
        w.view(torch.int32)[3, 5] ^= (1 << bit)
    return bad


def test_accumulator_matches_metrics_and_streams():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(5, 40, generator=g)
    out = ref + 0.1 * torch.randn(5, 40, generator=g)
    whole = dv.MetricAccumulator().update(out, ref).result()
    assert whole["cosine"] == pytest.approx(metrics.cosine_similarity(out, ref), rel=1e-12)
    assert whole["rel_l2"] == pytest.approx(metrics.relative_l2(out, ref), rel=1e-12)
    assert whole["sqnr_db"] == pytest.approx(metrics.sqnr_db(out, ref), rel=1e-12)
    assert whole["max_abs"] == pytest.approx(metrics.max_abs_error(out, ref), rel=1e-12)
    acc = dv.MetricAccumulator()
    for i in range(5):
        acc.update(out[i], ref[i])
    assert acc.result()["rel_l2"] == pytest.approx(whole["rel_l2"], rel=1e-12)
    bad = out.clone()
    bad[0, 0] = float("nan")
    assert math.isnan(dv.MetricAccumulator().update(bad, ref).result()["cosine"])
    with pytest.raises(ValueError, match="shape mismatch"):
        dv.MetricAccumulator().update(out[:2], ref)


def test_cosine_verdict_thresholds():
    assert dv.cosine_verdict(0.995) == "healthy"
    assert dv.cosine_verdict(0.97) == "degraded"
    assert dv.cosine_verdict(0.9) == "critical"
    assert dv.cosine_verdict(float("nan")) == "critical"


def test_logit_check():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(1000, generator=g)
    same = dv.logit_check(a, a.clone())
    assert same["cosine"] == pytest.approx(1.0) and same["mse"] == 0 and same["verdict"] == "healthy"
    noisy = dv.logit_check(a, a + 0.5 * torch.randn(1000, generator=g))
    assert noisy["verdict"] == "critical" and noisy["mse"] == pytest.approx(0.25, rel=0.2)
    with pytest.raises(ValueError, match="vocabulary"):
        dv.logit_check(a, a[:10])


def test_kl_summary_known_values():
    # two predicted tokens, golden (0.6, 0.4), test (0.3, 0.7); the correct token is 0 then 1
    g = torch.log(torch.tensor([[0.6, 0.4], [0.6, 0.4]], dtype=torch.float64))
    t = torch.log(torch.tensor([[0.3, 0.7], [0.3, 0.7]], dtype=torch.float64))
    ids = [torch.tensor([1, 0, 1])]
    s = dv.kl_summary(dv.kl_token_stats([g], [t], ids))
    kl = 0.6 * math.log(0.6 / 0.3) + 0.4 * math.log(0.4 / 0.7)
    assert s["kl_mean"] == pytest.approx(kl) and s["kl_percentiles"]["min"] == pytest.approx(kl)
    assert s["same_top1"] == 0.0 and s["tokens"] == 2
    assert s["dp_mean"] == pytest.approx(((0.3 - 0.6) + (0.7 - 0.4)) / 2, abs=1e-12)
    assert s["dp_rms"] == pytest.approx(0.3) and s["dp_percentiles"]["max"] == pytest.approx(0.3)
    assert s["ppl_golden"] == pytest.approx(math.exp(-(math.log(0.6) + math.log(0.4)) / 2))
    assert s["ppl_test"] == pytest.approx(math.exp(-(math.log(0.3) + math.log(0.7)) / 2))
    assert s["ppl_ratio"] == pytest.approx(s["ppl_test"] / s["ppl_golden"])
    with pytest.raises(ValueError):
        dv.kl_token_stats([g], [t, t], ids)


def test_corpus_kl_identical_model_is_zero_and_padding_ignored():
    model = tiny_qwen2()
    ids = prompts(4)
    lp1 = dv.corpus_logprobs(model, ids, batch_size=4)
    lp2 = dv.corpus_logprobs(model, ids, batch_size=1)  # unpadded: must agree with the padded batch
    assert [x.shape[0] for x in lp1] == [t.numel() - 1 for t in ids]
    for a, b in zip(lp1, lp2):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    s = dv.kl_summary(dv.kl_token_stats(lp1, lp2, ids))
    assert s["kl_mean"] < 1e-6 and s["same_top1"] == 1.0 and s["ppl_ratio"] == pytest.approx(1.0, abs=1e-4)
    bad = dv.corpus_logprobs(plant_fault(model, 2, scale=1000.0), ids, batch_size=4)
    s_bad = dv.kl_summary(dv.kl_token_stats(lp1, bad, ids))
    assert s_bad["kl_mean"] > 1e-3 and s_bad["kl_mean"] > 100 * s["kl_mean"]


@pytest.mark.parametrize("make_bad", [lambda m: plant_fault(m, 3), lambda m: flip_exponent_bit(m, 3)],
                         ids=["block-x100", "exponent-bit-flip"])
def test_planted_fault_is_localized_in_both_modes(make_bad):
    golden = tiny_qwen2()
    bad = make_bad(golden)
    ids = prompts(3)
    cap = dv.golden_layer_capture(golden, ids)
    prop = dv.compare_layers(bad, ids, cap, "propagated")
    iso = dv.compare_layers(bad, ids, cap, "isolated")
    # propagated: layers 0-2 exact, layer 3 is the first below threshold, and the error carries on
    first = dv.first_bad(prop)
    assert first is not None and first["layer"] == 3, first
    assert dv.first_bad(prop, part=None)["module"] == "model.layers.3.mlp"
    layer_rows = [r for r in prop if r["part"] == "layer"]
    assert all(r["cosine"] == pytest.approx(1.0, abs=1e-9) for r in layer_rows[:3])
    assert all(r["rel_l2"] > 1e-3 for r in layer_rows[4:])  # accumulated downstream
    # isolated: only layer 3 (its mlp) is wrong; every other layer, fed the golden input, is exact
    iso_layers = [r for r in iso if r["part"] == "layer"]
    assert dv.first_bad(iso)["layer"] == 3 and dv.worst_layer(iso)["layer"] == 3
    assert [r["layer"] for r in iso_layers if r["rel_l2"] > 1e-6] == [3]
    assert dv.first_bad(iso, part=None)["module"] == "model.layers.3.mlp"


def test_healthy_copy_has_no_bad_layer_and_modes_validate():
    golden = tiny_qwen2()
    ids = prompts(2)
    cap = dv.golden_layer_capture(golden, ids)
    rows = dv.compare_layers(copy.deepcopy(golden), ids, cap, "isolated")
    assert dv.first_bad(rows, part=None) is None
    assert {r["part"] for r in rows} == {"layer", "self_attn", "mlp", "input_layernorm",
                                         "post_attention_layernorm", "logits"}
    with pytest.raises(ValueError, match="mode"):
        dv.compare_layers(golden, ids, cap, "shadow")
    with pytest.raises(ValueError, match="plant_fault_layer"):
        dv.plant_fault(golden, 6)
    fig = dv.plot_layers(rows, "t")           # a bit-identical copy: one line of text, not empty panels
    assert not fig.axes and "bit-identical" in fig.texts[0].get_text()


def test_resolve_models_reads_lab02_else_fixture_only(tmp_path):
    from utils import results
    empty = tmp_path / "run0"
    empty.mkdir()
    fb = dv.resolve_models(str(empty), "fixture", "fixture")
    assert fb["source"] == "fixture" and fb["golden"].endswith("bf16") and "no Lab 02" in fb["note"]
    with pytest.raises(results.ResultsError, match="Lab 02"):
        dv.resolve_models(str(empty), "Qwen/Qwen2.5-7B-Instruct", "fixture")
    run = tmp_path / "run1"
    results.write_results(run / "02_models", "02_models", data={
        "models": {"golden": {"path": "/m/g", "id": "g", "source": "local"},
                   "int4": {"path": "/m/q", "id": "q", "source": "local"}},
        "gsm8k": {"train": None, "test": "/d/test.jsonl", "source": "local"}})
    got = dv.resolve_models(str(run), "x", "y")
    assert (got["golden"], got["int4"], got["test"], got["source"]) == ("/m/g", "/m/q", "/d/test.jsonl", "local")


def test_gsm8k_questions(tmp_path):
    f = tmp_path / "test.jsonl"
    f.write_text('{"question": "a?", "answer": "#### 1"}\n{"question": "b?", "answer": "#### 2"}\n')
    assert dv.gsm8k_questions(str(f), None) == ["a?", "b?"]
    assert dv.gsm8k_questions(str(f), 1) == ["a?"]
    with pytest.raises(FileNotFoundError, match="Lab 02"):
        dv.gsm8k_questions(str(tmp_path / "nope.jsonl"), 5)
    with pytest.raises(ValueError, match="offline"):
        dv.gsm8k_questions(None, 5, offline=True)


def fake_int4(model, group=32):
    """A copy with every decoder Linear weight rounded to symmetric 4-bit per group (RTN), a GPTQ stand-in."""
    q = copy.deepcopy(model)
    with torch.no_grad():
        for name, mod in q.model.layers.named_modules():
            if isinstance(mod, torch.nn.Linear):
                w = mod.weight.view(-1, group)
                scale = w.abs().amax(-1, keepdim=True) / 7
                w.copy_((w / scale).round().clamp(-8, 7) * scale)
    return q


def test_quantization_error_accumulates_in_propagated_not_in_isolated():
    golden = tiny_qwen2()
    ids = prompts(2)
    cap = dv.golden_layer_capture(golden, ids)
    q = fake_int4(golden)
    prop = [r for r in dv.compare_layers(q, ids, cap, "propagated") if r["part"] == "layer"]
    iso = [r for r in dv.compare_layers(q, ids, cap, "isolated") if r["part"] == "layer"]
    assert prop[0]["rel_l2"] == pytest.approx(iso[0]["rel_l2"], rel=0.3)  # layer 0 sees the same input
    assert prop[-1]["rel_l2"] > 1.5 * iso[-1]["rel_l2"]                   # later layers inherit upstream error
    assert all(0 < r["rel_l2"] < 0.5 for r in iso)

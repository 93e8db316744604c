"""Lab 04's divergence tools: streaming metrics, the logit check, KL statistics, and fault localization."""
import copy
import math

import pytest
import torch

from utils import divergence as dv
from utils import localize as lz
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
    """A copy with one 16x16 block of layer `layer`'s mlp.down_proj multiplied by `scale` (lz.plant_fault)."""
    bad = copy.deepcopy(model)
    assert lz.plant_fault(bad, layer, scale) == f"model.layers.{layer}.mlp"
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
    whole = metrics.MetricAccumulator().update(out, ref).result()
    assert whole["cosine"] == pytest.approx(metrics.cosine_similarity(out, ref), rel=1e-12)
    assert whole["rel_l2"] == pytest.approx(metrics.relative_l2(out, ref), rel=1e-12)
    assert whole["sqnr_db"] == pytest.approx(metrics.sqnr_db(out, ref), rel=1e-12)
    assert whole["max_abs"] == pytest.approx(metrics.max_abs_error(out, ref), rel=1e-12)
    acc = metrics.MetricAccumulator()
    for i in range(5):
        acc.update(out[i], ref[i])
    assert acc.result()["rel_l2"] == pytest.approx(whole["rel_l2"], rel=1e-12)
    bad = out.clone()
    bad[0, 0] = float("nan")
    r = metrics.MetricAccumulator().update(bad, ref).result()
    assert math.isnan(r["cosine"]) and r["nonfinite"] == 1 and r["ref_nonfinite"] == 0
    assert metrics.MetricAccumulator().update(ref, bad).result()["ref_nonfinite"] == 1
    with pytest.raises(ValueError, match="shape mismatch"):
        metrics.MetricAccumulator().update(out[:2], ref)


def test_the_rule_reads_cosine_and_normalized_l2_together():
    assert metrics.rule_verdict(0.995, 0.05) == "healthy"
    assert metrics.rule_verdict(0.97, 0.2) == "degraded"
    assert metrics.rule_verdict(0.9, 0.45) == "critical"
    assert metrics.rule_verdict(1.0, 0.3) == "degraded"          # a pure scaling x0.7: cosine blind, L2 not
    assert metrics.rule_verdict(1.0, 0.9) == "critical"          # x0.1
    assert metrics.rule_verdict(float("nan"), 0.0) == "critical"
    assert metrics.rule_verdict(1.0, float("nan")) == "critical"
    assert metrics.rel_l2_at_cosine(0.99) == pytest.approx(0.1425, abs=1e-4)
    assert metrics.rel_l2_at_cosine(0.95) == pytest.approx(0.3287, abs=1e-4)
    # one rule in one place: the layer rule and the logit check read the same thresholds
    assert lz.COS_HEALTHY == dv.COS_HEALTHY == metrics.COS_HEALTHY == 0.99
    assert lz.COS_CRITICAL == dv.COS_CRITICAL == metrics.COS_CRITICAL == 0.95


def test_logit_check_one_vector():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(1000, generator=g)
    same = dv.logit_check(a, a.clone())
    assert same["cosine_worst"] == pytest.approx(1.0) and same["mse_mean"] == 0 and same["verdict"] == "healthy"
    assert same["positions"] == 1 and same["top1_changed"] == 0
    noisy = dv.logit_check(a, a + 0.5 * torch.randn(1000, generator=g))
    assert noisy["verdict"] == "critical" and noisy["mse_mean"] == pytest.approx(0.25, rel=0.2)
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
    lp1 = dv.corpus_logits(model, ids, batch_size=4)
    lp2 = dv.corpus_logits(model, ids, batch_size=1)  # unpadded: must agree with the padded batch
    assert [x.shape[0] for x in lp1] == [t.numel() for t in ids]
    for a, b in zip(lp1, lp2):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    s = dv.kl_summary(dv.kl_token_stats(lp1, lp2, ids))
    assert s["kl_mean"] < 1e-6 and s["same_top1"] == 1.0 and s["ppl_ratio"] == pytest.approx(1.0, abs=1e-4)
    bad = dv.corpus_logits(plant_fault(model, 2, scale=1000.0), ids, batch_size=4)
    s_bad = dv.kl_summary(dv.kl_token_stats(lp1, bad, ids))
    assert s_bad["kl_mean"] > 1e-3 and s_bad["kl_mean"] > 100 * s["kl_mean"]


@pytest.mark.parametrize("make_bad", [lambda m: plant_fault(m, 3), lambda m: flip_exponent_bit(m, 3)],
                         ids=["block-x100", "exponent-bit-flip"])
def test_planted_fault_is_localized_in_both_modes(make_bad):
    golden = tiny_qwen2()
    bad = make_bad(golden)
    ids = prompts(3)
    cap = lz.golden_layer_capture(golden, ids)
    prop = lz.compare_layers(bad, ids, cap, "propagated")
    iso = lz.compare_layers(bad, ids, cap, "isolated")
    # propagated: layers 0-2 exact, layer 3 is the first below threshold, and the error carries on
    first = lz.first_bad(prop, part="layer")
    assert first is not None and first["layer"] == 3, first
    assert lz.first_bad(prop)["module"] == "model.layers.3.mlp"
    layer_rows = [r for r in prop if r["part"] == "layer"]
    assert all(r["cosine"] == pytest.approx(1.0, abs=1e-9) for r in layer_rows[:3])
    assert all(r["rel_l2"] > 1e-3 for r in layer_rows[4:])  # accumulated downstream
    # isolated: only layer 3 (its mlp) is wrong; every other layer, fed the golden input, is exact
    iso_layers = [r for r in iso if r["part"] == "layer"]
    assert lz.first_bad(iso)["layer"] == 3 and lz.worst_module(iso)["module"] == "model.layers.3.mlp"
    assert [r["layer"] for r in iso_layers if r["rel_l2"] > 1e-6] == [3]
    assert lz.first_bad(iso)["module"] == "model.layers.3.mlp"


def test_healthy_copy_has_no_bad_layer_and_modes_validate():
    golden = tiny_qwen2()
    ids = prompts(2)
    cap = lz.golden_layer_capture(golden, ids)
    rows = lz.compare_layers(copy.deepcopy(golden), ids, cap, "isolated")
    assert lz.first_bad(rows) is None and lz.worst_module(rows) is None
    assert {r["part"] for r in rows} == {"embed", "layer", "self_attn", "mlp", "input_layernorm",
                                         "post_attention_layernorm", "final_norm", "logits"}
    with pytest.raises(ValueError, match="mode"):
        lz.compare_layers(golden, ids, cap, "shadow")
    with pytest.raises(ValueError, match="plant_fault_layer"):
        lz.plant_fault(golden, 6)
    fig = lz.plot_layers(rows, "t")           # a bit-identical copy: one line of text, not empty panels
    assert not fig.axes and "bit-identical" in fig.texts[0].get_text()


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
    cap = lz.golden_layer_capture(golden, ids)
    q = fake_int4(golden)
    prop = [r for r in lz.compare_layers(q, ids, cap, "propagated") if r["part"] == "layer"]
    iso = [r for r in lz.compare_layers(q, ids, cap, "isolated") if r["part"] == "layer"]
    assert prop[0]["rel_l2"] == pytest.approx(iso[0]["rel_l2"], rel=0.3)  # layer 0 sees the same input
    assert prop[-1]["rel_l2"] > 1.5 * iso[-1]["rel_l2"]                   # later layers inherit upstream error
    assert all(0 < r["rel_l2"] < 0.5 for r in iso)


# ---------------------------------------------------------------- the logit check over all positions
def logits_set(n=3, length=40, vocab=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(length + k, vocab, generator=g) for k in range(n)]


def with_noise(golden, rel, seed=1):
    """Each position plus random noise of normalized L2 `rel` (cosine about 1/sqrt(1+rel^2))."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for x in golden:
        n = torch.randn(x.shape, generator=g)
        out.append(x + rel * n * x.norm(dim=-1, keepdim=True) / n.norm(dim=-1, keepdim=True))
    return out


def per_position_cosine(golden, test):
    return torch.cat([torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1)
                      for a, b in zip(golden, test)])


def test_logit_check_all_positions_degraded_is_not_healthy():
    golden = logits_set()
    test = with_noise(golden, 0.27)
    cos = per_position_cosine(golden, test)
    assert 0.95 <= float(cos.min()) and float(cos.max()) <= 0.98  # every position in the degraded band
    check = dv.logit_check(golden, test)
    assert check["positions"] == cos.numel() and check["prompts"] == 3
    assert check["cosine_worst"] == pytest.approx(float(cos.min()))
    assert check["cosine_mean"] == pytest.approx(float(cos.mean()))
    assert check["cosine_p1"] == pytest.approx(float(torch.quantile(cos, 0.01)))
    assert check["verdict_worst"] == check["verdict_p1"] == check["verdict_mean"] == "degraded"
    assert check["verdict"] == "degraded" and "0.99" in check["rule"] and "0.95" in check["rule"]


def test_logit_check_reads_every_position_not_the_last_token():
    golden = logits_set()
    test = with_noise(golden, 0.27)
    for g, t in zip(golden, test):
        t[-1] = g[-1]  # the last token of every prompt is untouched: the one-token reading is blind
    assert dv.logit_check(golden[0][-1], test[0][-1])["verdict"] == "healthy"
    assert dv.logit_check(golden, test)["verdict"] == "degraded"


def test_logit_check_counts_top1_changes():
    golden = logits_set()
    test = [x.clone() for x in golden]
    changed = [(0, 3), (1, 0), (2, 17), (2, 18)]
    for k, t in changed:  # swap the top two logits: the decision changes, the vector barely does
        top2 = test[k][t].topk(2).indices
        test[k][t, top2] = test[k][t, top2.flip(0)]
    check = dv.logit_check(golden, test)
    assert check["top1_changed"] == len(changed)
    assert check["top1_changed_pct"] == pytest.approx(100 * len(changed) / check["positions"])
    assert dv.logit_check(golden, [x.clone() for x in golden])["top1_changed"] == 0


def test_logit_check_one_critical_position_is_not_healthy():
    golden = logits_set(n=4, length=60)
    test = [x.clone() for x in golden]
    test[2][7] = torch.randn(64, generator=torch.Generator().manual_seed(5))  # one corrupted position
    check = dv.logit_check(golden, test)
    assert check["verdict_p1"] == "healthy" and check["verdict_worst"] == "critical"
    assert check["verdict"] == "degraded" and check["worst_at"] == "prompt 2, position 7"


def test_logit_check_names_non_finite():
    golden = logits_set()
    test = [x.clone() for x in golden]
    test[1][2, 5] = float("nan")
    test[2][9, :3] = float("inf")
    check = dv.logit_check(golden, test)
    assert check["verdict"] == "non-finite" and check["nonfinite"] == 4
    assert check["nonfinite_positions"] == 2 and check["first_nonfinite"] == "prompt 1, position 2"
    assert all(map(math.isfinite, (check["cosine_worst"], check["cosine_p1"], check["cosine_mean"])))


# ---------------------------------------------------------------- non-finite values are named
def test_non_finite_layer_output_is_named_with_count_and_first_module():
    golden = tiny_qwen2()
    bad = copy.deepcopy(golden)
    with torch.no_grad():
        bad.model.layers[2].mlp.down_proj.weight[0, 0] = float("inf")
    ids = prompts(2)
    cap = lz.golden_layer_capture(golden, ids)
    for mode in ("propagated", "isolated"):
        rows = lz.compare_layers(bad, ids, cap, mode)
        first = lz.first_nonfinite(rows)
        assert first["module"] == "model.layers.2.mlp" and first["nonfinite"] > 0, (mode, first)
        assert lz.first_bad(rows)["module"] == "model.layers.2.mlp"
        assert lz.module_verdict(first) == "non-finite"
        text = lz.describe(first)
        assert "non-finite" in text and str(first["nonfinite"]) in text and "cosine nan" not in text
    assert lz.first_nonfinite(lz.compare_layers(copy.deepcopy(golden), ids, cap, "propagated")) is None


def test_kl_summary_names_non_finite_tokens():
    g = torch.log(torch.tensor([[0.6, 0.4], [0.6, 0.4], [0.5, 0.5]], dtype=torch.float64))
    t = g.clone()
    t[1, 0] = float("nan")
    s = dv.kl_summary(dv.kl_token_stats([g], [t], [torch.tensor([1, 0, 1, 0])]))
    assert s["nonfinite"] == 1 and s["first_nonfinite"] == "text 0, token 1"
    clean = dv.kl_summary(dv.kl_token_stats([g], [g.clone()], [torch.tensor([1, 0, 1, 0])]))
    assert clean["nonfinite"] == 0 and clean["first_nonfinite"] is None


# ---------------------------------------------------------------- the logit check sees scale
SCALES = (0.1, 0.5, 0.7, 0.8, 0.9, 0.95, 1.05, 1.1, 1.2, 1.3, 1.5, 2.0, 10.0)


def verdict_of_scale(s):
    """What the layer rule says of logits times s: cosine 1, normalized L2 |s - 1|."""
    rel = abs(s - 1)
    return "healthy" if rel <= lz.rel_l2_at_cosine(0.99) else "degraded" if rel <= lz.rel_l2_at_cosine(0.95) \
        else "critical"


def pooled_row(golden, test):
    """The per-layer table's `logits` row for these logits (what compare_layers accumulates)."""
    acc = metrics.MetricAccumulator()
    for g, t in zip(golden, test):
        acc.update(t, g)
    return {"module": "logits", "part": "logits", **acc.result()}


@pytest.mark.parametrize("s", SCALES)
def test_logit_check_sees_a_pure_scaling_as_the_layer_rule_does(s):
    golden = logits_set()
    test = [x * s for x in golden]
    check = dv.logit_check(golden, test)
    layer = lz.module_verdict(pooled_row(golden, test))
    assert check["cosine_worst"] == pytest.approx(1.0) and check["top1_changed"] == 0   # cosine and top-1 are blind
    assert check["rel_l2_mean"] == pytest.approx(abs(s - 1)) and check["rel_l2_worst"] == pytest.approx(abs(s - 1))
    assert check["verdict"] == layer == verdict_of_scale(s), (s, check["verdict"], layer)
    row = dv.logit_check_verdict(check)
    assert row["verdict"] == dv.VERDICT_STATUS[layer] and "normalized L2" in row["detail"]
    one = dv.logit_check(golden[0][-1], test[0][-1])              # the report's one reading, the same rule
    assert one["verdict"] == verdict_of_scale(s)


def test_logit_check_rule_names_both_bars():
    check = dv.logit_check(logits_set(), logits_set())
    for text in ("0.99", "0.95", "0.142", "0.329", "normalized L2"):
        assert text in check["rule"], text


@pytest.mark.parametrize("s", [0.1, 0.7, 1.3, 10.0])
def test_final_norm_scaled_logit_check_and_logits_row_agree(s):
    """The fault of the lab: the final norm's weight times s scales every logit. The logit check over every
    position and the per-layer table's propagated `logits` row give the same verdict, the layer rule's."""
    golden = tiny_qwen2()
    bad = copy.deepcopy(golden)
    with torch.no_grad():
        bad.model.norm.weight.mul_(s)
    ids = prompts(3)
    check = dv.logit_check(dv.corpus_logits(golden, ids), dv.corpus_logits(bad, ids))
    rows = lz.compare_layers(bad, ids, lz.golden_layer_capture(golden, ids), "propagated")
    logits_row = next(r for r in rows if r["part"] == "logits")
    assert lz.module_verdict(logits_row) == check["verdict"] == verdict_of_scale(s)
    row = dv.logit_check_verdict(check, rows)
    assert row["verdict"] == dv.VERDICT_STATUS[verdict_of_scale(s)]
    assert f"logits row (propagated): {lz.module_verdict(logits_row)}" in row["detail"], row["detail"]


def test_small_noise_still_reads_healthy_and_large_noise_does_not():
    golden = logits_set()
    assert dv.logit_check(golden, with_noise(golden, 0.05))["verdict"] == "healthy"
    assert dv.logit_check(golden, with_noise(golden, 0.2))["verdict"] == "degraded"
    assert dv.logit_check(golden, with_noise(golden, 0.5))["verdict"] == "critical"

"""Lab 04's layer rule on the fixture model: faults that cosine alone cannot see are found where they are."""
import copy

import pytest
import torch

from utils import divergence as dv
from utils import localize as lz

LAYER = 3


def largest_weight_x256(m):
    """The largest-magnitude weight of one matrix made 256x larger (an exponent off by 8)."""
    w = m.model.layers[LAYER].mlp.down_proj.weight
    w.view(-1)[w.abs().argmax()] *= 256


FAULTS = {  # name: (plant it in place, the module where it must be found)
    "norm-weight-x0.5": (lambda m: m.model.layers[LAYER].input_layernorm.weight.mul_(0.5),
                         f"model.layers.{LAYER}.input_layernorm"),
    "norm-channels-zeroed": (lambda m: m.model.layers[LAYER].post_attention_layernorm.weight[:32].zero_(),
                             f"model.layers.{LAYER}.post_attention_layernorm"),
    "single-weight-x256": (largest_weight_x256, f"model.layers.{LAYER}.mlp"),
}


@pytest.fixture(scope="module")
def fixture_model():
    from utils import models
    from utils.fixture import fixture_paths
    from utils.results import read_jsonl
    paths = fixture_paths()
    tok = models.load_tokenizer(paths["golden"])
    golden = models.load_model(paths["golden"], "cpu", torch.float32)
    questions = [r["question"] for r in read_jsonl(paths["test"])][:2]
    ids = dv.tokenize_corpus(tok, questions, 32)
    return golden, ids, lz.golden_layer_capture(golden, ids)


def faulty(golden, plant):
    bad = copy.deepcopy(golden)
    with torch.no_grad():
        plant(bad)
    return bad


@pytest.mark.parametrize("mode", ["propagated", "isolated"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_is_localized_in_both_modes(fixture_model, fault, mode):
    golden, ids, cap = fixture_model
    plant, where = FAULTS[fault]
    rows = lz.compare_layers(faulty(golden, plant), ids, cap, mode)
    first = lz.first_bad(rows)
    assert first is not None and first["module"] == where, (fault, mode, first)
    assert lz.module_verdict(first) in ("degraded", "critical")
    if mode == "isolated":  # the local error is largest where the fault is
        assert lz.worst_module(rows)["module"] == where


def test_pure_scaling_passes_cosine_but_not_the_rule(fixture_model):
    golden, ids, cap = fixture_model
    plant, where = FAULTS["norm-weight-x0.5"]
    row = next(r for r in lz.compare_layers(faulty(golden, plant), ids, cap, "isolated") if r["module"] == where)
    assert row["cosine"] > 0.9999 and row["rel_l2"] == pytest.approx(0.5, rel=1e-3)
    assert lz.module_verdict(row) == "critical"  # normalized L2 0.5 > the 0.33 that cosine 0.95 allows


def test_error_free_model_names_no_worst_module(fixture_model):
    golden, ids, cap = fixture_model
    rows = lz.compare_layers(copy.deepcopy(golden), ids, cap, "isolated")
    assert lz.first_bad(rows) is None and lz.worst_module(rows) is None


def test_tied_lm_head_fault_is_attributed_to_the_shared_matrix(fixture_model):
    golden, ids, cap = fixture_model
    assert lz.tied_parameters(golden) == [["model.embed_tokens.weight", "lm_head.weight"]]
    bad = faulty(golden, lambda m: m.lm_head.weight[:, :16].mul_(4.0))
    assert torch.equal(bad.model.embed_tokens.weight, bad.lm_head.weight)  # one tensor: edited once, both
    ties = lz.tied_parameters(bad)
    for mode in ("propagated", "isolated"):
        first = lz.first_bad(lz.compare_layers(bad, ids, cap, mode))
        assert first["module"] == "model.embed_tokens", (mode, first)  # not a layer-0 fault
        text = lz.describe(first, ties)
        assert "lm_head.weight" in text and "tied" in text, text


@pytest.mark.parametrize("s", [0.1, 0.7, 1.3, 10.0])
def test_final_norm_scaling_reads_the_same_in_the_logit_check_and_the_logits_row(fixture_model, s):
    """The final norm's weight times s scales every logit of the fixture: cosine stays 1.000 (x0.1 is a mean KL of
    about 4 nats), so only the normalized L2 sees it, in the logit check as in the per-layer `logits` row."""
    golden, ids, cap = fixture_model
    bad = faulty(golden, lambda m: m.model.norm.weight.mul_(s))
    check = dv.logit_check(dv.corpus_logits(golden, ids), dv.corpus_logits(bad, ids))
    row = next(r for r in lz.compare_layers(bad, ids, cap, "propagated") if r["part"] == "logits")
    expected = "healthy" if abs(s - 1) <= 0.1425 else "degraded" if abs(s - 1) <= 0.3287 else "critical"
    assert check["cosine_mean"] == pytest.approx(1.0, abs=1e-5)
    assert check["verdict"] == lz.module_verdict(row) == expected, (s, check["verdict"], row)


def test_the_fixture_int4_twin_reads_healthy_on_the_mean(fixture_model):
    """Int4 rounding of the fixture is healthy on the mean by the same rule (its rare far positions keep their
    own worst and p1 verdicts)."""
    from utils import models
    from utils.fixture import fixture_paths
    golden, ids, _ = fixture_model
    int4 = models.load_model(fixture_paths()["int4"], "cpu")
    check = dv.logit_check(dv.corpus_logits(golden, ids), dv.corpus_logits(int4, ids))
    assert check["verdict_mean"] == "healthy", {k: v for k, v in check.items() if k != "rule"}
    assert check["rel_l2_mean"] < 0.142 and check["cosine_mean"] > 0.99

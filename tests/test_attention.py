"""utils.attention: the grouped-query attention computes what transformers' sdpa does, reads the unexpanded
K/V, really runs once a model is switched to it, and hands every case it does not cover to the stock path."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from utils import attention as at

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-qwen2-gsm" / "bf16"
PROMPTS = ["Question: Tom has 3 apples and buys 4 more. How many apples does he have?\nAnswer:",
           "Question: 2 + 2?\nAnswer:", "Question: A train goes 60 km in 1 hour. How far in 3 hours?\nAnswer:"]


def stock(*args, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward(*args, **kwargs)


def module(groups, causal=True):
    return SimpleNamespace(num_key_value_groups=groups, is_causal=causal, training=False, layer_idx=0)


def tensors(b, hkv, groups, length, s, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hkv * groups, length, d, generator=g)
    k, v = torch.randn(b, hkv, s, d, generator=g), torch.randn(b, hkv, s, d, generator=g)
    return q, k, v


def padded_causal_mask(b, length, s, pad):
    """[B, 1, L, S] bool: row i of the last L query tokens sees keys up to s - L + i, minus each row's left padding."""
    pos = torch.arange(s)
    causal = pos[None, :] <= (s - length + torch.arange(length))[:, None]
    keep = pos[None, :] >= torch.tensor(pad)[:, None]
    return (causal[None] & keep[:, None])[:, None]


@pytest.fixture
def sdpa_spy(monkeypatch):
    """Every call of torch's SDPA: (query shape, key shape, mask) as the attention hands them over."""
    calls, orig = [], F.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        calls.append((tuple(q.shape), tuple(k.shape), kwargs.get("attn_mask")))
        return orig(q, k, v, *args, **kwargs)
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return calls


@pytest.mark.parametrize("length", [1, 5])
@pytest.mark.parametrize("float_mask", [False, True])
def test_same_output_as_stock_sdpa_on_random_tensors(length, float_mask, sdpa_spy):
    b, hkv, groups, s = 3, 2, 7, 12                                # Qwen2.5-7B's 7 query heads per K/V head
    q, k, v = tensors(b, hkv, groups, length, s)
    mask = padded_causal_mask(b, length, s, pad=[0, 3, 6])
    if float_mask:
        mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    ours, w = at.sdpa_grouped_attention_forward(module(groups), q, k, v, mask, scaling=0.3)
    ref, _ = stock(module(groups), q, k, v, mask, scaling=0.3)
    assert w is None and ours.shape == (b, length, hkv * groups, 16) and ours.is_contiguous()
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    (qs, ks, m), = sdpa_spy[:1]
    assert qs == (b, hkv, groups * length, 16) and ks == (b, hkv, s, 16)        # K/V as given, not expanded
    assert m.shape == (b, 1, groups * length, s)
    if length == 1:                                             # one row per head: a view of the caller's mask
        assert m.stride(2) == 0 and m.data_ptr() == mask.data_ptr()


def test_rows_follow_repeat_kv_head_order():
    """Query head h reads K/V head h // G (repeat_kv's order): swap two K/V heads and only their query heads change."""
    q, k, v = tensors(1, 3, 4, 2, 6, seed=1)
    mask = padded_causal_mask(1, 2, 6, pad=[1])
    a, _ = at.sdpa_grouped_attention_forward(module(4), q, k, v, mask)
    b, _ = at.sdpa_grouped_attention_forward(module(4), q, k[:, [1, 0, 2]], v[:, [1, 0, 2]], mask)
    changed = [h for h in range(12) if not torch.equal(a[:, :, h], b[:, :, h])]
    assert changed == list(range(8))                            # heads 0-3 (K/V head 0) and 4-7 (K/V head 1)


NOT_DELEGATED = {
    "decode step, mask": dict(groups=4, length=1, mask=True),
    "prefill, mask": dict(groups=4, length=5, mask=True),
    "one token, no mask": dict(groups=4, length=1, mask=False),
    "non-causal module, no mask": dict(groups=4, length=5, mask=False, causal=False),
}
DELEGATED = {
    "no grouping": (dict(groups=1, length=1, mask=True), "no grouping"),
    "causal, no mask, L > 1": (dict(groups=4, length=5, mask=False), "is_causal"),
    "sliding window": (dict(groups=4, length=1, mask=True, kw={"sliding_window": 4}), "sliding window"),
    "dropout": (dict(groups=4, length=1, mask=True, kw={"dropout": 0.1}), "dropout"),
    "output_attentions": (dict(groups=4, length=1, mask=True, kw={"output_attentions": True}), "output_attentions"),
    "mask per head": (dict(groups=4, length=1, mask="heads"), "shared by all heads"),
    "position bias": (dict(groups=4, length=1, mask=True, kw={"position_bias": torch.zeros(1, 8, 1, 6)}), "bias"),
}


def case(groups, length, mask, causal=True, kw=None):
    q, k, v = tensors(2, 2, groups, length, 6, seed=2)
    m = padded_causal_mask(2, length, 6, pad=[0, 2]) if mask else None
    if mask == "heads":
        m = m.expand(2, 2 * groups, length, 6)
    return (module(groups, causal), q, k, v, m), dict(kw or {})


@pytest.mark.parametrize("name", sorted(NOT_DELEGATED))
def test_grouped_cases_never_reach_the_stock_path(name, monkeypatch):
    args, kw = case(**NOT_DELEGATED[name])
    assert at.delegate_reason(*args[:2], args[2], args[4], **kw) is None
    ref, _ = stock(*args, **kw)
    import transformers.integrations.sdpa_attention as sa
    monkeypatch.setattr(sa, "sdpa_attention_forward", lambda *a, **k: pytest.fail("delegated"))
    out, _ = at.sdpa_grouped_attention_forward(*args, **kw)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(DELEGATED))
def test_each_delegate_case_runs_the_stock_path(name, monkeypatch):
    spec, why = DELEGATED[name]
    args, kw = case(**spec)
    assert why in at.delegate_reason(*args[:2], args[2], args[4], **kw)
    import transformers.integrations.sdpa_attention as sa
    seen, orig = [], sa.sdpa_attention_forward
    monkeypatch.setattr(sa, "sdpa_attention_forward", lambda *a, **k: seen.append(k) or orig(*a, **k))
    monkeypatch.setattr(at, "grouped_rows", lambda *a, **k: pytest.fail("grouped rows used"))
    out, _ = at.sdpa_grouped_attention_forward(*args, **kw)
    assert len(seen) == 1 and all(seen[0][key] is val for key, val in kw.items())   # its arguments, untouched
    if "dropout" not in kw:
        torch.testing.assert_close(out, orig(*args, **kw)[0], rtol=0, atol=0)


def test_switching_a_model_that_cannot_take_it_is_an_error():
    with pytest.raises(ValueError, match="attention: SimpleNamespace has no set_attn_implementation"):
        at.use_grouped_attention(SimpleNamespace(config=SimpleNamespace()))
    stubborn = SimpleNamespace(config=SimpleNamespace(_attn_implementation="eager"),
                               set_attn_implementation=lambda name: None)       # warns and keeps its own
    with pytest.raises(ValueError, match="kept attention 'eager' when asked for 'sdpa_grouped'"):
        at.use_grouped_attention(stubborn)


# ---- the fixture model (trained, 4 query heads over 2 K/V heads), float32 on the CPU ----

@pytest.fixture(scope="module")
def models():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(FIX))
    tok.padding_side = "left"
    load = lambda: AutoModelForCausalLM.from_pretrained(str(FIX), dtype=torch.float32).eval()  # noqa: E731
    base, grouped = load(), load()
    assert base.config.num_key_value_heads < base.config.num_attention_heads     # the fixture is GQA
    assert base.config._attn_implementation == "sdpa"
    assert at.use_grouped_attention(grouped) == "sdpa_grouped"
    return tok, base, grouped


@pytest.fixture
def grouped_calls(monkeypatch):
    """The query lengths of every call that took the grouped rows: empty if the model fell back silently."""
    lengths, orig = [], at.grouped_rows
    monkeypatch.setattr(at, "grouped_rows", lambda q, m, g: lengths.append(q.shape[2]) or orig(q, m, g))
    return lengths


def test_padded_batch_logits_match_stock_sdpa(models, grouped_calls):
    tok, base, grouped = models
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    assert (enc["attention_mask"] == 0).any()                   # left padding is in play
    with torch.no_grad():
        ref, out = base(**enc).logits, grouped(**enc).logits
    assert grouped_calls == [enc["input_ids"].shape[1]] * grouped.config.num_hidden_layers
    real = enc["attention_mask"].bool()
    torch.testing.assert_close(out[real], ref[real], rtol=1e-5, atol=1e-5)
    assert not torch.equal(ref[0, -1], ref[1, -1])              # the rows are different sequences


def test_static_cache_generate_gives_the_stock_tokens(models, grouped_calls, sdpa_spy):
    from transformers import StaticCache

    tok, base, grouped = models
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    new, runs = 24, {}
    for name, model in (("stock", base), ("grouped", grouped)):
        sdpa_spy.clear()                                        # keep the grouped run's calls only
        cache = StaticCache(config=model.config, max_cache_len=128)
        runs[name] = model.generate(**enc, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                                    past_key_values=cache, return_dict_in_generate=True, output_logits=True)
    assert torch.equal(runs["grouped"].sequences, runs["stock"].sequences)
    for a, b in zip(runs["grouped"].logits, runs["stock"].logits):   # the prefill's last token, then each step
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    layers, prompt = grouped.config.num_hidden_layers, enc["input_ids"].shape[1]
    assert grouped_calls == [prompt] * layers + [1] * layers * (new - 1)        # prefill, then every decode step
    kv = grouped.config.num_key_value_heads
    groups = grouped.config.num_attention_heads // kv
    decode = [m for q, k, m in sdpa_spy if q[2] == groups]
    assert len(decode) == layers * (new - 1) and all(q[1] == k[1] == kv for q, k, _ in sdpa_spy)
    assert all(m.shape == (len(PROMPTS), 1, groups, 128) and m.stride(2) == 0 for m in decode)  # the mask, not copied


def test_compiled_decode_step_reads_the_unexpanded_cache(models):
    """The decode step as transformers compiles it (fullgraph, here through dynamo's graph without inductor:
    a graph break would be an error): stock sdpa's graph calls SDPA on K/V expanded to every query head,
    the grouped one's on the cache's own K/V heads, and both give the stock eager tokens."""
    from transformers import CompileConfig, StaticCache

    tok, base, grouped = models
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    eager = base.generate(**enc, max_new_tokens=8, do_sample=False, pad_token_id=0,
                          past_key_values=StaticCache(config=base.config, max_cache_len=64))
    kv, heads = base.config.num_key_value_heads, base.config.num_attention_heads
    for model, key_heads in ((base, heads), (grouped, kv)):
        shapes = []

        def backend(gm, example_inputs):
            shapes.extend(tuple(n.args[1].meta["example_value"].shape) for n in gm.graph.nodes
                          if n.op == "call_function" and "scaled_dot_product" in str(n.target))
            return gm.forward
        config = CompileConfig(fullgraph=True, backend=backend, mode=None, dynamic=False)
        config._compile_all_devices = True                      # transformers compiles on a GPU only by default
        try:
            out = model.generate(**enc, max_new_tokens=8, do_sample=False, pad_token_id=0, compile_config=config,
                                 past_key_values=StaticCache(config=model.config, max_cache_len=64))
        finally:
            del model._compiled_call
            torch._dynamo.reset()
        assert torch.equal(out, eager)
        assert len(shapes) == model.config.num_hidden_layers and {s[1] for s in shapes} == {key_heads}

"""scripts/make_7b_pair.py: Qwen2.5-7B-Instruct's exact config, and (at a tiny size, on the CPU) a BF16
model + GPTQ-Int4 twin that transformers' GPTQ integration loads, with the Int4 weights the RTN of the
BF16 ones in the right orientation, and a tokenizer that spans the vocabulary."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from utils import fetch, gptq, models

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "fixtures" / "tiny-qwen2-gsm" / "data"


def _script():
    spec = importlib.util.spec_from_file_location("make_7b_pair", REPO / "scripts" / "make_7b_pair.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_7b_pair"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_config_is_qwen25_7b_instruct():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    m = _script()
    cfg = Qwen2Config(**m.QWEN25_7B)
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (3584, 18944, 28)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size) == (28, 4, 152064)
    assert cfg.rope_parameters["rope_theta"] == 1e6 and cfg.rms_norm_eps == 1e-6
    assert cfg.tie_word_embeddings is False and cfg.max_position_embeddings == 32768
    with torch.device("meta"):
        n = sum(p.numel() for p in Qwen2ForCausalLM(cfg).parameters())
    assert n == 7_615_616_512                      # Qwen2.5-7B-Instruct's parameter count


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    out = tmp_path_factory.mktemp("pair")
    assert _script().main(["--out", str(out), "--data", str(DATA), "--tiny", "--device", "cpu"]) == 0
    return out


def test_tiny_pair_loads_and_the_int4_twin_is_the_rtn_of_the_bf16_weights(pair):
    golden, int4 = pair / "bf16", pair / "gptq-int4"
    fetch.check_quant_config(int4)                                   # bits 4, group 128, sym, desc_act off
    assert models.is_gptq(int4) and not models.is_gptq(golden)
    cfg = json.loads((int4 / "config.json").read_text())
    assert cfg["quantization_config"]["checkpoint_format"] == "gptq" and cfg["dtype"] == "float16"
    build = json.loads((pair / "build.json").read_text())
    assert build["bf16"]["bytes"] > build["int4"]["bytes"] > 0 and build["bf16"]["seconds"] >= 0
    g = models.load_model(golden, "cpu")
    q = models.load_model(int4, "cpu", backend="gptq_torch")         # transformers' GPTQ integration
    assert len(gptq.gptq_linear_modules(q)) == 2 * 7
    sd = {k: v.float() for k, v in g.state_dict().items()}
    for name in gptq.layer_names(int4):
        t = gptq.read_layer(int4, name)
        check = gptq.check_layer(t, device="cpu")
        assert check["weight_bit_exact"] and check["output_ok"], (name, check)
        w = sd[f"{name}.weight"]                                      # [out, in], nn.Linear's layout
        deq = gptq.dequantize(t["qweight"], t["qzeros"], t["scales"], t["g_idx"]).float()
        assert deq.shape == w.shape, name
        step = t["scales"].float().repeat_interleave(128, dim=0).t()  # the scale of each weight, [out, in]
        assert ((deq - w).abs() <= step * 0.5 + 1e-3 * w.abs().max()).all(), name   # RTN: within half a step
    tok = models.load_tokenizer(golden)
    ids = tok("Question: Tom had 64 books.\nAnswer:", return_tensors="pt").input_ids
    with torch.no_grad():
        lg, lq = g(ids).logits[0, -1].float(), q(ids).logits[0, -1].float()
    assert torch.nn.functional.cosine_similarity(lg, lq, dim=0) > 0.9


def test_tokenizer_spans_the_vocabulary_and_encodes_gsm8k(pair):
    tok = models.load_tokenizer(pair / "bf16")
    cfg = json.loads((pair / "bf16" / "config.json").read_text())
    assert len(tok) == cfg["vocab_size"] == 1024
    assert tok.convert_ids_to_tokens(cfg["eos_token_id"]) == "<|im_end|>"
    text = tok.decode(list(range(cfg["vocab_size"])))              # every id decodes
    assert isinstance(text, str) and len(text) > 1000
    q = json.loads((DATA / "test.jsonl").read_text().splitlines()[0])["question"]
    ids = tok.encode(f"Question: {q}\nAnswer:", add_special_tokens=False)
    assert 5 < len(ids) < len(q) and tok.decode(ids) == f"Question: {q}\nAnswer:"
    assert all(len([c for c in tok.convert_ids_to_tokens(i) if c.isdigit()]) <= 1 for i in ids)  # digits one by one


def test_refuses_to_overwrite(pair):
    with pytest.raises(SystemExit, match="exists already"):
        _script().main(["--out", str(pair), "--data", str(DATA), "--tiny", "--device", "cpu"])


def test_int4_only_writes_the_same_twin_and_no_bf16_folder(pair, tmp_path):
    """The Int4 shard rehearsal builds only the twin: the same seed gives the same packed weights."""
    assert _script().main(["--out", str(tmp_path), "--data", str(DATA), "--tiny", "--device", "cpu",
                           "--int4-only"]) == 0
    assert not (tmp_path / "bf16").exists() and models.is_gptq(tmp_path / "gptq-int4")
    build = json.loads((tmp_path / "build.json").read_text())
    assert "bf16" not in build and build["int4"]["bytes"] > 0
    for name in gptq.layer_names(pair / "gptq-int4")[:3]:
        a, b = gptq.read_layer(pair / "gptq-int4", name), gptq.read_layer(tmp_path / "gptq-int4", name)
        assert all(torch.equal(a[k], b[k]) for k in ("qweight", "qzeros", "scales")), name
    with pytest.raises(SystemExit):                                   # one or the other, not both
        _script().main(["--out", str(tmp_path / "x"), "--data", str(DATA), "--tiny", "--bf16-only", "--int4-only"])

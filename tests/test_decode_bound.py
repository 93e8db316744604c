"""The bytes bound of a decode step (utils.decode_bound), on the fixture's two checkpoints."""
import json
import shutil

import pytest
from safetensors.torch import load_file

from bad_input_table import record
from utils import decode_bound

FIX = "fixtures/tiny-qwen2-gsm"


@pytest.mark.parametrize("model", ["bf16", "gptq-int4"])
def test_weight_bytes_are_the_checkpoints_tensors(model):
    tensors = load_file(f"{FIX}/{model}/model.safetensors")
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    got = decode_bound.weight_bytes_per_step(f"{FIX}/{model}")
    assert got == {"read": total, "skipped": 0}           # tied embeddings: the table is lm_head too, read whole


def test_an_untied_models_input_embedding_is_not_counted(tmp_path):
    shutil.copytree(f"{FIX}/gptq-int4", tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    embed = load_file(f"{FIX}/gptq-int4/model.safetensors")["model.embed_tokens.weight"]
    got = decode_bound.weight_bytes_per_step(tmp_path / "m")
    assert got["skipped"] == embed.numel() * embed.element_size() > 0
    assert got["read"] + got["skipped"] == decode_bound.weight_bytes_per_step(f"{FIX}/gptq-int4")["read"]


def test_int4_reads_fewer_bytes_and_the_floor_is_bytes_over_bandwidth():
    b = decode_bound.step_floor(f"{FIX}/bf16", 16, 2048, 1008)
    q = decode_bound.step_floor(f"{FIX}/gptq-int4", 16, 2048, 1008)
    assert q["weights_gb"] < b["weights_gb"]
    # 6 layers x 2 KV heads x 64 dims x 2048 tokens x 16 sequences x (K and V) x 2 bytes
    assert b["kv_cache_gb"] == q["kv_cache_gb"] == 6 * 2 * 64 * 2048 * 16 * 2 * 2 / 1e9
    assert b["floor_ms"] == pytest.approx((b["weights_gb"] + b["kv_cache_gb"]) / 1008 * 1e3)
    assert decode_bound.step_floor(f"{FIX}/bf16", 16, None, None) == {**b, "kv_cache_gb": 0.0, "floor_ms": None}


def test_a_folder_without_weights_is_named(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors") as e:
        decode_bound.weight_bytes_per_step(tmp_path)
    record("model folder", "decode bound of a folder with no safetensors", str(e.value))


def test_step_rows_set_each_models_step_beside_its_floors():
    def ev(model, ms, decode="compiled", cache=2048):
        return {"model_path": f"{FIX}/{model}", "settings": {
            "gptq_backend": "quantlab" if model != "bf16" else None, "max_gen_toks": 256,
            "prompt_tokens": {"mean": 700.0}, "decode": {"decode": decode, "cache_len": cache, "steady_ms_per_step": ms,
                                                         "per_call": [{"batch": 16}, {"batch": 7}]}}}
    rows = decode_bound.step_rows({"golden": ev("bf16", 4.0), "int4": ev("gptq-int4", None, "eager", None)},
                                  {"this GPU": 2000.0, "rtx4090": 1008, "none": None})
    g, q = rows
    assert g["batch"] == 16 and g["measured ms/step"] == 4.0
    floor = decode_bound.step_floor(f"{FIX}/bf16", 16, 2048, 1008)["floor_ms"]
    assert g["floor ms at rtx4090 (1008 GB/s)"] == floor and g["measured / floor (rtx4090)"] == 4.0 / floor
    assert not any("none" in k for k in g)
    # eager: no static cache, so the KV cache read is prompt + half the generation; no measured step, no ratio
    assert q["KV cache GB read"] == decode_bound.kv_bytes_per_step(f"{FIX}/gptq-int4", 16, 828) / 1e9
    assert "measured / floor (rtx4090)" not in q and q["floor ms at this GPU (2000 GB/s)"] > 0

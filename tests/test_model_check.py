"""A model folder is checked against itself before anything loads: config.json's shapes against the safetensors
headers, the GPTQ settings against the packed tensors, the tokenizer files against the embedding, and the GPTQ
kernel name against the kernels that exist."""
import json
import shutil
from pathlib import Path

import pytest
from bad_input_table import record

from utils import fetch, models
from utils.fixture import fixture_paths

FIX = {role: Path(p) for role, p in fixture_paths().items() if role in ("golden", "int4")}


def copy_model(tmp_path, role="golden", name=None) -> Path:
    folder = tmp_path / (name or role)
    shutil.copytree(FIX[role], folder)
    return folder


def edit_config(folder: Path, quant: dict | None = None, drop=(), **changes) -> Path:
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    for key in drop:
        cfg.pop(key, None)
    if quant:
        cfg["quantization_config"].update(quant)
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    return folder


def rewrite_weights(folder: Path, edit) -> Path:
    """Load the folder's tensors, edit the dict (in place), save them back (the test's own bad checkpoint)."""
    from safetensors.torch import load_file, save_file
    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def refused(folder: Path, param: str, kind: str, case: str, *must_name: str) -> str:
    """The folder is refused before any loading, by both ways a lab reaches it, naming param, file and field."""
    with pytest.raises(fetch.ConfigError) as exc:
        models.check_model(folder, param)
    msg = str(exc.value)
    for text in (param, *must_name):
        assert text in msg, (text, msg)
    with pytest.raises(fetch.ConfigError) as again:   # load_model refuses it the same way, before transformers
        models.load_model(folder, "cpu", param=param)
    assert str(again.value) == msg or all(t in str(again.value) for t in must_name), str(again.value)
    return record(kind, case, msg)


def test_the_fixture_pair_passes_and_the_rows_say_what_was_compared():
    for role, folder in FIX.items():
        rows = models.check_model(folder, f"{role}_model")
        assert rows and all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
        fields = {r["field"] for r in rows}
        assert {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "tie_word_embeddings", "tokenizer"} <= fields, fields
    int4_fields = {r["field"] for r in models.check_model(FIX["int4"], "int4_model")}
    assert {"bits", "group_size", "desc_act"} <= int4_fields


# ------------------------------------------------------------------ config.json against the weights
CONFIG_FAULTS = {  # case: (role, config changes, the field the message must name)
    "hidden_size 256 -> 512": ("golden", {"hidden_size": 512}, "hidden_size"),
    "intermediate_size 768 -> 1024": ("golden", {"intermediate_size": 1024}, "intermediate_size"),
    "num_hidden_layers 6 -> 4 (weights of 6)": ("golden", {"num_hidden_layers": 4}, "num_hidden_layers"),
    "num_hidden_layers 6 -> 8 (weights of 6)": ("golden", {"num_hidden_layers": 8}, "num_hidden_layers"),
    "num_attention_heads 4 -> 3 (256 not divisible)": ("golden", {"num_attention_heads": 3}, "num_attention_heads"),
    "num_key_value_heads 2 -> 4": ("golden", {"num_key_value_heads": 4}, "num_key_value_heads"),
    "head_dim 64 -> 32": ("golden", {"head_dim": 32}, "head_dim"),
    "vocab_size 512 -> 600": ("golden", {"vocab_size": 600}, "vocab_size"),
    "tie_word_embeddings true -> false (no lm_head in the weights)": ("golden", {"tie_word_embeddings": False},
                                                                     "tie_word_embeddings"),
    "Int4: intermediate_size 768 -> 512": ("int4", {"intermediate_size": 512}, "intermediate_size"),
    "Int4: hidden_size 256 -> 128": ("int4", {"hidden_size": 128}, "hidden_size"),
    "Int4: num_key_value_heads 2 -> 1": ("int4", {"num_key_value_heads": 1}, "num_key_value_heads"),
    "model_type llama (no attention bias) over Qwen2 weights": ("golden", {"model_type": "llama"}, "attention_bias"),
    "layer_types of 4 layers, num_hidden_layers 6": ("golden", {"layer_types": ["full_attention"] * 4}, "layer_types"),
    "hidden_size a string '256'": ("golden", {"hidden_size": "256"}, "hidden_size"),
    "num_hidden_layers 0": ("golden", {"num_hidden_layers": 0}, "num_hidden_layers"),
}


@pytest.mark.parametrize("case", list(CONFIG_FAULTS))
def test_config_that_disagrees_with_the_weights_is_refused_naming_the_field(tmp_path, case):
    role, changes, field = CONFIG_FAULTS[case]
    folder = edit_config(copy_model(tmp_path, role), **changes)
    refused(folder, f"{role}_model", "model folder", case, field, "config.json")


def test_a_field_the_architecture_ignores_is_not_refused(tmp_path):
    folder = edit_config(copy_model(tmp_path), attention_bias=False)   # Qwen2's q/k/v carry a bias whatever it says
    assert all(r["ok"] for r in models.check_model(folder, "golden_model"))


def test_tied_config_with_a_separate_lm_head_in_the_weights_is_refused(tmp_path):
    folder = rewrite_weights(copy_model(tmp_path), lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"] * 2}))
    refused(folder, "golden_model", "model folder", "tie_word_embeddings true, but the weights hold their own lm_head",
            "tie_word_embeddings", "lm_head.weight")


def test_missing_layer_tensor_is_refused_naming_it(tmp_path):
    folder = rewrite_weights(copy_model(tmp_path), lambda t: t.pop("model.layers.2.mlp.up_proj.weight"))
    refused(folder, "golden_model", "model folder", "a layer's tensor missing from the weights",
            "model.layers.2.mlp.up_proj")


GPTQ_FAULTS = {  # case: (quantization_config changes, the field the message must name)
    "bits 4 -> 8": ({"bits": 8}, "bits"),
    "bits 4 -> 2": ({"bits": 2}, "bits"),
    "bits 4 -> 5 (no such GPTQ packing)": ({"bits": 5}, "bits"),
    "group_size 128 -> 64": ({"group_size": 64}, "group_size"),
    "group_size 128 -> -1 (one group)": ({"group_size": -1}, "group_size"),
    "group_size 128 -> 0": ({"group_size": 0}, "group_size"),
    "sym a string 'yes'": ({"sym": "yes"}, "sym"),
    "lm_head true (the output layer is not packed)": ({"lm_head": True}, "lm_head"),
    "desc_act a string 'false'": ({"desc_act": "false"}, "desc_act"),
}


@pytest.mark.parametrize("case", list(GPTQ_FAULTS))
def test_gptq_settings_that_disagree_with_the_packed_tensors_are_refused(tmp_path, case):
    changes, field = GPTQ_FAULTS[case]
    folder = edit_config(copy_model(tmp_path, "int4"), quant=changes)
    refused(folder, "int4_model", "model folder", f"Int4: quantization_config {case}", field)


def test_desc_act_without_g_idx_is_refused(tmp_path):
    folder = copy_model(tmp_path, "int4")
    rewrite_weights(folder, lambda t: [t.pop(k) for k in [k for k in t if k.endswith(".g_idx")]])
    models.check_model(folder, "int4_model")          # without act-order g_idx is i // group_size: optional
    edit_config(folder, quant={"desc_act": True})
    refused(folder, "int4_model", "model folder", "Int4: desc_act true but no g_idx in the weights", "desc_act", "g_idx")


def test_quantize_config_json_that_disagrees_with_config_json_is_refused(tmp_path):
    folder = copy_model(tmp_path, "int4")
    q = json.loads((folder / "quantize_config.json").read_text())
    (folder / "quantize_config.json").write_text(json.dumps({**q, "group_size": 32}))
    refused(folder, "int4_model", "model folder", "Int4: quantize_config.json's group_size differs from config.json's",
            "quantize_config.json", "group_size")


def test_config_json_that_is_not_json_is_refused_naming_the_file(tmp_path):
    folder = copy_model(tmp_path)
    (folder / "config.json").write_text('{"hidden_size": 256,')
    refused(folder, "golden_model", "model folder", "config.json is not valid JSON", "config.json")


# ------------------------------------------------------------------ the tokenizer files
TOKENIZER_FAULTS = {  # case: (what to do to the folder, what the message must name)
    "tokenizer.json missing": (lambda f: (f / "tokenizer.json").unlink(), "tokenizer.json"),
    "tokenizer_config.json missing": (lambda f: (f / "tokenizer_config.json").unlink(), "tokenizer_config.json"),
    "every tokenizer file missing": (lambda f: [(f / n).unlink() for n in ("tokenizer.json", "tokenizer_config.json")],
                                     "tokenizer.json"),
    "tokenizer.json not JSON": (lambda f: (f / "tokenizer.json").write_text('{"model": '), "tokenizer.json"),
    "tokenizer_config.json not JSON": (lambda f: (f / "tokenizer_config.json").write_text("{"), "tokenizer_config.json"),
    "tokenizer with more tokens than the embedding has rows": (lambda f: _add_tokens(f, 600), "vocab_size"),
    "tokenizer of a much smaller vocabulary": (lambda f: _keep_tokens(f, 100), "vocab_size"),
}


def _add_tokens(folder: Path, up_to: int) -> None:
    tok = json.loads((folder / "tokenizer.json").read_text())
    n = len(tok["model"]["vocab"])
    tok["added_tokens"] += [{"id": i, "content": f"<extra_{i}>", "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for i in range(n, up_to)]
    (folder / "tokenizer.json").write_text(json.dumps(tok))


def _keep_tokens(folder: Path, n: int) -> None:
    tok = json.loads((folder / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    tok["model"]["vocab"] = {k: v for k, v in vocab.items() if v < n}
    tok["model"]["merges"] = []
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["id"] < n]
    (folder / "tokenizer.json").write_text(json.dumps(tok))


@pytest.mark.parametrize("case", list(TOKENIZER_FAULTS))
def test_tokenizer_files_are_checked_before_the_tokenizer_is_used(tmp_path, case):
    damage, must_name = TOKENIZER_FAULTS[case]
    folder = copy_model(tmp_path)
    damage(folder)
    with pytest.raises(fetch.ConfigError) as exc:
        models.load_tokenizer(folder, param="golden_model")
    msg = str(exc.value)
    assert "golden_model" in msg and must_name in msg, msg
    with pytest.raises(fetch.ConfigError):
        models.check_model(folder, "golden_model")
    record("model folder", f"tokenizer: {case}", msg)


# ------------------------------------------------------------------ the GPTQ kernel name
def test_unknown_kernel_in_the_environment_is_refused_naming_the_variable(monkeypatch):
    from utils.platform import PlatformRecord
    monkeypatch.setenv(models.GPTQ_ENV, "gptq_marlinn")
    for device, rec in (("cpu", None), ("cuda", PlatformRecord(backend="cuda", vendor="", device_name="simulated cuda", device="cuda"))):
        with pytest.raises(ValueError) as exc:
            models.gptq_backend(device, "auto", record=rec)
        msg = str(exc.value)
        assert "$QUANTLAB_GPTQ_BACKEND='gptq_marlinn'" in msg and "gptq_marlin" in msg and "gptq_torch" in msg, msg
    record("GPTQ kernel", "$QUANTLAB_GPTQ_BACKEND=gptq_marlinn (a typo)", msg)


@pytest.mark.parametrize("name", ["marlin", "nope", "", " ", "gptq"])
def test_unknown_kernel_parameter_is_refused_naming_the_parameter(monkeypatch, name):
    from utils.platform import PlatformRecord
    monkeypatch.delenv(models.GPTQ_ENV, raising=False)
    if not name.strip():                     # empty means the default, auto
        assert models.gptq_backend("cpu", name) == "auto"
        return
    with pytest.raises(ValueError) as exc:
        models.gptq_backend("cuda", name, record=PlatformRecord(backend="cuda", vendor="", device_name="simulated cuda", device="cuda"))
    msg = str(exc.value)
    assert f"gptq_backend={name!r}" in msg and "auto" in msg and "gptq_triton" in msg, msg
    record("GPTQ kernel", f"gptq_backend={name!r}", msg)


def test_unknown_kernel_is_refused_before_the_model_loads(monkeypatch):
    import transformers
    monkeypatch.setenv(models.GPTQ_ENV, "no_such_kernel")
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: pytest.fail("the model was loaded before the kernel name was checked"))
    with pytest.raises(ValueError, match=r"\$QUANTLAB_GPTQ_BACKEND='no_such_kernel'"):
        models.load_model(FIX["int4"], "cpu")


def test_the_kernel_names_are_one_list_that_matches_gptqmodel(monkeypatch):
    """models.GPTQ_KERNELS is the one list every check reads: GPTQModel's own kernels for GPTQ (v1) checkpoints
    (its table, read here) are all in it, and every name it gives as GPTQModel's is one GPTQModel knows."""
    from gptqmodel.utils.backend import BACKEND

    from utils import gptq_kernels
    monkeypatch.delenv(models.GPTQ_ENV, raising=False)
    ours = {n for n, src in models.GPTQ_KERNELS.items() if src == "gptqmodel"}
    assert set(gptq_kernels.kernel_classes()) <= ours
    assert ours <= {b.value for b in BACKEND}
    assert {"auto", "gptq_torch", "gptq_triton"} <= set(models.GPTQ_KERNELS)
    assert set(models.ROCM_SAFE_GPTQ) <= set(models.GPTQ_KERNELS)
    for name in models.GPTQ_KERNELS:
        monkey = name.upper()                # names are case-blind, as before
        assert models.gptq_backend("cpu", monkey, rocm_safe=False) in (name, "auto")

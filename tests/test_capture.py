"""Golden captures: hooks, the portable file, and comparing a later run against it."""
import json

import pytest
import torch

from tests.test_divergence import plant_fault, prompts, tiny_qwen2
from utils import capture


class ToyTokenizer:
    """Bytes as token ids (mod the tiny vocab): enough to test prompt handling without a tokenizer file."""

    def __call__(self, text, return_tensors="pt"):
        class Out:
            input_ids = torch.tensor([[b % 128 for b in text.encode()]])
        return Out()


def test_hooked_modules_order_and_labels():
    model = tiny_qwen2(layers=2)
    names = list(capture.hooked_modules(model))
    assert names[:5] == ["model.layers.0.input_layernorm", "model.layers.0.self_attn",
                         "model.layers.0.post_attention_layernorm", "model.layers.0.mlp", "model.layers.0"]
    assert len(names) == 10 and len(capture.hooked_modules(model, parts=False)) == 2
    assert capture.module_label("model.layers.1.mlp") == (1, "mlp")
    assert capture.module_label("model.layers.1") == (1, "layer")
    with pytest.raises(ValueError, match="layers"):
        capture.hooked_modules(torch.nn.Linear(2, 2))


def test_hooks_are_removed_and_do_not_change_outputs():
    model = tiny_qwen2(layers=2)
    ids = prompts(1)[0].reshape(1, -1)
    with torch.no_grad():
        before = model(input_ids=ids).logits
        got = capture.forward_capture(model, ids, inputs=True)
        after = model(input_ids=ids).logits
    assert torch.equal(before, after) and torch.equal(got["logits"], before)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    # a layer's input is the previous layer's output
    assert torch.equal(got["model.layers.1:input"], got["model.layers.0"])


def test_save_load_roundtrip_and_compare(tmp_path):
    model = tiny_qwen2(layers=3)
    tok = ToyTokenizer()
    cap = capture.make_capture(model, tok, ["hello world, 12 + 30 = 42", "a second prompt"], seed=3,
                               max_tokens=10, model_id="tiny", revision="r1", platform={"backend": "cpu"})
    capture.save_capture(cap, tmp_path / "cap")
    man = json.loads((tmp_path / "cap" / "manifest.json").read_text())
    for key in ("model", "revision", "dtype", "prompts", "seed", "platform"):
        assert key in man
    assert man["dtype"] == "float32" and man["seed"] == 3 and man["n_prompts"] == 2
    back = capture.load_capture(tmp_path / "cap")
    assert back.ids(0).numel() == 10 and set(back.tensors) == set(cap.tensors)
    # the same model again: bit-identical on CPU
    rows = capture.compare_captures(back, capture.capture_like(back, model))
    assert all(r["rel_l2"] == 0.0 for r in rows) and rows[-1]["module"] == "logits"
    # the same model in bf16: close but not exact, every module present
    bf = capture.compare_captures(back, capture.capture_like(back, tiny_qwen2(layers=3).to(torch.bfloat16)))
    assert all(0 < r["rel_l2"] < 0.1 for r in bf)
    # a faulty model: the first bad module is in layer 1
    bad = capture.compare_captures(back, capture.capture_like(back, plant_fault(model, 1)))
    first = next(r for r in bad if r["part"] == "layer" and r["cosine"] < 0.99)
    assert first["layer"] == 1


def test_capture_errors(tmp_path):
    model = tiny_qwen2(layers=2)
    tok = ToyTokenizer()
    with pytest.raises(capture.CaptureError, match="reference_capture"):
        capture.load_capture(tmp_path)
    a = capture.make_capture(model, tok, ["one prompt"], max_tokens=8)
    b = capture.make_capture(model, tok, ["another prompt"], max_tokens=8)
    with pytest.raises(capture.CaptureError, match="token ids differ"):
        capture.compare_captures(a, b)
    c = capture.make_capture(model, tok, ["one prompt", "two"], max_tokens=8)
    with pytest.raises(capture.CaptureError, match="prompts"):
        capture.compare_captures(a, c)
    with pytest.raises(ValueError, match="prompts"):
        capture.make_capture(model, tok, [])
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "manifest.json").write_text('{"schema": "other"}')
    (tmp_path / "x" / "capture.safetensors").write_bytes(b"")
    with pytest.raises(capture.CaptureError, match="not a quant-lab capture"):
        capture.load_capture(tmp_path / "x")


def test_weights_digest_changes_with_weights(tmp_path):
    from safetensors.torch import save_file
    save_file({"w": torch.zeros(3)}, str(tmp_path / "model.safetensors"))
    d1 = capture.weights_digest(tmp_path)
    save_file({"w": torch.ones(3)}, str(tmp_path / "model.safetensors"))
    assert d1 and capture.weights_digest(tmp_path) != d1 and capture.weights_digest(None) == ""


def test_portable_id():
    assert capture.portable_id("/a/b/fixtures/tiny-qwen2-gsm/bf16") == "tiny-qwen2-gsm/bf16"


def test_shipped_fixture_capture():
    """The CPU fp32 reference in the repository: small, complete, and reproduced by the fixture model here."""
    from utils.fixture import fixture_paths
    folder = fixture_paths()["golden"].parent / "captures" / "cpu-fp32"
    size = sum(f.stat().st_size for f in folder.iterdir())
    assert size < 2 * 2**20, f"{folder} is {size} bytes; keep it under 2 MB"
    ref = capture.load_capture(folder)
    assert ref.manifest["dtype"] == "float32" and ref.manifest["platform"]["backend"] == "cpu"
    assert len([m for m in ref.modules if capture.module_label(m)[1] == "layer"]) == 6
    golden = fixture_paths()["golden"]
    assert capture.weights_digest(golden) == ref.manifest["revision"], (
        f"the shipped capture is of weights revision {ref.manifest['revision']}, not the fixture's: remake it "
        "(python scripts/make_fixture.py capture; docs/fixture.md)")
    from utils.models import load_model
    rows = capture.compare_captures(ref, capture.capture_like(ref, load_model(golden, "cpu", torch.float32)))
    assert all(r["cosine"] > 0.99999 for r in rows), [r for r in rows if r["cosine"] <= 0.99999][:2]

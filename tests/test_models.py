"""Fetching and verifying the two models: resolve, bounded download, manifest, config sanity, footprint."""
import hashlib
import json
import sys
import time
from pathlib import Path

import pytest

from utils import fetch

REPO = Path(__file__).resolve().parents[1]
GOOD_Q = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False}


def _safetensors(n: int = 16) -> bytes:
    """A valid safetensors file of one float32 tensor (fetch checks the header against the file size)."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    return len(header).to_bytes(8, "little") + header + b"\x00" * (4 * n)


def _model_folder(path: Path, quant: dict | None = None, weights: bytes = _safetensors()) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    cfg = {"model_type": "qwen2", **({"quantization_config": quant} if quant else {})}
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "model.safetensors").write_bytes(weights)
    return path


def _fixture(tmp_path: Path) -> dict:
    return {"golden": _model_folder(tmp_path / "fx" / "bf16"),
            "int4": _model_folder(tmp_path / "fx" / "gptq-int4", GOOD_Q)}


# A fake downloader: python -c SCRIPT MODE WEIGHTS_HEX model_id revision staging
_FAKE = """
import sys, time, pathlib
mode, staging = sys.argv[1], pathlib.Path(sys.argv[5])
if mode in ("ok", "partial"):
    (staging / "model.safetensors").write_bytes(bytes.fromhex(sys.argv[2]))
if mode == "ok":
    (staging / "config.json").write_text("{}")
    (staging / ".cache").mkdir(exist_ok=True)
if mode == "slow":
    time.sleep(60)
sys.exit(0 if mode == "ok" else 3)
"""


def _fake(mode: str) -> list[str]:
    return [sys.executable, "-c", _FAKE, mode, _safetensors().hex()]


def test_manifest_sizes_and_hashes(tmp_path):
    folder = _model_folder(tmp_path / "m", weights=b"abc" * 10)
    (folder / ".hidden").write_text("bookkeeping")
    rows = {r["file"]: r for r in fetch.manifest(folder)}
    assert set(rows) == {"config.json", "model.safetensors"}
    assert rows["model.safetensors"]["bytes"] == 30
    assert rows["model.safetensors"]["sha256"] == hashlib.sha256(b"abc" * 10).hexdigest()
    assert fetch.verify_manifest(folder)["recorded"] is False
    fetch.write_manifest(folder)
    assert fetch.verify_manifest(folder)["ok"] is True
    (folder / "model.safetensors").write_bytes(b"abd" * 10)
    v = fetch.verify_manifest(folder)
    assert v["ok"] is False and v["changed"] == ["model.safetensors"]


def test_quant_config_sanity(tmp_path):
    good = _model_folder(tmp_path / "good", GOOD_Q)
    rows = fetch.check_quant_config(good)
    assert all(r["ok"] for r in rows)
    assert [r["found"] for r in rows if r["field"] == "format"] == ["gptq"]   # absent = v1, as Qwen's
    bad = _model_folder(tmp_path / "bad", {**GOOD_Q, "bits": 8, "desc_act": True, "checkpoint_format": "awq"})
    with pytest.raises(fetch.ConfigError) as exc:
        fetch.check_quant_config(bad)
    assert "bits=8" in str(exc.value) and "desc_act=True" in str(exc.value) and "format='awq'" in str(exc.value)
    with pytest.raises(fetch.ConfigError, match="no GPTQ quantization_config"):
        fetch.check_quant_config(_model_folder(tmp_path / "bf16"))


def test_footprint_of_a_saved_model_and_its_gptq_count(tmp_path):
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(tmp_path / "m")
    fp = fetch.footprint(tmp_path / "m", model)
    n = sum(p.numel() for p in model.parameters())
    assert fp["parameters"] == n
    assert fp["disk_bytes"] == (tmp_path / "m" / "model.safetensors").stat().st_size
    assert fp["memory_bytes"] == 4 * n + sum(b.numel() * b.element_size() for b in model.buffers())
    assert fp["disk_bytes_per_param"] == pytest.approx(4.0, rel=0.05)
    # a GPTQ layer counts its unpacked weight: qweight [in/8, out] -> in * out parameters
    q = tmp_path / "q"
    _model_folder(q, GOOD_Q)
    save_file({"l.qweight": torch.zeros(4, 16, dtype=torch.int32), "l.qzeros": torch.zeros(1, 2, dtype=torch.int32),
               "l.scales": torch.zeros(1, 16, dtype=torch.float16), "l.g_idx": torch.zeros(32, dtype=torch.int32),
               "norm.weight": torch.zeros(32)}, str(q / "model.safetensors"))
    assert fetch.count_parameters(q) == 32 * 16 + 32


def test_resolve_fixture_local_and_cached(tmp_path):
    fx = _fixture(tmp_path)
    r = fetch.resolve_model("fixture", "int4", offline=True, fixture_paths=fx)
    assert r["source"] == "fixture" and r["path"] == str(fx["int4"])
    local = _model_folder(tmp_path / "local")
    assert fetch.resolve_model(str(local), "golden", offline=True)["source"] == "local"
    (tmp_path / "empty").mkdir()
    with pytest.raises(fetch.FetchError, match="no config.json"):
        fetch.resolve_model(str(tmp_path / "empty"), "golden", offline=True)
    cache = tmp_path / "cache"
    _model_folder(fetch.snapshot_dir(cache, "Qwen/X", "master"))
    r = fetch.resolve_model("Qwen/X", "golden", offline=True, cache_dir=cache)
    assert r["source"] == "modelscope" and r["id"] == "Qwen/X"
    with pytest.raises(ValueError, match="role"):
        fetch.resolve_model("fixture", "bf16", offline=True, fixture_paths=fx)


def test_offline_without_cache_fails_fast_or_falls_back(tmp_path):
    cache = tmp_path / "cache"
    t0 = time.monotonic()
    with pytest.raises(fetch.FetchError) as exc:
        fetch.resolve_model("Qwen/Qwen2.5-7B-Instruct", "golden", offline=True, cache_dir=cache)
    assert time.monotonic() - t0 < 1.0          # never touched the network
    assert "offline=True" in str(exc.value) and "'fixture'" in str(exc.value)
    assert not cache.exists()
    r = fetch.resolve_model("Qwen/Qwen2.5-7B-Instruct", "golden", offline=True, cache_dir=cache,
                            fixture_fallback=True, fixture_paths=_fixture(tmp_path))
    assert r["source"] == "fixture" and "fallback" in r["note"]


def test_download_moves_into_place_only_when_complete(tmp_path):
    cache = tmp_path / "cache"
    path = fetch.download("Org/M", cache, "v1", timeout_s=60, command=_fake("ok"))
    assert path == fetch.snapshot_dir(cache, "Org/M", "v1") and fetch.is_complete(path)
    assert not (path / ".cache").exists() and not (cache / ".staging").exists()
    assert fetch.verify_manifest(path)["ok"] is True
    r = fetch.resolve_model("Org/M", "golden", offline=True, cache_dir=cache, revision="v1")
    assert r["path"] == str(path)
    fetch.snapshot_dir(cache, "Org/Other").mkdir()          # a stray, incomplete folder in the way
    with pytest.raises(fetch.FetchError, match="not a complete model folder"):
        fetch.download("Org/Other", cache, command=_fake("ok"))


@pytest.mark.parametrize("mode", ["fail", "partial", "slow"])
def test_failed_download_leaves_no_model_folder(tmp_path, mode):
    cache = tmp_path / "cache"
    t0 = time.monotonic()
    with pytest.raises(fetch.FetchError) as exc:
        fetch.download("Org/M", cache, timeout_s=2, command=_fake(mode))
    assert time.monotonic() - t0 < 30           # the slow one was killed at the bound, not after 60 s
    assert "offline=True" in str(exc.value)
    assert not fetch.snapshot_dir(cache, "Org/M").exists()
    staged = cache / ".staging"
    if mode == "partial":                       # kept only in staging, so the next attempt resumes
        assert "resumes" in str(exc.value) and (staged / "Org--M@master" / "model.safetensors").is_file()
    else:
        assert not staged.exists()
    if mode == "slow":
        assert "fetch_timeout_s=2" in str(exc.value)


def test_real_modelscope_without_network_is_bounded(tmp_path, monkeypatch):
    """The real modelscope downloader with no reachable hub (its domain forced to a closed local port,
    so this holds on a machine with network too): it fails within the bound and leaves nothing behind.
    Offline, modelscope alone takes about 22 s to give up; the bound stops it at 3 s."""
    monkeypatch.setenv("MODELSCOPE_DOMAIN", "127.0.0.1:9")
    cache = tmp_path / "cache"
    with pytest.raises(fetch.FetchError, match="could not fetch"):
        fetch.resolve_model("Qwen/Qwen2.5-7B-Instruct", "golden", offline=False, cache_dir=cache, timeout_s=3)
    assert not fetch.snapshot_dir(cache, "Qwen/Qwen2.5-7B-Instruct").exists()
    assert not (cache / ".staging").exists()


def test_the_embedded_fixture_pair_passes_the_checks():
    """The committed fixture pair, through the same path as a download: complete, GPTQ settings as Qwen's,
    the same logical parameter count, and the Int4 twin about a quarter of the BF16 bytes on disk."""
    golden = fetch.resolve_model("fixture", "golden", offline=True)
    int4 = fetch.resolve_model("fixture", "int4", offline=True)
    assert golden["source"] == int4["source"] == "fixture"
    assert Path(golden["path"]).name == "bf16" and Path(int4["path"]).name == "gptq-int4"
    assert all(r["ok"] for r in fetch.check_quant_config(int4["path"]))
    assert fetch.quant_config(golden["path"]) == {}
    fg, fi = fetch.footprint(golden["path"]), fetch.footprint(int4["path"])
    assert fg["parameters"] == fi["parameters"] > 1_000_000
    assert 1.99 < fg["disk_bytes_per_param"] < 2.05
    assert 0.5 < fi["disk_bytes_per_param"] < 0.7

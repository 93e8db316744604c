"""The bytes bound of a decode step: what one generated token must read from GPU memory, over the bandwidth.

Why: a decode step at small batch multiplies a few rows by every weight, so it cannot be faster than
reading them once (plus the KV cache its attention reads). That floor is where Int4's 4-bit weights pay:
Lab 03 sets the measured step of each model beside its floor, at the lab's own GPU bandwidth (Lab 01)
and at the bandwidth a profile names for its card.

Counted from the checkpoint's safetensors headers (no weights loaded): every tensor, except the input
embedding table of an untied model (a step reads only its batch's rows of it); and a static KV cache of
`cache_len` tokens for `batch` sequences, which the compiled step's attention reads whole.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
                "F8_E4M3": 1, "F8_E5M2": 1}


def _header(path: Path) -> dict:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def weight_bytes_per_step(model_dir) -> dict:
    """{"read": bytes a decode step reads of the weights, "skipped": the input embedding's bytes not counted}."""
    folder = Path(model_dir)
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors weight files; give a model folder Lab 02 recorded")
    tied = bool(cfg.get("tie_word_embeddings", False))
    read = skipped = 0
    for f in files:
        for name, t in _header(f).items():
            if name == "__metadata__":
                continue
            n = _DTYPE_BYTES[t["dtype"]]
            for d in t["shape"]:
                n *= d
            if "embed_tokens" in name and not tied:
                skipped += n
            else:
                read += n
    return {"read": read, "skipped": skipped}


def kv_bytes_per_step(model_dir, batch: int, cache_len: int, dtype_bytes: int = 2) -> int:
    """Bytes of a static KV cache of cache_len tokens for `batch` sequences (keys and values, every layer)."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return 2 * cfg["num_hidden_layers"] * cfg.get("num_key_value_heads", heads) * head_dim * cache_len * batch * dtype_bytes


def step_floor(model_dir, batch: int, cache_len: int | None, bandwidth_gbps: float | None) -> dict:
    """GB a decode step reads (weights, KV cache) and the floor in ms at bandwidth_gbps (None: no floor)."""
    w = weight_bytes_per_step(model_dir)["read"]
    kv = kv_bytes_per_step(model_dir, batch, cache_len) if cache_len else 0
    floor = (w + kv) / (bandwidth_gbps * 1e9) * 1e3 if bandwidth_gbps else None
    return {"weights_gb": w / 1e9, "kv_cache_gb": kv / 1e9, "floor_ms": floor}


def step_rows(evals: dict, bandwidths: dict) -> list[dict]:
    """One row per evaluated model (utils.evaluation.run_gsm8k results): its measured steady ms per decode
    step beside the floor at each named bandwidth (GB/s; None skips it). The batch is the largest of its
    generate calls; the KV cache the static one of a compiled decode, else prompt + half the generation."""
    rows = []
    for label, r in evals.items():
        st = r["settings"]
        dec = st.get("decode") or {}
        calls = dec.get("per_call") or []
        batch = max((c["batch"] or 0 for c in calls), default=0) or 1
        cache_len = dec.get("cache_len") or int(st["prompt_tokens"]["mean"] + st["max_gen_toks"] / 2)
        base = step_floor(r["model_path"], batch, cache_len, None)
        row = {"model": label, "decode": dec.get("decode"), "batch": batch, "GPTQ kernel": st.get("gptq_backend"),
               "weights GB read": base["weights_gb"], "KV cache GB read": base["kv_cache_gb"],
               "measured ms/step": dec.get("steady_ms_per_step")}
        for name, gbps in bandwidths.items():
            if gbps:
                floor = step_floor(r["model_path"], batch, cache_len, gbps)["floor_ms"]
                row[f"floor ms at {name} ({gbps:.0f} GB/s)"] = floor
                if row["measured ms/step"]:
                    row[f"measured / floor ({name})"] = row["measured ms/step"] / floor
        rows.append(row)
    return rows

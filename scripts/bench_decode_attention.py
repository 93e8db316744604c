"""A decode step's attention at Qwen2.5-7B's shapes: the grouped SDPA rows against FlexAttention, on a GPU.

    python scripts/bench_decode_attention.py --out DIR [--batch 1 16] [--cache 1024 2048]

One new token per row (28 query heads over 4 key/value heads, head size 128, bf16) over a static cache of
--cache slots, as the compiled decode step runs it: each row left-padded by a different amount and the
cache's last quarter not written yet, both masked. Per batch and cache length: microseconds per call of each
kernel compiled by torch.compile, cold (the cache read from DRAM) under CUDA-graph replay; the GB/s that
reading K and V once makes of it; the largest difference from float32 SDPA; whether two calls give the same
bits. utils.attention runs "flex" in a compiled decode step and "sdpa" (the grouped rows) elsewhere.
Writes bench_decode_attention.md and .json into --out (refuses a folder that has them).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from utils import attention, timing  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 28, 4, 128


def operands(batch: int, cache: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, HEADS, 1, HEAD_DIM, device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.randn(batch, KV_HEADS, cache, HEAD_DIM, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn(batch, KV_HEADS, cache, HEAD_DIM, device="cuda", generator=g, dtype=torch.bfloat16)
    pos = torch.arange(cache, device="cuda")
    pad = torch.arange(batch, device="cuda") * 7 % 64                 # a different left padding per row
    mask = ((pos[None] >= pad[:, None]) & (pos[None] < cache * 3 // 4))[:, None, None, :]
    return q, k, v, mask


def sdpa_rows(q, k, v, mask):
    rows, m = attention.grouped_rows(q, mask, HEADS // KV_HEADS)
    out = torch.nn.functional.scaled_dot_product_attention(rows, k, v, attn_mask=m)
    return out.reshape(q.shape).transpose(1, 2).contiguous()


def reference(q, k, v, mask):
    g = HEADS // KV_HEADS
    out = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float().repeat_interleave(g, 1), v.float().repeat_interleave(g, 1), attn_mask=mask)
    return out.transpose(1, 2)


KERNELS = {"sdpa (grouped rows)": sdpa_rows, "flex": attention.flex_decode}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--cache", type=int, nargs="+", default=[1024, 2048])
    args = ap.parse_args(argv)
    if (args.out / "bench_decode_attention.json").exists():
        raise SystemExit(f"--out: {args.out} already holds bench_decode_attention.json; pass a new folder")
    if not torch.cuda.is_available():
        raise SystemExit("bench_decode_attention: torch sees no GPU here; run it on the GPU machine")
    args.out.mkdir(parents=True, exist_ok=True)
    compiled = {name: torch.compile(fn, fullgraph=True, dynamic=False) for name, fn in KERNELS.items()}
    rows = []
    for batch in args.batch:
        for cache in args.cache:
            ops = operands(batch, cache)
            ref = reference(*ops)
            kv_bytes = 2 * ops[1].numel() * ops[1].element_size()
            for name, fn in compiled.items():
                out = fn(*ops)
                same = torch.equal(out, fn(*ops))
                us = statistics.median(timing.time_cold(fn, ops, "cuda") for _ in range(3)) * 1e6
                rows.append({"batch": batch, "cache": cache, "kernel": name, "us": us,
                             "gb_per_s": kv_bytes / us / 1e3, "max_abs_diff": float((out.float() - ref).abs().max()),
                             "same_bits_twice": same})
                print(json.dumps(rows[-1]), flush=True)
    meta = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": "python scripts/bench_decode_attention.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    (args.out / "bench_decode_attention.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (args.out / "bench_decode_attention.md").write_text(markdown(meta, rows))
    print(markdown(meta, rows))
    return 0


def markdown(meta, rows) -> str:
    out = [f"# A decode step's attention on {meta['device']} ({meta['date']})", "",
           f"torch {meta['torch']}; {HEADS} query heads over {KV_HEADS} key/value heads, head size {HEAD_DIM}, "
           f"bf16, one new token per row; cold under CUDA-graph replay. Command: `{meta['command']}`.", "",
           "| batch | cache slots | kernel | us | GB/s (K and V once) | max abs diff from fp32 | same bits twice |",
           "|---|---|---|---|---|---|---|"]
    out += [f"| {r['batch']} | {r['cache']} | {r['kernel']} | {r['us']:.1f} | {r['gb_per_s']:.0f} | "
            f"{r['max_abs_diff']:.1e} | {'yes' if r['same_bits_twice'] else 'NO'} |" for r in rows]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())

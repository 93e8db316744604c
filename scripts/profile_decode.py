"""Where a compiled decode step's time goes, BF16 against Int4 (one GPTQ kernel), by torch's profiler.

    python scripts/profile_decode.py --golden DIR --int4 DIR --gptq-backend quantlab --out DIR [--batch 16]

Each model is loaded as the labs load it (utils.models.load_model), then `generate` runs greedy from a
batch of random prompts of --prompt tokens with a static cache of --cache tokens, so transformers
compiles the decode step and replays it as CUDA graphs (utils.decode's "compiled"). Per model:
ms per decode step from the wall clock ((t(long) - t(short)) / extra steps, the prompt's prefill cancels),
then the profiler over a short and a long generate: per kernel name, GPU time per decode step (long minus
short, over the extra steps), grouped as linear layers (the W4A16 kernel, cuBLAS GEMMs), attention,
other kernels, and the GPU's idle time within the step (wall minus kernels: the host, launches, syncs).
Writes profile_decode.md and profile_decode.json into --out (refuses a folder that has them).
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

GROUPS = (("linear: W4A16 kernel", ("w4a16",)),
          ("attention", ("flash", "fmha", "attention", "attn", "sdpa")),
          ("linear: cuBLAS GEMM (BF16 layers, lm_head)", ("gemm", "gemv", "nvjet", "cutlass", "xmma", "cublas", "splitk")),
          ("other kernels (norms, rope, sampling, copies)", ("",)))


def group_of(name: str) -> str:
    low = name.lower()
    return next(g for g, keys in GROUPS if any(k in low for k in keys))


def generate(model, ids, new, cache):
    cache.reset()
    t0 = time.perf_counter()
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                   do_sample=False, past_key_values=cache, pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def kernel_us(model, ids, new, cache) -> dict:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        generate(model, ids, new, cache)
    out = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0 and "Memcpy" not in e.name \
                and "Memset" not in e.name:
            out[e.name][0] += e.device_time_total
            out[e.name][1] += 1
    return out


def profile_model(path, backend, batch, prompt, cache_len, short, long) -> dict:
    from transformers import StaticCache

    from utils.decode import _allow_compile
    from utils.models import load_model

    model = load_model(path, "cuda", backend=backend)
    _allow_compile(model)
    vocab = model.config.vocab_size
    ids = torch.randint(100, vocab - 100, (batch, prompt), generator=torch.Generator().manual_seed(0)).cuda()
    cache = StaticCache(config=model.config, max_cache_len=cache_len)
    first = generate(model, ids, short, cache)                      # compiles
    generate(model, ids, short, cache)
    walls = [(generate(model, ids, long, cache) - generate(model, ids, short, cache)) / (long - short)
             for _ in range(3)]
    ms = sorted(walls)[1] * 1e3
    a, b = kernel_us(model, ids, short, cache), kernel_us(model, ids, long, cache)
    per_step = {n: ((b[n][0] - a.get(n, [0, 0])[0]) / (long - short), (b[n][1] - a.get(n, [0, 0])[1]) / (long - short))
                for n in b}
    groups = defaultdict(float)
    for n, (us, _) in per_step.items():
        groups[group_of(n)] += us
    busy = sum(groups.values()) / 1e3
    res = {"model": str(path), "gptq_backend": backend, "first_generate_s": first, "ms_per_step": ms,
           "kernel_ms_per_step": busy, "idle_ms_per_step": ms - busy,
           "groups_ms_per_step": {g: v / 1e3 for g, v in groups.items()},
           "kernels": sorted(([n, us, c] for n, (us, c) in per_step.items()), key=lambda r: -r[1])[:40],
           "layers": sorted({type(m).__name__ for m in model.modules() if hasattr(m, "qweight")})}
    del model, cache
    gc.collect()
    torch.cuda.empty_cache()
    torch._dynamo.reset()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--golden", type=Path, required=True)
    ap.add_argument("--int4", type=Path, required=True)
    ap.add_argument("--gptq-backend", default="quantlab")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=700)
    ap.add_argument("--cache", type=int, default=2048)
    ap.add_argument("--short", type=int, default=8)
    ap.add_argument("--long", type=int, default=40)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("profile_decode: torch sees no GPU here; run it on the GPU machine")
    if not 0 < args.short < args.long or args.prompt + args.long > args.cache:
        raise SystemExit(f"--short/--long/--prompt/--cache: need 0 < short < long and prompt + long <= cache, got "
                         f"{args.short}, {args.long}, {args.prompt}, {args.cache}")
    if (args.out / "profile_decode.json").exists():
        raise SystemExit(f"--out: {args.out} already holds profile_decode.json; pass a new folder")
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for path, backend in ((args.golden, None), (args.int4, args.gptq_backend)):
        runs.append(profile_model(path, backend or "auto", args.batch, args.prompt, args.cache, args.short, args.long))
        print(json.dumps({k: v for k, v in runs[-1].items() if k != "kernels"}), flush=True)
        meta = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "batch": args.batch,
                "prompt": args.prompt, "cache": args.cache, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "command": "python scripts/profile_decode.py " + " ".join(sys.argv[1:] if argv is None else argv)}
        (args.out / "profile_decode.json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
        (args.out / "profile_decode.md").write_text(markdown(meta, runs))
    print(markdown(meta, runs))
    return 0


def markdown(meta, runs) -> str:
    out = [f"# A compiled decode step, split by torch's profiler, on {meta['device']} ({meta['date']})", "",
           f"torch {meta['torch']}; batch {meta['batch']}, random prompts of {meta['prompt']} tokens, static cache "
           f"{meta['cache']}, greedy. Command: `{meta['command']}`.", "",
           "| model | GPTQ layers | ms per step (wall) | kernels ms | idle ms | " + " | ".join(g for g, _ in GROUPS) + " |",
           "|" + "---|" * (5 + len(GROUPS))]
    for r in runs:
        g = r["groups_ms_per_step"]
        out.append(f"| {Path(r['model']).name} | {', '.join(r['layers']) or '-'} | {r['ms_per_step']:.2f} "
                   f"| {r['kernel_ms_per_step']:.2f} | {r['idle_ms_per_step']:.2f} | "
                   + " | ".join(f"{g.get(k, 0.0):.2f}" for k, _ in GROUPS) + " |")
    for r in runs:
        out += ["", f"Top kernels per decode step, {Path(r['model']).name}:", "", "| kernel | us per step | launches per step |",
                "|---|---|---|"]
        out += [f"| `{n[:90]}` | {us:.1f} | {c:.1f} |" for n, us, c in r["kernels"][:25]]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())

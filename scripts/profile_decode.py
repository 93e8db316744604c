"""Where a compiled decode step's time goes, BF16 against Int4 (one GPTQ kernel), by torch's profiler.

    python scripts/profile_decode.py --golden DIR --int4 DIR --gptq-backend quantlab --out DIR [--batch 16]
        [--attention sdpa sdpa_grouped] [--lm-eval-stops] [--host] [--variants ...]

Each model is loaded as the labs load it (utils.models.load_model), then `generate` runs greedy from a
batch of random prompts of --prompt tokens with a static cache of --cache tokens, so transformers
compiles the decode step and replays it as CUDA graphs (utils.decode's "compiled"). Per model:
ms per decode step from the wall clock ((t(long) - t(short)) / extra steps, the prompt's prefill cancels),
then the profiler over a short and a long generate: per kernel name, GPU time per decode step (long minus
short, over the extra steps), grouped as linear layers (the W4A16 kernel, cuBLAS GEMMs), attention,
other kernels, and the GPU's idle time within the step (wall minus kernels: the host, launches, syncs).
--attention names the attention each model runs under, one profile per name (the model is loaded once and
its decode step compiled again for each): "sdpa" is transformers' own, which copies the cache's K/V out to
every query head; "sdpa_grouped" (the default; utils.attention) reads each K/V head once, as Lab 03's
compiled decode does. --lm-eval-stops also times the wall ms per step with lm-eval's own stopping criteria
for gsm8k handed to `generate`, built as lm-eval's HFLM builds them (its per-step host cost: the criteria
decode the last tokens of every row on the host, every step). Needs the models' tokenizers. --int4-unfused:
the Int4 model once more with each gated MLP's gate and up as two launches and torch's silu (what the fused
launch, QuantlabGatedMLP, replaced), to measure what the fusion saves per step. --int4-pdl: once more with
the split-K sum kernel launched as a programmatic dependent (utils.kernels.w4a16.SUM_PDL). Every profile
also lists the host's events per step (torch ops, the compiled region, CUDA runtime calls); --host adds
the host's time per step in each piece of transformers' loop (what the GPU waits for when the step is bound
by the host): the compiled step's call, the inputs and masks, the logits processors, the stopping criteria,
the stop check that waits for the GPU.
Writes profile_decode.md and profile_decode.json into --out (refuses a folder that has them).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
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


ATTENTIONS = ("sdpa", "sdpa_grouped")
VARIANTS = ("default", "no_cudagraph_trees", "skip_guard_eval", "freezing")


@contextlib.contextmanager
def compiled_as(variant: str, phase: str):
    """The compile settings of `variant` around the compile ("compile") or the timed generates ("run"):
    no_cudagraph_trees replays one plain CUDA graph per compiled graph instead of cudagraph trees;
    skip_guard_eval runs a warmed-up step without evaluating its guards (torch's own "unsafe" stance);
    freezing makes inductor treat the weights as constants (no longer inputs checked on every replay)."""
    if variant == "no_cudagraph_trees":
        with torch._inductor.config.patch({"triton.cudagraph_trees": False}):
            yield
    elif variant == "freezing":
        with torch._inductor.config.patch(freezing=True):
            yield
    elif variant == "skip_guard_eval" and phase == "run":
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            yield
    else:
        yield


def lm_eval_stops(tokenizer, ids):
    """lm-eval's stopping criteria for a batch of prompts `ids`, as HFLM._model_generate builds them for
    gsm8k: the task's `until` plus the tokenizer's EOS text (HFLM.generate_until), one criterion each,
    looking at the tokens after the prompt, for ids.shape[0] rows. Stateful: one per generate call."""
    from lm_eval.models.utils import handle_stop_sequences
    from lm_eval.models.utils_hf import stop_sequences_criteria

    from utils.eval_endpoint import task_stop_sequences

    eos = tokenizer.decode(tokenizer.eos_token_id, skip_special_tokens=False)
    until = handle_stop_sequences(list(task_stop_sequences()), eos=eos)
    return stop_sequences_criteria(tokenizer, until, ids.shape[1], ids.shape[0])


def ms_per_step(t_long: float, steps_long: int, t_short: float, steps_short: int) -> float:
    """Wall ms per decode step from a long and a short generate of the same prompts: the prefill cancels.
    Counts the steps each call really made (a stop sequence could end one early)."""
    if steps_long <= steps_short:
        raise ValueError(f"the long generate made {steps_long} steps, the short one {steps_short}: "
                         f"no decode steps between them to time")
    return 1e3 * (t_long - t_short) / (steps_long - steps_short)


def set_attention(model, name: str) -> str:
    """Switch the model to attention `name` and drop its compiled decode step, so the next generate
    compiles one that runs it."""
    from utils.attention import use_grouped_attention

    if name == "sdpa_grouped":
        use_grouped_attention(model)
    else:
        model.set_attn_implementation(name)
    if model.config._attn_implementation != name:
        raise SystemExit(f"--attention: the model kept {model.config._attn_implementation!r} when asked for {name!r}")
    if hasattr(model, "_compiled_call"):
        del model._compiled_call
    torch._dynamo.reset()
    return name


def generate(model, ids, new, cache, stops=None):
    """Seconds and decode steps of one greedy generate of `new` tokens (fewer if lm-eval's stops end it)."""
    cache.reset()
    t0 = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                         do_sample=False, past_key_values=cache, pad_token_id=0,
                         stopping_criteria=stops(ids) if stops else None)
    torch.cuda.synchronize()
    return time.perf_counter() - t0, int(out.shape[1]) - int(ids.shape[1])


def wall_ms(model, ids, cache, short, long, stops=None) -> float:
    """The median of three (long minus short) measurements of ms per decode step."""
    walls = [ms_per_step(*generate(model, ids, long, cache, stops), *generate(model, ids, short, cache, stops))
             for _ in range(3)]
    return sorted(walls)[1]


def kernel_us(model, ids, new, cache) -> tuple[dict, dict]:
    """GPU µs and launches per kernel name, and host µs (inclusive) and count per CPU event name (torch ops,
    the compiled region, CUDA runtime calls such as cudaGraphLaunch), over one generate."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        generate(model, ids, new, cache)
    gpu, cpu = defaultdict(lambda: [0.0, 0]), defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0 and "Memcpy" not in e.name \
                and "Memset" not in e.name:
            gpu[e.name][0] += e.device_time_total
            gpu[e.name][1] += 1
        elif e.device_type == torch.autograd.DeviceType.CPU:
            cpu[e.name][0] += e.cpu_time_total
            cpu[e.name][1] += 1
    return gpu, cpu


def per_step_of(long: dict, short: dict, steps: int) -> dict:
    """(µs, count) per decode step for each name: the long run minus the short one, over the extra steps."""
    return {n: ((v[0] - short.get(n, [0, 0])[0]) / steps, (v[1] - short.get(n, [0, 0])[1]) / steps)
            for n, v in long.items()}


HOST_PIECES = (("compiled step: guards, CUDA-graph checks, graph launch", "model", "_compiled_call"),
               ("inputs and masks for the step", "model", "prepare_inputs_for_generation"),
               ("model kwargs update", "model", "_update_model_kwargs_for_generation"),
               ("logits processors", "logits", "__call__"),
               ("stopping criteria (lm-eval's, when handed over)", "stopping", "__call__"),
               ("stop check: waits for the GPU", "stopcheck", "__call__"))


def host_split(model, ids, cache, new, stops=None) -> dict:
    """Host µs per decode step in each piece of transformers' loop (HOST_PIECES): one generate of `new` steps
    with those functions timed, the median per piece over its calls (the prefill's one call falls out).
    What is left of a step's wall time is the loop itself and the eager kernels it launches."""
    import transformers.generation.utils as gen_utils
    from transformers.generation.logits_process import LogitsProcessorList
    from transformers.generation.stopping_criteria import StoppingCriteriaList

    owners = {"model": model, "logits": LogitsProcessorList, "stopping": StoppingCriteriaList,
              "stopcheck": gen_utils.StopCheck}
    times, saved = defaultdict(list), []

    def timed(label, fn):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                times[label].append(time.perf_counter() - t0)
        return call
    try:
        for label, owner, attr in HOST_PIECES:
            obj = owners[owner]
            if owner == "model" and not hasattr(obj, attr):
                continue
            saved.append((obj, attr, obj.__dict__.get(attr, None) if owner == "model" else getattr(obj, attr)))
            setattr(obj, attr, timed(label, getattr(obj, attr)))
        generate(model, ids, new, cache, stops)
    finally:
        for obj, attr, old in reversed(saved):
            if old is None:
                delattr(obj, attr)
            else:
                setattr(obj, attr, old)
    return {label: 1e6 * statistics.median(times[label]) if times[label] else None for label, _, _ in HOST_PIECES}


class TwoLaunchMLP(torch.nn.Module):
    """A QuantlabGatedMLP's projections called one by one: down(silu(gate(x)) * up(x))."""

    def __init__(self, fused):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = fused.gate_proj, fused.up_proj, fused.down_proj

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


def unfuse(model) -> int:
    from utils.quantlab_linear import QuantlabGatedMLP, replace_submodule
    names = [n for n, m in model.named_modules() if isinstance(m, QuantlabGatedMLP)]
    for n in names:
        replace_submodule(model, n, TwoLaunchMLP(model.get_submodule(n)))
    return len(names)


def measure(model, ids, cache, short, long, host: bool, tok) -> dict:
    """One compiled model's step: wall ms, kernels and host events per step (tok: also with lm-eval's stops;
    host: also the host's time per step in each piece of transformers' loop)."""
    ms = wall_ms(model, ids, cache, short, long)
    (a, a_cpu), (b, b_cpu) = kernel_us(model, ids, short, cache), kernel_us(model, ids, long, cache)
    per_step, host = per_step_of(b, a, long - short), per_step_of(b_cpu, a_cpu, long - short)
    groups = defaultdict(float)
    for n, (us, _) in per_step.items():
        groups[group_of(n)] += us
    busy = sum(groups.values()) / 1e3
    res = {"ms_per_step": ms, "kernel_ms_per_step": busy, "idle_ms_per_step": ms - busy,
           "groups_ms_per_step": {g: v / 1e3 for g, v in groups.items()},
           "kernels": sorted(([n, us, c] for n, (us, c) in per_step.items()), key=lambda r: -r[1])[:40],
           "host_events": sorted(([n, us, c] for n, (us, c) in host.items()), key=lambda r: -r[1])[:30]}
    if host:
        res["host_split_us"] = host_split(model, ids, cache, long)
        if tok is not None:
            res["host_split_us_lm_eval_stops"] = host_split(model, ids, cache, long, lambda x: lm_eval_stops(tok, x))
    if tok is not None:
        with_stops = wall_ms(model, ids, cache, short, long, lambda x: lm_eval_stops(tok, x))
        res.update(ms_per_step_lm_eval_stops=with_stops, lm_eval_stops_ms_per_step=with_stops - ms)
    return res


def profile_model(path, backend, attentions, batch, prompt, cache_len, short, long, stops: bool,
                  two_launch_mlp: bool = False, pdl: bool = False, host: bool = False,
                  variants=("default",)) -> list[dict]:
    """One profile of the model at `path` per attention in `attentions` and compile variant in `variants`
    (two_launch_mlp: unfuse it first; pdl: its W4A16 sum kernels launched with PDL; host: also split the
    host's time per step)."""
    from utils.kernels import w4a16
    w4a16.SUM_PDL = pdl
    from transformers import AutoTokenizer, StaticCache

    from utils.decode import _allow_compile
    from utils.gptq import gptq_kernel_classes
    from utils.models import load_model

    model = load_model(path, "cuda", backend=backend)
    if two_launch_mlp and not unfuse(model):
        raise SystemExit(f"--int4-unfused: {path} loaded with {backend} has no fused MLP to split")
    _allow_compile(model)
    tok = AutoTokenizer.from_pretrained(str(path)) if stops else None
    vocab = model.config.vocab_size
    ids = torch.randint(100, vocab - 100, (batch, prompt), generator=torch.Generator().manual_seed(0)).cuda()
    layers = sorted((gptq_kernel_classes(model) or []) + (["TwoLaunchMLP"] if two_launch_mlp else []))
    runs = []
    for attention, variant in [(a, v) for a in attentions for v in variants]:
        set_attention(model, attention)
        cache = StaticCache(config=model.config, max_cache_len=cache_len)
        torch.cuda.reset_peak_memory_stats()
        with compiled_as(variant, "compile"):
            first, _ = generate(model, ids, short, cache)                  # compiles
            generate(model, ids, short, cache)
            with compiled_as(variant, "run"):
                res = measure(model, ids, cache, short, long, host, tok)
        res.update(model=str(path), gptq_backend=backend, attention=attention, compile_variant=variant,
                   first_generate_s=first, peak_allocated_gib=torch.cuda.max_memory_allocated() / 2**30, layers=layers + (["sum kernel with PDL"] if pdl else []))
        runs.append(res)
        del cache
    del model
    gc.collect()
    torch.cuda.empty_cache()
    torch._dynamo.reset()
    return runs


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
    ap.add_argument("--attention", nargs="+", choices=ATTENTIONS, default=["sdpa_grouped"],
                    help="the attention(s) to profile each model under (default: sdpa_grouped)")
    ap.add_argument("--lm-eval-stops", action="store_true",
                    help="also time each step with lm-eval's gsm8k stopping criteria passed to generate")
    ap.add_argument("--int4-unfused", action="store_true",
                    help="also profile the Int4 model with each gated MLP's gate and up as two launches")
    ap.add_argument("--int4-pdl", action="store_true",
                    help="also profile the Int4 model with its split-K sum kernels launched with PDL")
    ap.add_argument("--host", action="store_true",
                    help="also split the host's time per step into the pieces of transformers' loop")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=["default"],
                    help="compile settings to profile each model under (default: transformers' own)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if len(set(args.attention)) != len(args.attention):
        raise SystemExit(f"--attention: {args.attention} names one twice")
    if not 0 < args.short < args.long or args.prompt + args.long > args.cache:
        raise SystemExit(f"--short/--long/--prompt/--cache: need 0 < short < long and prompt + long <= cache, got "
                         f"{args.short}, {args.long}, {args.prompt}, {args.cache}")
    if (args.out / "profile_decode.json").exists():
        raise SystemExit(f"--out: {args.out} already holds profile_decode.json; pass a new folder")
    if not torch.cuda.is_available():
        raise SystemExit("profile_decode: torch sees no GPU here; run it on the GPU machine")
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    models = [(args.golden, None, False, False), (args.int4, args.gptq_backend, False, False)]
    models += [(args.int4, args.gptq_backend, True, False)] if args.int4_unfused else []
    models += [(args.int4, args.gptq_backend, False, True)] if args.int4_pdl else []
    for path, backend, two, pdl in models:
        runs += profile_model(path, backend or "auto", args.attention, args.batch, args.prompt, args.cache,
                              args.short, args.long, args.lm_eval_stops, two, pdl, args.host,
                              args.variants)
        for r in runs[-len(args.attention) * len(args.variants):]:
            print(json.dumps({k: v for k, v in r.items() if k not in ("kernels", "host_events")}),
                  flush=True)
        meta = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "batch": args.batch,
                "prompt": args.prompt, "cache": args.cache, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "command": "python scripts/profile_decode.py " + " ".join(sys.argv[1:] if argv is None else argv)}
        (args.out / "profile_decode.json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
        (args.out / "profile_decode.md").write_text(markdown(meta, runs))
    print(markdown(meta, runs))
    return 0


def _us(v) -> str:
    return "-" if v is None else f"{v:.0f}"


def markdown(meta, runs) -> str:
    stops = any("ms_per_step_lm_eval_stops" in r for r in runs)
    extra = ["ms per step with lm-eval's stops (wall)", "lm-eval's stop check ms"] if stops else []
    out = [f"# A compiled decode step, split by torch's profiler, on {meta['device']} ({meta['date']})", "",
           f"torch {meta['torch']}; batch {meta['batch']}, random prompts of {meta['prompt']} tokens, static cache "
           f"{meta['cache']}, greedy. Command: `{meta['command']}`.", "",
           "| model | attention | compile | GPTQ layers | ms per step (wall) | " + "".join(f"{e} | " for e in extra)
           + "kernels ms | idle ms | " + " | ".join(g for g, _ in GROUPS) + " |",
           "|" + "---|" * (7 + len(extra) + len(GROUPS))]
    for r in runs:
        g = r["groups_ms_per_step"]
        cells = [f"{r[k]:.2f}" if r.get(k) is not None else "-"
                 for k in ("ms_per_step_lm_eval_stops", "lm_eval_stops_ms_per_step")] if stops else []
        out.append(f"| {Path(r['model']).name} | {r.get('attention', 'sdpa')} | {r.get('compile_variant', 'default')} "
                   f"| {', '.join(r['layers']) or '-'} "
                   f"| {r['ms_per_step']:.2f} | " + "".join(f"{c} | " for c in cells)
                   + f"{r['kernel_ms_per_step']:.2f} | {r['idle_ms_per_step']:.2f} | "
                   + " | ".join(f"{g.get(k, 0.0):.2f}" for k, _ in GROUPS) + " |")
    for r in runs:
        which = f"{Path(r['model']).name}, attention {r.get('attention', 'sdpa')}, {r.get('compile_variant', 'default')}"
        out += ["", f"Top kernels per decode step, {which}:",
                "", "| kernel | us per step | launches per step |", "|---|---|---|"]
        out += [f"| `{n[:90]}` | {us:.1f} | {c:.1f} |" for n, us, c in r["kernels"][:25]]
        out += ["", f"Host events per decode step (torch's profiler, inclusive), {which}:", "",
                "| event | us per step | count per step |", "|---|---|---|"]
        out += [f"| `{n[:90]}` | {us:.1f} | {c:.1f} |" for n, us, c in r.get("host_events", [])[:20]]
        if r.get("host_split_us"):
            stops_split = r.get("host_split_us_lm_eval_stops") or {}
            out += ["", f"The host's time per decode step in transformers' loop (median µs per call), {which}:", "",
                    "| piece | us | us with lm-eval's stops |", "|---|---|---|"]
            out += [f"| {label} | {_us(r['host_split_us'].get(label))} | {_us(stops_split.get(label))} |"
                    for label, _, _ in HOST_PIECES]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())

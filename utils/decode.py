"""How lm-eval's generation loop runs, and what each of its `generate` calls cost.

Why: at 7B a decode step of transformers' `generate` is bound by the host (Python and about a thousand
kernel launches per token), not by reading the weights, so batch 16 costs about what batch 1 does.
`decode="compiled"` gives the step fixed shapes (a static KV cache as long as lm-eval's `max_length`,
reused by every batch), so transformers compiles the decode step once and replays it as CUDA graphs
(torch.compile's "reduce-overhead"); the prompt (prefill) stays eager. A last, smaller batch is padded up to
the compiled batch rather than compiled again. The compiled step runs the grouped-query attention of
utils.attention, which reads the static cache once per key/value head where transformers' sdpa would copy
it out to every query head. lm-eval's task, prompt, stop sequences, filters and metric are untouched:
only the model's forward pass runs differently, and whether the answers stay the same is measured
(scripts/bench_lab03.py), not assumed.
"""
from __future__ import annotations

import math
import statistics
import time

from .attention import use_grouped_attention

DECODES = ("eager", "compiled")
CACHE_ROUND = 256             # the static cache's length is a multiple of this (one compile serves nearby lengths)


def _allow_compile(model) -> None:
    """transformers marks every GPTQ model as not compileable (its quantizer base class says so for all
    methods) and then silently skips the compile. GPTQModel's kernels are Triton kernels or plain torch,
    which torch.compile traces; whether the Int4 answers survive is checked against the eager run."""
    q = getattr(model, "hf_quantizer", None)
    if q is not None and not q.is_compileable:
        q.__class__ = type(f"Compileable{type(q).__name__}", (type(q),), {"is_compileable": property(lambda s: True)})


def pad_batch(args: tuple, kwargs: dict, batch: int, to: int) -> tuple[tuple, dict]:
    """`generate`'s arguments with every per-row tensor (leading dimension `batch`: input_ids, attention_mask)
    grown to `to` rows by repeating its last real row. Rows of a batch are independent given their masks, so
    the real rows' tokens do not change, and a copy of a real row stops when that row does. lm-eval's stop
    criteria were built for `batch` rows and look at those rows only."""
    import torch

    def grow(v):
        if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == batch:
            return torch.cat([v, v[-1:].expand(to - batch, *v.shape[1:])])
        return v
    return tuple(grow(a) for a in args), {k: grow(v) for k, v in kwargs.items()}


class DecodeRecorder:
    """Wraps a model's `generate` (the one lm-eval's HFLM calls): times each call, counts its decode steps,
    and in "compiled" mode hands it one static cache of `cache_len` tokens (reset per call). The first call's
    batch is the compiled one: a later, smaller batch (1,319 problems at 16 leave 7) is padded up to it and
    only its real rows are returned, so the decode step is not compiled a second time for the new shape."""

    def __init__(self, model, decode: str, cache_len: int | None):
        self.model, self.decode, self.max_cache_len = model, decode, cache_len
        self.cache_len = None
        self.orig = model.generate
        self.calls: list[dict] = []
        self._cache, self._cache_batch = None, None

    def _static_cache(self, batch: int, needed: int | None):
        """One cache for the run, as long as the first call needs (lm-eval sends its longest prompts first),
        rounded up to CACHE_ROUND tokens, at most max_length: attention reads the whole cache every step,
        so its length, not the prompt's, sets attention's cost. A call that needs more gets a longer one."""
        from transformers import StaticCache

        want = self.max_cache_len
        if needed is not None:
            want = min(want, -(-needed // CACHE_ROUND) * CACHE_ROUND)
        if self._cache_batch != batch or want > self.cache_len:   # the first call, a larger batch, a longer need
            self._cache = None                   # the old one's memory goes first
            self.cache_len = max(want, self.cache_len or 0)
            self._cache = StaticCache(config=self.model.config, max_cache_len=self.cache_len)
            self._cache_batch = batch
        self._cache.reset()
        return self._cache

    def __call__(self, *args, **kwargs):
        import torch

        ids = kwargs.get("input_ids", args[0] if args else None)
        batch, prompt = (int(ids.shape[0]), int(ids.shape[1])) if ids is not None else (None, None)
        padded = 0
        if self.decode == "compiled":
            if (batch is not None and self._cache_batch is not None and batch < self._cache_batch
                    and not kwargs.get("return_dict_in_generate")):
                padded = self._cache_batch - batch
                args, kwargs = pad_batch(args, kwargs, batch, self._cache_batch)
            needed = kwargs.get("max_length")
            if needed is None and prompt is not None and kwargs.get("max_new_tokens") is not None:
                needed = prompt + int(kwargs["max_new_tokens"])
            kwargs["past_key_values"] = self._static_cache(batch + padded if batch is not None else batch,
                                                           None if needed is None else int(needed))
        t0 = time.perf_counter()
        out = self.orig(*args, **kwargs)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        if padded:
            out = out[:batch]
        steps = int(out.shape[1]) - prompt if prompt is not None else None
        self.calls.append({"batch": batch, "padded_rows": padded, "prompt_tokens": prompt, "steps": steps,
                           "seconds": seconds})
        if self.decode == "compiled" and len(self.calls) == 1 and getattr(self.model, "_compiled_call", None) is None:
            raise RuntimeError("decode: 'compiled' was asked for, but transformers did not compile the decode step "
                               "of this model (it needs a static cache on a GPU); use decode='eager'")
        return out

    def summary(self) -> dict:
        """The calls' count, the first call's seconds (it includes the compile), the steady cost of a decode
        step (the median over the later calls of seconds / steps), the attention the model ran, and how many
        calls were padded up to the compiled batch."""
        later = [c["seconds"] / c["steps"] for c in self.calls[1:] if c["steps"]]
        compiled = self.decode == "compiled"
        return {"decode": self.decode, "compiled": getattr(self.model, "_compiled_call", None) is not None,
                "attention": getattr(getattr(self.model, "config", None), "_attn_implementation", None),
                "cache_len": self.cache_len if compiled else None,
                "max_cache_len": self.max_cache_len if compiled else None, "calls": len(self.calls),
                "pads_smaller_batches": compiled, "padded_calls": sum(1 for c in self.calls if c["padded_rows"]),
                "first_call_s": self.calls[0]["seconds"] if self.calls else None,
                "steady_ms_per_step": 1000 * statistics.median(later) if later else None,
                "per_call": self.calls}


def extrapolate_seconds(decode: dict, batch: int, max_gen_toks: int, problems: int) -> float | None:
    """Seconds for `problems` problems from a DecodeRecorder summary: ceil(problems / batch) calls at the steady
    per-call cost of max_gen_toks steps (a worst case: real answers stop early at lm-eval's stop sequences),
    plus what the first call cost beyond a steady one (warm-up, and the compile). A last, smaller batch is
    padded to the compiled batch (a steady call); a compiled summary without "pads_smaller_batches" (kept
    from a recorder that did not pad) paid the compile again for it. None without a steady measurement."""
    steady, first = decode.get("steady_ms_per_step"), decode.get("first_call_s")
    if steady is None or first is None:
        return None
    per_call = steady / 1000 * max_gen_toks
    extra = max(first - per_call, 0.0)
    recompiled = decode.get("decode") == "compiled" and not decode.get("pads_smaller_batches")
    compiles = 2 if recompiled and problems % batch else 1
    return math.ceil(problems / batch) * per_call + compiles * extra


def prepare_decode(lm, decode: str = "eager", *, param: str = "decode") -> DecodeRecorder:
    """Set how lm-eval's HFLM `lm` decodes and start recording its generate calls. "compiled" needs a
    CUDA/ROCm GPU and lm-eval's max_length (the static cache's length); anything else is an error naming
    `param`, never a quiet eager run."""
    if decode not in DECODES:
        raise ValueError(f"{param}: {decode!r} is not one of {list(DECODES)}")
    model = getattr(lm, "model", None)
    if model is None or not hasattr(model, "generate"):
        raise ValueError(f"{param}: {decode!r} needs lm-eval's hf model (a transformers model to generate with)")
    cache_len = None
    if decode == "compiled":
        if model.device.type != "cuda":
            raise ValueError(f"{param}: 'compiled' replays the decode step as CUDA graphs and needs a GPU; "
                             f"this model is on {model.device.type}: use decode='eager'")
        cache_len = int(lm.max_length)
        if cache_len > 8192:
            raise ValueError(f"{param}: 'compiled' keeps a static KV cache of max_length tokens per sequence; "
                             f"max_length is {cache_len} (the model's own maximum?): set max_length to what the "
                             f"task needs (longest prompt + max_gen_toks)")
        _allow_compile(model)
        try:
            use_grouped_attention(model)        # the attention of the measured decode path (utils.attention)
        except ValueError as e:
            raise ValueError(f"{param}: 'compiled' runs the grouped-query attention: {e}") from None
    recorder = DecodeRecorder(model, decode, cache_len)
    model.generate = recorder
    return recorder


class TimedGeneration:
    """Wrap lm.generate_until to time the generation phase and count the tokens it kept."""

    def __init__(self, lm):
        self.lm, self.orig = lm, lm.generate_until
        self.seconds, self.requests, self.tokens = 0.0, 0, 0

    def __call__(self, requests, *args, **kwargs):
        t0 = time.perf_counter()
        out = self.orig(requests, *args, **kwargs)
        self.seconds += time.perf_counter() - t0
        self.requests += len(requests)
        tok = self.lm.tokenizer
        self.tokens += sum(len(tok.encode(text, add_special_tokens=False)) for text in out)
        return out

"""Where does precision break? Golden vs Int4 (or golden vs device) at the logits and layer by layer.

Three views, from coarse to fine:
- the experiment report's logit check: last-token logits of one prompt, cosine and MSE, its thresholds
  (cosine >= 0.99 healthy; < 0.95 critical: suspected silent data corruption, SDC 静默数据损坏);
- llama.cpp's KL-divergence statistics over a corpus (what `llama-perplexity --kl-divergence` prints);
- per-layer metrics from forward hooks, propagated (each model on its own activations: errors add up)
  and isolated (each test layer fed the golden input of that layer, PyTorch Numeric Suite's shadow
  comparison: the layer's own, local error).
Memory: the golden model's results go to the CPU before the test model is loaded, and the layer
metrics are accumulated per module and per prompt, never held whole.
"""
from __future__ import annotations

import gc
import math
from typing import Any, Iterable

import torch

from . import metrics
from .capture import decoder_layers, forward_capture, hooked_modules, hooks, model_device, module_label

COS_HEALTHY = 0.99   # the report's threshold: at or above, healthy
COS_CRITICAL = 0.95  # below: critical, suspected SDC (静默数据损坏)
PERCENTILES = (("max", 100.0), ("99.9%", 99.9), ("99%", 99.0), ("95%", 95.0), ("90%", 90.0),
               ("median", 50.0), ("10%", 10.0), ("5%", 5.0), ("1%", 1.0), ("min", 0.0))


def cosine_verdict(cos: float, healthy: float = COS_HEALTHY, critical: float = COS_CRITICAL) -> str:
    """'healthy' / 'degraded' / 'critical' by the report's thresholds; NaN is critical."""
    if not math.isfinite(cos) or cos < critical:
        return "critical"
    return "healthy" if cos >= healthy else "degraded"


def free() -> None:
    """Collect garbage and return the accelerator's cached memory: call it after `del model`, before
    loading the other model (never two full models on the accelerator at once)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- streaming metrics
class MetricAccumulator:
    """cosine, normalized L2, SQNR (dB) and max abs error accumulated batch by batch in float64.

    Sums of out*ref, out^2, ref^2, (out-ref)^2 are all the metrics need, so whole activations are
    never concatenated. result() on one batch equals utils.metrics on that batch (tested).
    """

    def __init__(self):
        self.dot = self.oo = self.rr = self.ee = 0.0
        self.max_abs = 0.0
        self.nonfinite = 0
        self.n = 0

    def update(self, out: torch.Tensor, ref: torch.Tensor) -> "MetricAccumulator":
        if out.shape != ref.shape:
            raise ValueError(f"shape mismatch: output {tuple(out.shape)} vs reference {tuple(ref.shape)}")
        o = out.detach().to("cpu", torch.float64).flatten()
        r = ref.detach().to("cpu", torch.float64).flatten()
        self.nonfinite += int((~torch.isfinite(o)).sum())
        d = o - r
        self.dot += float(o @ r)
        self.oo += float(o @ o)
        self.rr += float(r @ r)
        self.ee += float(d @ d)
        if o.numel():
            self.max_abs = max(self.max_abs, float(d.abs().max()))
        self.n += o.numel()
        return self

    def result(self) -> dict[str, float]:
        if self.nonfinite:
            nan = float("nan")
            return {"cosine": nan, "rel_l2": nan, "sqnr_db": nan, "max_abs": nan, "nonfinite": self.nonfinite}
        cos = self.dot / math.sqrt(self.oo * self.rr) if self.oo * self.rr > 0 else float(self.oo == self.rr)
        rel = math.sqrt(self.ee / self.rr) if self.rr > 0 else (0.0 if self.ee == 0 else math.inf)
        sqnr = math.inf if rel == 0 else -20.0 * math.log10(rel)
        return {"cosine": cos, "rel_l2": rel, "sqnr_db": sqnr, "max_abs": self.max_abs, "nonfinite": 0}


# ---------------------------------------------------------------- 1. the report's logit check
@torch.no_grad()
def last_token_logits(model, tokenizer, prompt: str, seed: int = 0) -> torch.Tensor:
    """The report's setup: fixed seed, one prompt, the logits of the last position, on the CPU in float32."""
    torch.manual_seed(seed)
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(model_device(model))
    return model(input_ids=ids, use_cache=False).logits[0, -1].float().cpu()


def logit_check(golden: torch.Tensor, test: torch.Tensor) -> dict[str, Any]:
    """Cosine and MSE of two logit vectors (utils.metrics), top-1 agreement and the report's verdict."""
    if golden.shape != test.shape:
        raise ValueError(f"logits differ in shape {tuple(golden.shape)} vs {tuple(test.shape)}: the two "
                         "models must share a vocabulary (same tokenizer).")
    cos = metrics.cosine_similarity(test, golden)
    mse = float(((test.double() - golden.double()) ** 2).mean())
    return {"cosine": cos, "mse": mse, "rel_l2": metrics.relative_l2(test, golden),
            "same_top1": bool(test.argmax() == golden.argmax()), "verdict": cosine_verdict(cos)}


# ---------------------------------------------------------------- 2. llama.cpp's KL statistics
def tokenize_corpus(tokenizer, texts: Iterable[str], max_tokens: int = 128) -> list[torch.Tensor]:
    """Token ids per text, cut to max_tokens; texts shorter than 2 tokens predict nothing and are dropped."""
    out = [tokenizer(t, return_tensors="pt").input_ids[0][:max_tokens] for t in texts]
    out = [t for t in out if t.numel() >= 2]
    if not out:
        raise ValueError("the corpus has no text of 2 tokens or more: give longer prompts.")
    return out


def _batches(ids: list[torch.Tensor], batch_size: int, pad_id: int):
    for i in range(0, len(ids), batch_size):
        chunk = ids[i:i + batch_size]
        T = max(t.numel() for t in chunk)
        x = torch.full((len(chunk), T), pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), T), dtype=torch.long)
        for j, t in enumerate(chunk):
            x[j, :t.numel()] = t
            mask[j, :t.numel()] = 1
        yield x, mask


@torch.no_grad()
def corpus_logprobs(model, ids: list[torch.Tensor], batch_size: int = 8, pad_id: int = 0,
                    progress: bool = False) -> list[torch.Tensor]:
    """Per text, log-softmax (float32, CPU) at every position that predicts a next token: [T-1, vocab].

    Right padding with an attention mask; padded positions are dropped before leaving the device.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    dev = model_device(model)
    out: list[torch.Tensor] = []
    batches = list(_batches(ids, batch_size, pad_id))
    if progress:
        from tqdm.auto import tqdm
        batches = tqdm(batches, desc="log-probs")
    for x, mask in batches:
        logits = model(input_ids=x.to(dev), attention_mask=mask.to(dev), use_cache=False).logits
        lp = torch.log_softmax(logits.float(), dim=-1)
        for j in range(x.shape[0]):
            n = int(mask[j].sum())
            out.append(lp[j, : n - 1].cpu())
    return out


def kl_token_stats(golden_lp: list[torch.Tensor], test_lp: list[torch.Tensor],
                   ids: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per predicted token: KL(golden || test), same top-1, p(correct) under each, NLL under each."""
    if not (len(golden_lp) == len(test_lp) == len(ids)):
        raise ValueError(f"{len(golden_lp)} golden, {len(test_lp)} test log-prob sets, {len(ids)} texts")
    kl, same, pg, pt, nll_g, nll_t = [], [], [], [], [], []
    for g, t, tok in zip(golden_lp, test_lp, ids):
        g, t = g.double(), t.double()
        target = tok[1: g.shape[0] + 1].long()
        kl.append((g.exp() * (g - t)).sum(-1))
        same.append((g.argmax(-1) == t.argmax(-1)).double())
        lg, lt = g.gather(-1, target[:, None])[:, 0], t.gather(-1, target[:, None])[:, 0]
        pg.append(lg.exp()), pt.append(lt.exp()), nll_g.append(-lg), nll_t.append(-lt)
    cat = torch.cat
    return {"kl": cat(kl), "same_top1": cat(same), "p_golden": cat(pg), "p_test": cat(pt),
            "nll_golden": cat(nll_g), "nll_test": cat(nll_t)}


def _sem(x: torch.Tensor) -> float:
    return float(x.std(unbiased=True) / math.sqrt(x.numel())) if x.numel() > 1 else float("nan")


def kl_summary(tok: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The statistics `llama-perplexity --kl-divergence` prints, from kl_token_stats' per-token values.

    PPL = exp(mean NLL), its uncertainty by the delta method; the PPL ratio through the mean of the
    per-token log ratio (as llama.cpp does); KL mean ± standard error and percentiles; same-top-1 rate
    ± binomial error; Δp = p_test(correct) - p_golden(correct), mean ± error, RMS and percentiles.
    """
    n = int(tok["kl"].numel())
    if n == 0:
        raise ValueError("no predicted tokens: the corpus is empty")
    kl = tok["kl"].clamp_min(0.0)  # float64 rounding can leave -1e-17 for identical distributions
    dp = tok["p_test"] - tok["p_golden"]
    ng, nt = tok["nll_golden"], tok["nll_test"]
    ppl_g, ppl_t = math.exp(float(ng.mean())), math.exp(float(nt.mean()))
    log_ratio = nt - ng
    same = float(tok["same_top1"].mean())
    q = lambda x: {lab: float(torch.quantile(x, p / 100.0)) for lab, p in PERCENTILES}  # noqa: E731
    return {
        "tokens": n,
        "ppl_golden": ppl_g, "ppl_golden_err": ppl_g * _sem(ng),
        "ppl_test": ppl_t, "ppl_test_err": ppl_t * _sem(nt),
        "ppl_ratio": math.exp(float(log_ratio.mean())),
        "ppl_ratio_err": math.exp(float(log_ratio.mean())) * _sem(log_ratio),
        "mean_ln_ppl_ratio": float(log_ratio.mean()), "mean_ln_ppl_ratio_err": _sem(log_ratio),
        "kl_mean": float(kl.mean()), "kl_mean_err": _sem(kl), "kl_percentiles": q(kl),
        "same_top1": same, "same_top1_err": math.sqrt(same * (1 - same) / n),
        "dp_mean": float(dp.mean()), "dp_mean_err": _sem(dp), "dp_rms": float(dp.pow(2).mean().sqrt()),
        "dp_percentiles": q(dp),
    }


# ---------------------------------------------------------------- 3. layer by layer
@torch.no_grad()
def golden_layer_capture(model, ids: list[torch.Tensor], parts: bool = True,
                         progress: bool = False) -> list[dict[str, torch.Tensor]]:
    """Per prompt (batch 1, no padding), every hooked module's input and output on the CPU."""
    it = ids
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(ids, desc="golden capture")
    return [forward_capture(model, t, parts=parts, inputs=True) for t in it]


@torch.no_grad()
def compare_layers(model, ids: list[torch.Tensor], golden: list[dict[str, torch.Tensor]], mode: str,
                   parts: bool = True, progress: bool = False) -> list[dict[str, Any]]:
    """Per module of `model` (the test model) against the golden capture, in mode 'propagated' or 'isolated'.

    propagated: the test model runs on its own activations; a layer's error includes all upstream error.
    isolated: a pre-hook swaps every hooked module's input for the golden input of that module, so each
    module's error is its own (PyTorch Numeric Suite's shadow comparison).
    Metrics are accumulated per module over prompts (MetricAccumulator), streaming.
    """
    if mode not in ("propagated", "isolated"):
        raise ValueError(f"mode must be 'propagated' or 'isolated', got {mode!r}")
    if len(ids) != len(golden):
        raise ValueError(f"{len(ids)} prompts but a golden capture of {len(golden)}")
    mods = hooked_modules(model, parts)
    missing = [n for n in mods if n not in golden[0]]
    if missing:
        raise ValueError(f"golden capture lacks {missing[:3]}: capture it with the same parts={parts}.")
    acc = {n: MetricAccumulator() for n in mods}
    logits_acc = MetricAccumulator()
    dev = model_device(model)
    it = list(zip(ids, golden))
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc=f"{mode} layers")
    for tok, gold in it:
        on_out = lambda n, t, _g=gold: acc[n].update(t[0], _g[n][0])  # noqa: E731
        swap = None
        if mode == "isolated":
            swap = lambda n, x, _g=gold: _g[f"{n}:input"].to(device=x.device, dtype=x.dtype)  # noqa: E731
        with hooks(mods, on_output=on_out, replace_input=swap):
            logits = model(input_ids=tok.reshape(1, -1).to(dev), use_cache=False).logits
        logits_acc.update(logits[0], gold["logits"][0])
    rows = []
    for n in mods:
        layer, part = module_label(n)
        rows.append({"module": n, "layer": layer, "part": part, "mode": mode, **acc[n].result()})
    rows.append({"module": "logits", "layer": None, "part": "logits", "mode": mode, **logits_acc.result()})
    return rows


def first_bad(rows: list[dict[str, Any]], threshold: float = COS_HEALTHY, part: str | None = "layer",
              ) -> dict[str, Any] | None:
    """The first module in execution order whose cosine is below threshold (or NaN); None if all pass.

    part='layer' looks only at whole decoder layers; None looks at every module.
    """
    for r in rows:
        if r["part"] == "logits" or (part is not None and r["part"] != part):
            continue
        if not (r["cosine"] >= threshold):  # NaN counts as bad
            return r
    return None


@torch.no_grad()
def plant_fault(model, layer: int, scale: float = 100.0, block: int = 16) -> str:
    """Corrupt `model` in place: scale a block x block corner of decoder layer `layer`'s mlp.down_proj by `scale`.

    The lab's self-test: a fault planted where we know must be found there. Returns the module's name.
    Use a float (not GPTQ) model; reload it afterwards to get the healthy weights back.
    """
    prefix, layers = decoder_layers(model)
    if not 0 <= layer < len(layers):
        raise ValueError(f"plant_fault_layer must be in 0..{len(layers) - 1}, got {layer}")
    w = layers[layer].mlp.down_proj.weight
    w[:block, :block] *= scale
    return f"{prefix}.{layer}.mlp.down_proj"


def worst_layer(rows: list[dict[str, Any]], metric: str = "sqnr_db") -> dict[str, Any]:
    """The decoder layer with the lowest SQNR (the largest local error in isolated mode)."""
    layers = [r for r in rows if r["part"] == "layer"]
    return min(layers, key=lambda r: -math.inf if math.isnan(r[metric]) else r[metric])  # NaN is worst


def plot_layers(rows: list[dict[str, Any]], title: str = ""):
    """Each metric over depth, one line per part (layer, self_attn, mlp, norms), one figure of four panels."""
    import matplotlib.pyplot as plt
    if rows and all(r["max_abs"] == 0 for r in rows):    # bit-identical: every panel would be empty
        fig = plt.figure(figsize=(9, 0.5))
        fig.text(0.01, 0.5, f"{title}: all {len(rows)} modules bit-identical (cosine 1, error 0, SQNR inf)",
                 va="center", fontsize=9)
        return fig
    fig, axes = plt.subplots(2, 2, figsize=(9, 5.5), sharex=True)
    parts = [p for p in ("layer", "self_attn", "mlp", "input_layernorm", "post_attention_layernorm")
             if any(r["part"] == p for r in rows)]
    for ax, (metric, label) in zip(axes.flat, [("cosine", "cosine similarity"), ("rel_l2", "normalized L2"),
                                               ("sqnr_db", "SQNR dB"), ("max_abs", "max abs error")]):
        exact = 0                  # bit-identical points: error 0 (off a log axis), SQNR inf: a gap, counted
        for p in parts:
            pts = [(r["layer"], r[metric]) for r in rows if r["part"] == p]
            bad = [y == math.inf or (metric in ("rel_l2", "max_abs") and y <= 0) for _, y in pts]
            exact += sum(bad)
            ax.plot([x for x, _ in pts], [math.nan if b else y for (_, y), b in zip(pts, bad)], marker="o", ms=3,
                    label=p)
        if exact and metric != "cosine":
            ax.text(0.01, 0.98, f"{exact} bit-identical point{'s' if exact > 1 else ''} not drawn",
                    transform=ax.transAxes, fontsize=7, va="top")
        if metric == "cosine":
            ax.axhline(COS_HEALTHY, color="green", ls="--", lw=0.8)
            ax.axhline(COS_CRITICAL, color="red", ls="--", lw=0.8)
        if metric in ("rel_l2", "max_abs") and any(r[metric] > 0 for r in rows if r["part"] in parts):
            ax.set_yscale("log")
        ax.set_ylabel(label)
    for ax in axes[1]:
        ax.set_xlabel("decoder layer")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- plumbing the lab needs
def resolve_models(run_dir: str = "", golden_model: str = "fixture", int4_model: str = "fixture") -> dict:
    """The two model folders and the GSM8K test file: Lab 02's results, else (fixture only) the fixture.

    Returns {"golden", "int4", "test", "source", "note"}. Lab 02 is the one place models are fetched;
    without its results only the embedded fixture can be used, and the note says so.
    """
    from .results import ResultsError
    from .runs import find_lab_results
    try:
        m2 = find_lab_results("02_models", run_dir)["data"]
        return {"golden": m2["models"]["golden"]["path"], "int4": m2["models"]["int4"]["path"],
                "test": (m2.get("gsm8k") or {}).get("test"), "source": m2["models"]["golden"].get("source", ""),
                "note": "model paths from Lab 02's results"}
    except ResultsError as exc:
        if golden_model != "fixture" or int4_model != "fixture":
            raise ResultsError(f"golden_model={golden_model!r}, int4_model={int4_model!r} need Lab 02 to fetch "
                               f"them first ({exc})") from exc
        from .fixture import fixture_paths
        p = fixture_paths()
        return {"golden": str(p["golden"]), "int4": str(p["int4"]), "test": str(p["test"]), "source": "fixture",
                "note": "no Lab 02 results: using the embedded fixture pair directly"}


def gsm8k_questions(test_path: str | None, limit: int | None, offline: bool = True) -> list[str]:
    """GSM8K test questions: from a local jsonl (the fixture's, or Lab 02's), else the hub's openai/gsm8k."""
    from pathlib import Path

    from .gsm_synth import read_jsonl
    if test_path:
        if not Path(test_path).is_file():
            raise FileNotFoundError(f"GSM8K test file {test_path} does not exist: rerun Lab 02.")
        questions = [r["question"] for r in read_jsonl(test_path)]
    elif offline:
        raise ValueError("no local GSM8K test file and offline=True: set offline=False to read openai/gsm8k "
                         "from the hub, or run Lab 02 with the fixture.")
    else:
        from datasets import load_dataset
        questions = list(load_dataset("openai/gsm8k", "main", split="test")["question"])
    return questions[:limit] if limit else questions

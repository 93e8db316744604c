"""Where does precision break? Golden vs Int4 (or golden vs device) at the logits.

Two views of the output (utils.localize goes layer by layer):
- the experiment report's logit check, read at every position of every evaluated prompt, not only at one
  prompt's last token, by the course's one rule (utils.metrics.rule_verdict, the per-layer table's): cosine
  (direction) AND normalized L2 (size), so a fault that scales every logit (cosine 1.000) is seen;
- llama.cpp's KL-divergence statistics over a corpus (what `llama-perplexity --kl-divergence` prints).
Memory: the golden model's logits go to the CPU before the test model is loaded.
"""
from __future__ import annotations

import gc
import math
from typing import Any, Iterable

import torch

from .capture import model_device
from .localize import first_nonfinite, module_verdict
from .metrics import COS_CRITICAL, COS_HEALTHY, rel_l2_at_cosine, rule_verdict  # the rule's one place
PERCENTILES = (("max", 100.0), ("99.9%", 99.9), ("99%", 99.0), ("95%", 95.0), ("90%", 90.0),
               ("median", 50.0), ("10%", 10.0), ("5%", 5.0), ("1%", 1.0), ("min", 0.0))
VERDICT_STATUS = {"healthy": "ok", "degraded": "warn", "critical": "fail", "non-finite": "fail"}
LOGIT_RULE = (f"the verdict is that of the mean cosine and the mean normalized L2 over all positions, by the "
              f"per-layer table's rule: cosine >= {COS_HEALTHY} and normalized L2 <= "
              f"{rel_l2_at_cosine(COS_HEALTHY):.3f} healthy; cosine < {COS_CRITICAL} or normalized L2 > "
              f"{rel_l2_at_cosine(COS_CRITICAL):.3f} critical (suspected SDC); degraded between. A worst position "
              "that reads critical makes a healthy mean read degraded (one position can be SDC); worst and p1 carry "
              "their own verdicts; any NaN/Inf in the logits reads non-finite")


def free() -> None:
    """Collect garbage and return the accelerator's cached memory: call it after `del model`, before
    loading the other model (never two full models on the accelerator at once)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- 1. the report's logit check
@torch.no_grad()
def last_token_logits(model, tokenizer, prompt: str, seed: int = 0) -> torch.Tensor:
    """The report's own setup: fixed seed, one prompt, the logits of its last position (CPU, float32)."""
    torch.manual_seed(seed)
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(model_device(model))
    return model(input_ids=ids, use_cache=False).logits[0, -1].float().cpu()


def _as_positions(x) -> list[torch.Tensor]:
    """A [vocab] vector (one position), a [T, vocab] tensor or a list of them, as a list of [T, vocab]."""
    xs = [x] if isinstance(x, torch.Tensor) else list(x)
    return [t.reshape(1, -1) if t.dim() == 1 else t for t in xs]


def logit_check(golden, test, healthy: float = COS_HEALTHY, critical: float = COS_CRITICAL) -> dict[str, Any]:
    """The report's check at every position: per position cosine, normalized L2, MSE and top-1 of test vs golden.

    golden, test: per prompt [T, vocab] logits (a list), or one [vocab] vector (the report's one reading).
    Returns worst, p1 (the 1 % tail) and mean of cosine and normalized L2, each pair with its verdict by
    utils.metrics.rule_verdict, the overall verdict by LOGIT_RULE, how often the top-1 token changed, and
    NaN/Inf counted (the statistics are then over finite positions).
    """
    gs, ts = _as_positions(golden), _as_positions(test)
    if len(gs) != len(ts) or any(g.shape != t.shape for g, t in zip(gs, ts)):
        raise ValueError(f"logits differ in shape {[tuple(g.shape) for g in gs][:3]} vs "
                         f"{[tuple(t.shape) for t in ts][:3]}: the two models must share a vocabulary "
                         "(same tokenizer) and see the same prompts.")
    cos, rel, mse, changed, bad, where = [], [], [], [], [], []
    for k, (g, t) in enumerate(zip(gs, ts)):
        g, t = g.double(), t.double()
        cos.append(torch.nn.functional.cosine_similarity(t, g, dim=-1))
        err, ref = torch.linalg.vector_norm(t - g, dim=-1), torch.linalg.vector_norm(g, dim=-1)
        rel.append(torch.where(ref > 0, err / ref, torch.where(err == 0, 0.0, math.inf)))
        mse.append(((t - g) ** 2).mean(-1))
        changed.append(t.argmax(-1) != g.argmax(-1))
        bad.append((~torch.isfinite(t)).sum(-1) + (~torch.isfinite(g)).sum(-1))
        where += [(k, p) for p in range(g.shape[0])]
    cos, rel, mse, changed, bad = torch.cat(cos), torch.cat(rel), torch.cat(mse), torch.cat(changed), torch.cat(bad)
    finite = bad == 0
    at = lambda i: f"prompt {where[i][0]}, position {where[i][1]}"  # noqa: E731
    out: dict[str, Any] = {"prompts": len(gs), "positions": int(cos.numel()), "nonfinite": int(bad.sum()),
                           "nonfinite_positions": int((~finite).sum()),
                           "first_nonfinite": at(int((~finite).nonzero()[0])) if not finite.all() else None}
    c, r = cos[finite], rel[finite]
    if c.numel():
        # the worst position by the rule: the lower of its cosine and the cosine its L2 bar belongs to
        by_rule = torch.minimum(c, 1.0 / torch.sqrt(1.0 + r**2))
        out |= {"cosine_worst": float(c.min()), "cosine_p1": float(torch.quantile(c, 0.01)),
                "cosine_mean": float(c.mean()), "rel_l2_worst": float(r.max()),
                "rel_l2_p1": float(torch.quantile(r, 0.99)), "rel_l2_mean": float(r.mean()),
                "worst_at": at(int(torch.nonzero(finite)[int(by_rule.argmin())])),
                "mse_mean": float(mse[finite].mean()), "mse_max": float(mse[finite].max())}
    else:
        out |= {k: float("nan") for k in ("cosine_worst", "cosine_p1", "cosine_mean", "rel_l2_worst", "rel_l2_p1",
                                          "rel_l2_mean", "mse_mean", "mse_max")}
        out["worst_at"] = None
    for stat in ("worst", "p1", "mean"):
        out[f"verdict_{stat}"] = rule_verdict(out[f"cosine_{stat}"], out[f"rel_l2_{stat}"], healthy, critical)
    verdict = out["verdict_mean"]
    if verdict == "healthy" and out["verdict_worst"] == "critical":
        verdict = "degraded"
    out["verdict"] = "non-finite" if out["nonfinite"] else verdict
    out["top1_changed"] = int(changed[finite].sum())
    out["top1_changed_pct"] = 100.0 * out["top1_changed"] / max(int(finite.sum()), 1)
    out["rule"] = LOGIT_RULE
    return out


def _logits_row(layer_rows: list[dict] | None) -> str:
    """The per-layer table's propagated `logits` row read by the same rule: the two must agree on a scaling."""
    row = next((r for r in layer_rows or [] if r.get("part") == "logits" and r.get("mode") == "propagated"), None)
    if row is None:
        return ""
    verdict = module_verdict(row)
    if verdict == "non-finite":
        return f"; per-layer logits row (propagated): {verdict}"
    return (f"; per-layer logits row (propagated): {verdict} (cosine {row['cosine']:.4f}, normalized L2 "
            f"{row['rel_l2']:.3g}, its prompts)")


def logit_check_verdict(check: dict[str, Any], layer_rows: list[dict] | None = None,
                        name: str = "logit check, all positions (report thresholds)") -> dict[str, str]:
    """The lab's verdict row for a logit_check: status, every statistic with its verdict, top-1 changes, and the
    per-layer table's logits row beside it (from layer_rows); non-finite logits named with the count and the
    first module that has them."""
    if check["nonfinite"]:
        first = first_nonfinite(layer_rows or [])
        detail = (f"non-finite: {check['nonfinite']} NaN/Inf logits at {check['nonfinite_positions']} of "
                  f"{check['positions']} positions, first at {check['first_nonfinite']}; first module with "
                  f"NaN/Inf: {first['module'] if first else 'none in the layer comparison'}")
    elif check["positions"] == 1:
        detail = (f"cosine {check['cosine_worst']:.5f}, normalized L2 {check['rel_l2_worst']:.3g}, MSE "
                  f"{check['mse_mean']:.3g}, top-1 {'changed' if check['top1_changed'] else 'same'}: "
                  f"{check['verdict']}")
    else:
        def stat(s: str) -> str:
            return f"{check[f'cosine_{s}']:.4f} / {check[f'rel_l2_{s}']:.3g} ({check[f'verdict_{s}']}"

        detail = (f"{check['positions']} positions of {check['prompts']} prompts, cosine / normalized L2: worst "
                  f"{stat('worst')}, worst position {check['worst_at']}), p1 {stat('p1')}), mean {stat('mean')}); "
                  f"MSE mean {check['mse_mean']:.3g}; top-1 changed at {check['top1_changed']} positions "
                  f"({check['top1_changed_pct']:.1f} %): {check['verdict']}{_logits_row(layer_rows)}. "
                  f"Rule: {check['rule']}")
    return {"check": name, "verdict": VERDICT_STATUS[check["verdict"]], "detail": detail}


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
def corpus_logits(model, ids: list[torch.Tensor], batch_size: int = 8, pad_id: int = 0,
                  progress: bool = False) -> list[torch.Tensor]:
    """Per text, the logits (float32, CPU) at every one of its positions: [T, vocab].

    Right padding with an attention mask; padded positions are dropped before leaving the device.
    One forward per model serves both the logit check (all positions) and the KL statistics.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    dev = model_device(model)
    out: list[torch.Tensor] = []
    batches = list(_batches(ids, batch_size, pad_id))
    if progress:
        from tqdm.auto import tqdm
        batches = tqdm(batches, desc="logits")
    for x, mask in batches:
        logits = model(input_ids=x.to(dev), attention_mask=mask.to(dev), use_cache=False).logits
        for j in range(x.shape[0]):
            out.append(logits[j, : int(mask[j].sum())].float().cpu())
    return out


def kl_token_stats(golden: list[torch.Tensor], test: list[torch.Tensor],
                   ids: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per predicted token: KL(golden || test), same top-1, p(correct) under each, NLL under each.

    golden, test: per text logits or log-probs (log_softmax makes them the same) at its positions;
    the last position of a text predicts no known token and is left out. 'text' and 'pos' say where.
    """
    if not (len(golden) == len(test) == len(ids)):
        raise ValueError(f"{len(golden)} golden, {len(test)} test logit sets, {len(ids)} texts")
    keys = ("kl", "same_top1", "p_golden", "p_test", "nll_golden", "nll_test", "text", "pos")
    cols: dict[str, list[torch.Tensor]] = {k: [] for k in keys}
    for k, (g, t, tok) in enumerate(zip(golden, test, ids)):
        n = min(g.shape[0], tok.numel() - 1)
        g = torch.log_softmax(g[:n].double(), -1)
        t = torch.log_softmax(t[:n].double(), -1)
        target = tok[1: n + 1].long()
        lg, lt = g.gather(-1, target[:, None])[:, 0], t.gather(-1, target[:, None])[:, 0]
        for key, v in zip(keys, ((g.exp() * (g - t)).sum(-1), (g.argmax(-1) == t.argmax(-1)).double(),
                                 lg.exp(), lt.exp(), -lg, -lt, torch.full((n,), k), torch.arange(n))):
            cols[key].append(v)
    return {k: torch.cat(v) for k, v in cols.items()}


def _sem(x: torch.Tensor) -> float:
    return float(x.std(unbiased=True) / math.sqrt(x.numel())) if x.numel() > 1 else float("nan")


def kl_summary(tok: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The statistics `llama-perplexity --kl-divergence` prints, from kl_token_stats' per-token values.

    PPL = exp(mean NLL), its uncertainty by the delta method; the PPL ratio through the mean of the
    per-token log ratio (as llama.cpp does); KL mean ± standard error and percentiles; same-top-1 rate
    ± binomial error; Δp = p_test(correct) - p_golden(correct), mean ± error, RMS and percentiles;
    'nonfinite' counts tokens whose KL is NaN or Inf and 'first_nonfinite' says where the first is.
    """
    n = int(tok["kl"].numel())
    if n == 0:
        raise ValueError("no predicted tokens: the corpus is empty")
    bad = ~torch.isfinite(tok["kl"])
    first = int(bad.nonzero()[0]) if bad.any() else None
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
        "nonfinite": int(bad.sum()),  # tokens whose KL is NaN/Inf: the statistics above are then not numbers
        "first_nonfinite": None if first is None else f"text {int(tok['text'][first])}, token {int(tok['pos'][first])}",
    }


def kl_verdict(kl: dict[str, Any], layer_rows: list[dict] | None = None) -> dict[str, str]:
    """The lab's verdict row for kl_summary: the headline statistics, or non-finite named with the count,
    the first token and the first module that has NaN/Inf (from layer_rows)."""
    if kl["nonfinite"]:
        first = first_nonfinite(layer_rows or [])
        return {"check": "KL statistics", "verdict": "fail",
                "detail": f"non-finite: KL is NaN/Inf at {kl['nonfinite']} of {kl['tokens']} tokens, first at "
                          f"{kl['first_nonfinite']}; first module with NaN/Inf: "
                          f"{first['module'] if first else 'none in the layer comparison'}"}
    return {"check": "KL statistics", "verdict": "info",
            "detail": f"mean KLD {kl['kl_mean']:.4g} ± {kl['kl_mean_err']:.2g}, same top-1 "
                      f"{100 * kl['same_top1']:.1f}%, PPL ratio {kl['ppl_ratio']:.4f} over {kl['tokens']} tokens"}

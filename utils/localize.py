"""Where is the fault? Golden vs test model module by module, through forward hooks.

Two modes: propagated (each model on its own activations: errors add up) and isolated (each test module
fed the golden input of that module, PyTorch Numeric Suite's shadow comparison: its own, local error).
The modules, in execution order: the token embedding, each decoder layer's parts (input_layernorm,
self_attn, post_attention_layernorm, mlp) then the layer, the final norm, the logits.

The rule a module passes (module_verdict, utils.metrics.rule_verdict; Lab 04's logit check reads the same one):
cosine >= 0.99 AND normalized L2 <= sqrt(1/0.99^2 - 1) = 0.142
(SQNR >= 16.9 dB). Cosine sees only direction: a pure change of scale (a norm weight halved) keeps cosine
1.000 while normalized L2 reads 0.5. The L2 bar is the one noise orthogonal to the signal reaches at
the same cosine, so for noise-like error the two agree and only an error along the signal (a scale)
is caught by L2 alone; critical pairs cosine 0.95 with L2 0.329 (SQNR 9.7 dB) the same way. NaN/Inf in
a module's output (or the reference's) is 'non-finite', counted, never averaged.
Memory: golden inputs and outputs are held on the CPU; metrics are accumulated per module and prompt.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from .capture import decoder_layers, forward_capture, hooked_modules, hooks, model_device, module_label
from .metrics import COS_CRITICAL, COS_HEALTHY, MetricAccumulator, rel_l2_at_cosine, rule_verdict

_SEVERITY = {"healthy": 0, "degraded": 1, "critical": 2, "non-finite": 3}


def module_verdict(row: dict[str, Any], healthy: float = COS_HEALTHY, critical: float = COS_CRITICAL) -> str:
    """The rule (utils.metrics.rule_verdict: cosine AND normalized L2) on one module's row; 'non-finite' when
    the output or the reference held NaN/Inf."""
    if row.get("nonfinite") or row.get("ref_nonfinite"):
        return "non-finite"
    return rule_verdict(row["cosine"], row["rel_l2"], healthy, critical)


# ---------------------------------------------------------------- capture and compare
@torch.no_grad()
def golden_layer_capture(model, ids: list[torch.Tensor], parts: bool = True,
                         progress: bool = False) -> list[dict[str, torch.Tensor]]:
    """Per prompt (batch 1, no padding), every hooked module's input and output on the CPU."""
    it = ids
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(ids, desc="golden capture")
    return [forward_capture(model, t, parts=parts, inputs=True, ends=True) for t in it]


def _label(name: str, embed: str) -> tuple[int | None, str]:
    if name == embed:
        return None, "embed"
    try:
        return module_label(name)
    except ValueError:
        return None, "final_norm"


@torch.no_grad()
def compare_layers(model, ids: list[torch.Tensor], golden: list[dict[str, torch.Tensor]], mode: str,
                   parts: bool = True, progress: bool = False) -> list[dict[str, Any]]:
    """Per module of `model` (the test model) against the golden capture, in mode 'propagated' or 'isolated'.

    propagated: the test model runs on its own activations; a module's error includes all upstream error.
    isolated: a pre-hook swaps every hooked module's input for the golden input of that module, so each
    module's error is its own, a norm's included (the embedding's input is the token ids themselves).
    Metrics are accumulated per module over prompts (MetricAccumulator), streaming.
    """
    if mode not in ("propagated", "isolated"):
        raise ValueError(f"mode must be 'propagated' or 'isolated', got {mode!r}")
    if len(ids) != len(golden):
        raise ValueError(f"{len(ids)} prompts but a golden capture of {len(golden)}")
    mods = hooked_modules(model, parts, ends=True)
    missing = [n for n in mods if n not in golden[0]]
    if missing:
        raise ValueError(f"golden capture lacks {missing[:3]}: capture it with golden_layer_capture(parts={parts}).")
    embed = next(iter(mods))
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
            swap = lambda n, x, _g=gold: (None if n == embed else  # noqa: E731
                                          _g[f"{n}:input"].to(device=x.device, dtype=x.dtype))
        with hooks(mods, on_output=on_out, replace_input=swap):
            logits = model(input_ids=tok.reshape(1, -1).to(dev), use_cache=False).logits
        logits_acc.update(logits[0], gold["logits"][0])
    rows = []
    for n in mods:
        layer, part = _label(n, embed)
        rows.append({"module": n, "layer": layer, "part": part, "mode": mode, **acc[n].result()})
    rows.append({"module": "logits", "layer": None, "part": "logits", "mode": mode, **logits_acc.result()})
    return rows


# ---------------------------------------------------------------- reading the rows
def first_bad(rows: list[dict[str, Any]], threshold: float = COS_HEALTHY, part: str | None = None,
              ) -> dict[str, Any] | None:
    """The first module in execution order that fails module_verdict at `threshold` (its cosine bar, the
    L2 bar derived from it); None if all pass. part=None looks at every module (the embedding, the parts,
    the layers, the final norm, the logits); part='layer' only at whole decoder layers."""
    for r in rows:
        if part is not None and r["part"] != part:
            continue
        if module_verdict(r, healthy=threshold) != "healthy":
            return r
    return None


def first_nonfinite(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first module in execution order whose output (or reference) held NaN/Inf; None if none did."""
    return next((r for r in rows if module_verdict(r) == "non-finite"), None)


def worst_module(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The module with the largest error: non-finite first, then the largest normalized L2 (lowest SQNR).

    None when every module is bit-identical to the reference: an error-free module is never 'worst'.
    """
    cands = [r for r in rows if r["part"] != "logits"
             and (module_verdict(r) == "non-finite" or r["rel_l2"] > 0)]
    if not cands:
        return None
    return max(cands, key=lambda r: (module_verdict(r) == "non-finite", r.get("nonfinite", 0),
                                     -math.inf if math.isnan(r["rel_l2"]) else r["rel_l2"]))


def tied_parameters(model: torch.nn.Module) -> list[list[str]]:
    """Groups of parameter names that are one tensor (tie_word_embeddings: embedding and lm_head)."""
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return [g for g in groups.values() if len(g) > 1]


def describe(row: dict[str, Any] | None, ties: list[list[str]] | None = None,
             threshold: float = COS_HEALTHY) -> str:
    """One line for a verdict: the module, its verdict and metrics (or its NaN/Inf count), and, when its
    weight is tied to another module's, that a fault there is a fault in the one shared matrix."""
    if row is None:
        return f"none (every module >= cosine {threshold} and <= normalized L2 {rel_l2_at_cosine(threshold):.3f})"
    verdict = module_verdict(row, healthy=threshold)
    if verdict == "non-finite":
        text = (f"{row['module']}: non-finite ({row.get('nonfinite', 0)} NaN/Inf values in the output, "
                f"{row.get('ref_nonfinite', 0)} in the reference)")
    else:
        text = (f"{row['module']}: {verdict} (cosine {row['cosine']:.4f}, normalized L2 {row['rel_l2']:.3g}, "
                f"SQNR {row['sqnr_db']:.1f} dB)")
    own = f"{row['module']}.weight"
    for group in ties or []:
        if own in group:
            others = ", ".join(n for n in group if n != own)
            text += (f"; {own} is tied to {others} (one tensor): a fault in either is in both and is seen "
                     "first here, at the embedding")
    return text


def layer_verdict(rows: list[dict[str, Any]], mode: str, threshold: float = COS_HEALTHY,
                  ties: list[list[str]] | None = None) -> dict[str, str]:
    """The lab's verdict row for one mode: the first module failing the rule; fail when any module is
    critical or non-finite (the first non-finite module named), warn when degraded."""
    first = first_bad(rows, threshold)
    worst = max((_SEVERITY[module_verdict(r, healthy=threshold)] for r in rows), default=0)
    nf = first_nonfinite(rows)
    detail = describe(first, ties, threshold)
    if nf is not None and nf is not first:
        detail += f"; first non-finite module: {describe(nf, ties, threshold)}"
    return {"check": f"first module failing the rule ({mode})",
            "verdict": "ok" if first is None else ("fail" if worst >= 2 else "warn"), "detail": detail}


# ---------------------------------------------------------------- the self-test and the plot
@torch.no_grad()
def plant_fault(model, layer: int, scale: float = 100.0, block: int = 16, kind: str = "block") -> str:
    """Corrupt `model` in place in decoder layer `layer`; return the module where it must be found.

    kind='block': a block x block corner of mlp.down_proj times `scale` (a bad memory cell, a wrong tile);
    kind='norm-scale': input_layernorm's weight times 0.5, a pure change of scale that cosine cannot see.
    Use a float (not GPTQ) model; reload it afterwards to get the healthy weights back.
    """
    prefix, layers = decoder_layers(model)
    if not 0 <= layer < len(layers):
        raise ValueError(f"plant_fault_layer must be in 0..{len(layers) - 1}, got {layer}")
    if kind == "block":
        layers[layer].mlp.down_proj.weight[:block, :block] *= scale
        return f"{prefix}.{layer}.mlp"
    if kind == "norm-scale":
        layers[layer].input_layernorm.weight.mul_(0.5)
        return f"{prefix}.{layer}.input_layernorm"
    raise ValueError(f"kind must be 'block' or 'norm-scale', got {kind!r}")


def plot_layers(rows: list[dict[str, Any]], title: str = "", threshold: float = COS_HEALTHY):
    """Each metric over depth, one line per part (layer, self_attn, mlp, norms), one figure of four panels.

    Dashed lines: the rule's bars (green: healthy, red: critical) on cosine, normalized L2 and SQNR, so a
    point past a line is exactly a module the verdicts count.
    """
    import matplotlib.pyplot as plt
    if rows and all(r["max_abs"] == 0 for r in rows):    # bit-identical: every panel would be empty
        fig = plt.figure(figsize=(9, 0.5))
        fig.text(0.01, 0.5, f"{title}: all {len(rows)} modules bit-identical (cosine 1, error 0, SQNR inf)",
                 va="center", fontsize=9)
        return fig
    fig, axes = plt.subplots(2, 2, figsize=(9, 5.5), sharex=True)
    parts = [p for p in ("layer", "self_attn", "mlp", "input_layernorm", "post_attention_layernorm")
             if any(r["part"] == p for r in rows)]
    bars = {"cosine": (threshold, COS_CRITICAL),
            "rel_l2": (rel_l2_at_cosine(threshold), rel_l2_at_cosine(COS_CRITICAL)),
            "sqnr_db": tuple(-20 * math.log10(rel_l2_at_cosine(c)) for c in (threshold, COS_CRITICAL))}
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
        for y, color in zip(bars.get(metric, ()), ("green", "red")):
            ax.axhline(y, color=color, ls="--", lw=0.8)
        if metric in ("rel_l2", "max_abs") and any(r[metric] > 0 for r in rows if r["part"] in parts):
            ax.set_yscale("log")
        ax.set_ylabel(label)
    for ax in axes[1]:
        ax.set_xlabel("decoder layer")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig

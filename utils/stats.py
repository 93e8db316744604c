"""Statistics for comparing two models on the same benchmark problems.

Why paired: the golden and the Int4 model answer the *same* GSM8K problems, so the question
"did quantization change anything?" is about the problems whose outcome flipped, not about two
independent scores. McNemar's exact test looks only at the flips; the paired-difference interval
uses the per-problem differences, which is much tighter than two independent error bars.
Hand-written (a few lines each) because they are the lesson; stderr matches lm-eval's own.
"""
from __future__ import annotations

import math
from statistics import NormalDist
from typing import Sequence

# The experiment report's rule of thumb for the relative accuracy drop of an Int4 model.
DROP_EXPECTED = 0.05      # < 5 %: expected for GPTQ-Int4
DROP_SUSPECT = 0.10       # > 10 %: suspect the kernels; in between: investigate
VERDICT_CAVEAT = ("caveat: published GPTQ-Int4 losses on maths benchmarks alone can exceed 10 %, so a "
                  "large drop is a reason to look at the kernels (Lab 04), not proof that they are wrong")


def _as_outcomes(values: Sequence, name: str) -> list[int]:
    """0/1 per problem; refuses anything else (a NaN or a 0.5 is a bug upstream, not a score)."""
    out = []
    for v in values:
        f = float(v)
        if f not in (0.0, 1.0):
            raise ValueError(f"{name} must hold 0/1 outcomes per problem, got {v!r}")
        out.append(int(f))
    if not out:
        raise ValueError(f"{name} is empty: no problems were scored")
    return out


def _paired(a: Sequence, b: Sequence) -> tuple[list[int], list[int]]:
    a, b = _as_outcomes(a, "a"), _as_outcomes(b, "b")
    if len(a) != len(b):
        raise ValueError(f"paired outcomes must have the same length, got {len(a)} and {len(b)}")
    return a, b


def accuracy_stderr(correct: Sequence) -> float:
    """Standard error of a mean of 0/1 outcomes, sample std (n-1) / sqrt(n): lm-eval's mean_stderr."""
    x = _as_outcomes(correct, "correct")
    n = len(x)
    if n < 2:
        return math.nan
    p = sum(x) / n
    var = sum((v - p) ** 2 for v in x) / (n - 1)
    return math.sqrt(var / n)


def contingency(a: Sequence, b: Sequence) -> dict[str, int]:
    """The 2x2 table of paired outcomes: both right, only a right, only b right, both wrong."""
    a, b = _paired(a, b)
    t = {"both_right": 0, "a_only": 0, "b_only": 0, "both_wrong": 0}
    for x, y in zip(a, b):
        t["both_right" if x and y else "a_only" if x else "b_only" if y else "both_wrong"] += 1
    return t


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """Two-sided exact McNemar p-value: under H0 each flip goes either way with probability 1/2.

    p = min(1, 2 * P(X <= min(b, c))), X ~ Binomial(b + c, 1/2). No flips at all gives p = 1.
    """
    if a_only < 0 or b_only < 0:
        raise ValueError(f"flip counts must be >= 0, got {a_only}, {b_only}")
    n, k = a_only + b_only, min(a_only, b_only)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2.0 * tail)


def paired_difference_ci(a: Sequence, b: Sequence, level: float = 0.95) -> dict[str, float]:
    """mean(a) - mean(b) for paired 0/1 outcomes, with Agresti and Min's (2005) interval: the Wald
    interval of the paired difference after adding 1/2 to each cell of the 2x2 table.

    Why not the plain Wald interval: with no flips (or very few) its standard error is 0 and it
    claims certainty, [0, 0]; the adjusted one stays honest (about +-3.8 points at 50 problems and no
    flips) and has close to nominal coverage (Agresti & Min, Stat. Med. 24:729). "diff" is the observed
    difference; the interval is centred on the adjusted one."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    t = contingency(a, b)
    n, a_only, b_only = sum(t.values()), t["a_only"], t["b_only"]
    n_adj, d_adj = n + 2, (a_only - b_only) / (n + 2)          # 1/2 added to each of the four cells
    se = math.sqrt(((a_only + b_only + 1) / n_adj - d_adj ** 2) / n_adj)
    z = NormalDist().inv_cdf(0.5 + level / 2)
    return {"diff": (a_only - b_only) / n, "se": se, "low": max(-1.0, d_adj - z * se),
            "high": min(1.0, d_adj + z * se), "level": level, "n": n, "method": "Agresti-Min"}


def drop_verdict(golden_acc: float, int4_acc: float) -> dict:
    """The report's rule on the relative drop (golden - int4) / golden, with its caveat.

    Returns {"drop_abs", "drop_rel", "label", "verdict", "detail"}; verdict is ok/warn/fail/info
    for results.json. A golden accuracy of 0 leaves the relative drop undefined: label "undefined".
    """
    for name, v in (("golden_acc", golden_acc), ("int4_acc", int4_acc)):
        if not (isinstance(v, (int, float)) and 0.0 <= v <= 1.0):
            raise ValueError(f"{name} must be an accuracy in [0, 1], got {v!r}")
    drop_abs = golden_acc - int4_acc
    if golden_acc == 0:
        return {"drop_abs": drop_abs, "drop_rel": None, "label": "undefined", "verdict": "info",
                "detail": "the golden model scored 0: a relative drop is undefined; nothing to compare"}
    drop_rel = drop_abs / golden_acc
    if drop_rel < DROP_EXPECTED:
        label, verdict = "expected", "ok"
    elif drop_rel <= DROP_SUSPECT:
        label, verdict = "investigate", "warn"
    else:
        label, verdict = "suspect kernels", "fail"
    detail = (f"relative drop {100 * drop_rel:.1f}% (rule: <5% expected, 5-10% investigate, "
              f">10% suspect the kernels): {label}; {VERDICT_CAVEAT}")
    return {"drop_abs": drop_abs, "drop_rel": drop_rel, "label": label, "verdict": verdict, "detail": detail}


def paired_analysis(golden: Sequence, int4: Sequence, level: float = 0.95) -> dict:
    """Everything the lab reports for one filter: accuracies, stderrs, drop, verdict, 2x2, McNemar, CI."""
    g, q = _paired(golden, int4)
    t = contingency(g, q)
    table = {"both_right": t["both_right"], "golden_only": t["a_only"], "int4_only": t["b_only"],
             "both_wrong": t["both_wrong"]}
    acc_g, acc_q = sum(g) / len(g), sum(q) / len(q)
    return {"n": len(g), "golden_acc": acc_g, "int4_acc": acc_q,
            "golden_stderr": accuracy_stderr(g), "int4_stderr": accuracy_stderr(q),
            **{k: v for k, v in drop_verdict(acc_g, acc_q).items()},
            "table": table, "mcnemar_p": mcnemar_exact(t["a_only"], t["b_only"]),
            "diff_ci": paired_difference_ci(g, q, level)}

"""Paired statistics: hand-computed values, edge cases, bad input."""
import math

import pytest

from utils import stats


def test_accuracy_stderr_matches_hand_value_and_lm_eval():
    x = [1, 1, 1, 0]  # p = 0.75, sample var = 0.25, stderr = sqrt(0.25/4) = 0.25
    assert stats.accuracy_stderr(x) == pytest.approx(0.25)
    from lm_eval.api.metrics import mean_stderr
    y = [1, 0, 0, 1, 1, 1, 0, 1, 1, 1]
    assert stats.accuracy_stderr(y) == pytest.approx(mean_stderr(y))
    assert math.isnan(stats.accuracy_stderr([1]))


def test_contingency_counts_each_cell():
    a = [1, 1, 0, 0, 1]
    b = [1, 0, 1, 0, 0]
    assert stats.contingency(a, b) == {"both_right": 1, "a_only": 2, "b_only": 1, "both_wrong": 1}


def test_mcnemar_exact_hand_values():
    # b=0, c=5: 2 * (1/32) = 0.0625
    assert stats.mcnemar_exact(0, 5) == pytest.approx(0.0625)
    # b=1, c=9: 2 * (1 + 10) / 1024
    assert stats.mcnemar_exact(1, 9) == pytest.approx(22 / 1024)
    assert stats.mcnemar_exact(9, 1) == stats.mcnemar_exact(1, 9)  # symmetric
    assert stats.mcnemar_exact(3, 3) == 1.0                          # capped at 1
    assert stats.mcnemar_exact(0, 0) == 1.0                          # no flips, no evidence
    with pytest.raises(ValueError, match="flip counts"):
        stats.mcnemar_exact(-1, 2)


def test_paired_ci_is_tighter_than_independent_when_outcomes_agree():
    a = [1] * 80 + [0] * 20
    b = [1] * 78 + [0] * 22  # two flips, both against b
    ci = stats.paired_difference_ci(a, b)
    assert ci["diff"] == pytest.approx(0.02)
    # Agresti-Min by hand: cells + 1/2, so 2.5 and 0.5 flips over 102 pairs
    d = (2.5 - 0.5) / 102
    se = math.sqrt(((2.5 + 0.5) / 102 - d**2) / 102)
    assert ci["se"] == pytest.approx(se)
    assert ci["low"] == pytest.approx(d - 1.959964 * se, abs=1e-6)
    assert ci["high"] == pytest.approx(d + 1.959964 * se, abs=1e-6)
    independent = math.hypot(stats.accuracy_stderr(a), stats.accuracy_stderr(b))
    assert ci["se"] < independent / 2
    with pytest.raises(ValueError, match="level"):
        stats.paired_difference_ci(a, b, level=1.5)


def test_paired_ci_does_not_collapse_without_flips():
    """The plain Wald interval is [0, 0] when no problem flips: false certainty. Agresti-Min is not."""
    same = [1] * 45 + [0] * 5
    ci = stats.paired_difference_ci(same, same)
    assert ci["diff"] == 0.0
    assert ci["se"] == pytest.approx(1 / 52)                    # sqrt((1/52) / 52)
    assert ci["low"] == pytest.approx(-1.959964 / 52, abs=1e-6) and ci["high"] == pytest.approx(1.959964 / 52, abs=1e-6)
    all_flip = stats.paired_difference_ci([1] * 10, [0] * 10)   # stays inside [-1, 1]
    assert all_flip["diff"] == 1.0 and -1.0 <= all_flip["low"] < 1.0 and all_flip["high"] <= 1.0


def test_drop_verdict_rule_boundaries_and_caveat():
    assert stats.drop_verdict(0.80, 0.78)["label"] == "expected"           # 2.5 %
    assert stats.drop_verdict(0.80, 0.82)["label"] == "expected"           # int4 better
    mid = stats.drop_verdict(0.80, 0.74)                                     # 7.5 %
    assert (mid["label"], mid["verdict"]) == ("investigate", "warn")
    bad = stats.drop_verdict(0.80, 0.60)                                     # 25 %
    assert (bad["label"], bad["verdict"]) == ("suspect kernels", "fail")
    assert bad["drop_abs"] == pytest.approx(0.2) and bad["drop_rel"] == pytest.approx(0.25)
    assert "exceed 10 %" in bad["detail"]
    zero = stats.drop_verdict(0.0, 0.0)
    assert zero["label"] == "undefined" and zero["drop_rel"] is None
    with pytest.raises(ValueError, match="golden_acc"):
        stats.drop_verdict(float("nan"), 0.5)


def test_paired_analysis_and_bad_outcomes():
    g = [1, 1, 1, 1, 0, 0, 1, 1]
    q = [1, 0, 1, 0, 0, 1, 0, 1]
    res = stats.paired_analysis(g, q)
    assert res["table"] == {"both_right": 3, "golden_only": 3, "int4_only": 1, "both_wrong": 1}
    assert res["golden_acc"] == 0.75 and res["int4_acc"] == 0.5
    assert res["mcnemar_p"] == pytest.approx(2 * 5 / 16)
    assert res["label"] == "suspect kernels"
    with pytest.raises(ValueError, match="same length"):
        stats.paired_analysis([1, 0], [1])
    with pytest.raises(ValueError, match="0/1"):
        stats.paired_analysis([1, 0.5], [1, 0])
    with pytest.raises(ValueError, match="empty"):
        stats.paired_analysis([], [])

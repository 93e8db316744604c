"""The report's absolute anchors for Qwen2.5-7B-Instruct on GSM8K, as checks Lab 03 can apply.

The original experiment report gives the golden model's 5-shot GSM8K score (flexible-extract,
78.5 ± 1.1 %) and a rule for its GPTQ-Int4 twin: below 74.0 % the quantized operators are wrong (a
kernel or unpacking bug, not the expected cost of 4-bit weights). Both numbers mean something only for
that model, 5-shot, on all 1,319 test problems; for anything else the checks say they do not apply.
"""
from __future__ import annotations

import math

REPORT_MODEL = "Qwen2.5-7B-Instruct"
REPORT_FILTER = "flexible-extract"
REPORT_FEWSHOT = 5
REPORT_PROBLEMS = 1319
REPORT_GOLDEN_ACC, REPORT_GOLDEN_ERR = 0.785, 0.011
INT4_FLOOR = 0.740
CHECK = f"report anchors ({REPORT_MODEL}, GSM8K {REPORT_FEWSHOT}-shot {REPORT_FILTER})"


def is_report_model(golden_id: str) -> bool:
    """True for Qwen/Qwen2.5-7B-Instruct as a hub id or as a folder of that name (any case)."""
    name = str(golden_id or "").rstrip("/").replace("\\", "/").split("/")[-1]
    return name.lower() == REPORT_MODEL.lower()


def report_anchor_checks(golden_id: str, golden: dict, int4: dict, num_fewshot: int,
                         int4_kernel: str | None = None) -> list[dict]:
    """Verdict rows (check, verdict, detail). golden / int4: utils.evaluation.run_gsm8k results."""
    if not is_report_model(golden_id):
        return [{"check": CHECK, "verdict": "info",
                 "detail": f"does not apply: the golden model is {golden_id}, the anchors are for {REPORT_MODEL}"}]
    n = int(golden["n"])
    if int(num_fewshot) != REPORT_FEWSHOT or n != REPORT_PROBLEMS:
        return [{"check": CHECK, "verdict": "info",
                 "detail": f"does not apply: the anchors are for {REPORT_FEWSHOT}-shot on all {REPORT_PROBLEMS} "
                           f"test problems; this run is {num_fewshot}-shot on {n}"}]
    g = golden["accuracy"][REPORT_FILTER]
    q = int4["accuracy"][REPORT_FILTER]["acc"]
    band = 2 * math.hypot(REPORT_GOLDEN_ERR, g["stderr"])           # two combined standard errors
    off = g["acc"] - REPORT_GOLDEN_ACC
    golden_row = {"check": f"golden vs the report ({100 * REPORT_GOLDEN_ACC:.1f} ± {100 * REPORT_GOLDEN_ERR:.1f} %)",
                  "verdict": "ok" if abs(off) <= band else "warn",
                  "detail": f"{100 * g['acc']:.2f} ± {100 * g['stderr']:.2f} %, {100 * off:+.2f} points from the "
                            f"report (band ± {100 * band:.2f})" + ("" if abs(off) <= band else
                            ": not this setup's number; check the prompt, dtype, revision and lm-eval version")}
    kernel = f" (GPTQ kernel {int4_kernel})" if int4_kernel else ""
    int4_row = {"check": f"Int4 floor ({100 * INT4_FLOOR:.1f} %, the report's rule)",
                "verdict": "fail" if q < INT4_FLOOR else "ok",
                "detail": f"Int4{kernel} {100 * q:.2f} %" + (
                    f" < {100 * INT4_FLOOR:.1f} %: by the report's rule the quantized operators are wrong"
                    if q < INT4_FLOOR else f" >= {100 * INT4_FLOOR:.1f} %")}
    return [golden_row, int4_row]

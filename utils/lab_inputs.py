"""What a lab reads from earlier labs: the two model folders (Lab 02's results, else the fixture) and the
GSM8K test questions. Lab plumbing, kept apart from the measuring code in divergence and evaluation.
"""
from __future__ import annotations

from pathlib import Path


def resolve_models(run_dir: str = "", golden_model: str = "fixture", int4_model: str = "fixture") -> dict:
    """The two model folders and the GSM8K test file: Lab 02's results, else (fixture only) the fixture.

    Returns {"golden", "int4", "test", "source", "note", "used", "fallback"}: `used` names the models
    actually used (Lab 02's record, a fallback to the fixture first and loud), `fallback` whether any fell
    back. Lab 02 is the one place models are fetched; without its results only the embedded fixture can
    be used, and the note says so.
    """
    from .fetch import fallbacks, models_summary
    from .results import ResultsError
    from .runs import find_lab_results
    try:
        m2 = find_lab_results("02_models", run_dir)["data"]
        return {"golden": m2["models"]["golden"]["path"], "int4": m2["models"]["int4"]["path"],
                "test": (m2.get("gsm8k") or {}).get("test"), "source": m2["models"]["golden"].get("source", ""),
                "note": "model paths from Lab 02's results", "used": models_summary(m2["models"]),
                "fallback": bool(fallbacks(m2["models"]))}
    except ResultsError as exc:
        if golden_model != "fixture" or int4_model != "fixture":
            raise ResultsError(f"golden_model={golden_model!r}, int4_model={int4_model!r} need Lab 02 to fetch "
                               f"them first ({exc})") from exc
        from .fetch import resolve_model
        from .fixture import fixture_paths
        models = {role: resolve_model("fixture", role, offline=True) for role in ("golden", "int4")}
        return {"golden": models["golden"]["path"], "int4": models["int4"]["path"],
                "test": str(fixture_paths()["test"]), "source": "fixture",
                "note": "no Lab 02 results: using the embedded fixture pair directly",
                "used": models_summary(models), "fallback": False}


def gsm8k_questions(test_path: str | None, limit: int | None, offline: bool = True) -> list[str]:
    """GSM8K test questions: from a local jsonl (the fixture's, or Lab 02's), else the hub's openai/gsm8k."""
    from .gsm_synth import read_gsm8k
    if test_path:
        if not Path(test_path).is_file():
            raise FileNotFoundError(f"GSM8K test file {test_path} does not exist: rerun Lab 02.")
        questions = [r["question"] for r in read_gsm8k(test_path)]
    elif offline:
        raise ValueError("no local GSM8K test file and offline=True: set offline=False to read openai/gsm8k "
                         "from the hub, or run Lab 02 with the fixture.")
    else:
        from datasets import load_dataset
        questions = list(load_dataset("openai/gsm8k", "main", split="test")["question"])
    return questions[:limit] if limit else questions


def check_whole_model(lab03: dict | None) -> None:
    """Lab 04 hooks every module of one model in one process on one device; a model Lab 03 had to shard over
    several cards (shard = True) does not fit one, so Lab 04 stops here, before loading it."""
    beyond = ((lab03 or {}).get("data") or {}).get("beyond_one_gpu") or {}
    if beyond.get("shard"):
        raise RuntimeError("Lab 03 ran with shard = True: the golden model was split over several GPUs because it "
                           "does not fit one. Lab 04 captures every module of the whole model in one process on one "
                           "device, so it cannot run here; run it on a machine whose GPU holds the model (a data-"
                           "parallel Lab 03, gpus = N, is fine: each process there held the whole model)")

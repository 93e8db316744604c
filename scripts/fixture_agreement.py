"""Does the course's Int4 kernel generate what GPTQModel's reference kernel generates? On the trained fixture.

    python scripts/fixture_agreement.py --out DIR [--limit 1319] [--batch 16] [--decode eager|compiled]

The fixture's Int4 model runs lm-eval's gsm8k (Lab 03's own code, utils.evaluation.run_gsm8k) twice on a
GPU: once with gptq_backend 'gptq_torch' (GPTQModel's plain torch kernel, the reference) and once with
'quantlab' (the course's W4A16 kernel); the two runs are compared sample for sample (utils.eval_parallel.compare:
differing generations and scores, McNemar). For each differing generation: the first differing token, and
why, from one forward pass of each model on the prompt plus the common prefix: the two kernels' logits
at that position, their largest difference, and the reference's gap between its top two tokens (a token
flips where that gap is smaller than the kernels' difference). Writes fixture_agreement.{md,json} into --out.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-qwen2-gsm"
BACKENDS = ("gptq_torch", "quantlab")


def prompts(out_dir: Path, run: dict) -> dict[int, str]:
    """doc_id -> the prompt lm-eval sent, from its per-sample log."""
    out = {}
    for rel in run["lm_eval_files"]:
        if "samples" in rel and rel.endswith(".jsonl"):
            for line in (out_dir / rel).read_text().splitlines():
                s = json.loads(line)
                args = s["arguments"]
                first = args[0] if isinstance(args, list) else next(iter(args.values()))
                ctx = first[0] if isinstance(first, (list, tuple)) else next(iter(first.values()))
                out[s["doc_id"]] = ctx
    return out


def first_difference(models: dict, tok, ctx: str, gen_a: str, gen_b: str) -> dict:
    """Where two generations part, and the two kernels' logits there."""
    import torch

    a, b = tok.encode(gen_a, add_special_tokens=False), tok.encode(gen_b, add_special_tokens=False)
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    ids = torch.tensor([tok.encode(ctx, add_special_tokens=False) + a[:i]], device="cuda")
    with torch.no_grad():
        logits = {k: m(ids).logits[0, -1].float() for k, m in models.items()}
    ref, ours = logits["gptq_torch"], logits["quantlab"]
    top2 = torch.topk(ref, 2)
    return {"token_index": i, "gptq_torch_token": tok.decode([a[i]]) if i < len(a) else "<end>",
            "quantlab_token": tok.decode([b[i]]) if i < len(b) else "<end>",
            "reference_top2_gap": float(top2.values[0] - top2.values[1]),
            "max_logit_difference": float((ref - ours).abs().max()),
            "relative_l2": float((ref - ours).norm() / ref.norm())}


def fused_calls() -> dict[str, int]:
    """Calls of the fused W4A16 kernel since kernels.cache was last reset, by rows and kind ("M=16" or
    "M=16, gated": gate and up in one launch), from its launch plans."""
    from utils.kernels import cache
    from utils.kernels.w4a16_launch import W4A16Plan
    calls: dict[tuple[int, bool], int] = {}
    for plan in cache.gemv_plans.values():
        if isinstance(plan, W4A16Plan) and plan.calls:
            calls[plan.M, plan.gated] = calls.get((plan.M, plan.gated), 0) + plan.calls
    return {f"M={M}{', gated' if gated else ''}": n for (M, gated), n in sorted(calls.items())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--limit", type=int, default=None, help="first N test problems (default: all 1,319)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--decode", default="eager", choices=("eager", "compiled"))
    args = ap.parse_args(argv)
    import torch

    from utils import evaluation as ev, kernels
    from utils.eval_parallel import compare
    from utils.eval_settings import EvalSettings
    from utils.models import load_model, load_tokenizer
    from utils.results import atomic_write_text

    if not torch.cuda.is_available():
        raise SystemExit("fixture_agreement: torch sees no GPU here; the quantlab kernel is compared on a GPU")
    if (args.out / "fixture_agreement.json").exists():
        raise SystemExit(f"--out: {args.out} already holds fixture_agreement.json; pass a new folder")
    args.out.mkdir(parents=True, exist_ok=True)
    model, data = FIXTURE / "gptq-int4", ev.data_files_from_folder(FIXTURE / "data")
    runs = {}
    for backend in BACKENDS:
        kernels.cache.reset()
        s = EvalSettings(device="cuda", batch_size=args.batch, limit=args.limit, gptq_backend=backend,
                         decode=args.decode, max_length=2048 if args.decode == "compiled" else None)
        t0 = time.perf_counter()
        runs[backend] = ev.run_gsm8k(str(model), args.out, label=f"int4-{backend}", data_files=data, settings=s)
        print(f"{backend}: {time.perf_counter() - t0:.1f} s, strict-match "
              f"{runs[backend]['accuracy']['strict-match']['acc']:.4f}", flush=True)
    fused = fused_calls()                          # the quantlab run's, the last one
    c = compare(runs["gptq_torch"], runs["quantlab"])
    tok = load_tokenizer(str(model))
    models = {b: load_model(model, "cuda", backend=b) for b in BACKENDS}
    ctx = prompts(args.out, runs["gptq_torch"])
    differing = []
    for x, y in zip(runs["gptq_torch"]["problems"], runs["quantlab"]["problems"]):
        if x["generation"] != y["generation"]:
            differing.append({"doc_id": x["doc_id"], **first_difference(models, tok, ctx[x["doc_id"]],
                                                                          x["generation"], y["generation"])})
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "command": "python scripts/fixture_agreement.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "compare": c, "fused_calls": fused, "differing": differing}
    md = [f"# The trained fixture's Int4 model: quantlab against gptq_torch on {result['device']} ({result['date']})", "",
          f"torch {result['torch']}. Command: `{result['command']}`. lm-eval gsm8k, batch {args.batch}, decode {args.decode}.",
          "", f"{c['n']} problems: {c['differing_generations']} generations differ, "
          f"{c['differing_scores_strict-match']} strict-match scores differ (McNemar p = {c['mcnemar_p']:.3g}); "
          f"accuracy {100 * c['acc_one']:.2f} % (gptq_torch) and {100 * c['acc_many']:.2f} % (quantlab).", "",
          "Calls of the fused W4A16 kernel in the quantlab run, by rows (a decode step's batch; above 16 rows, and "
          "in a prompt, a call dequantizes and calls cuBLAS instead): "
          + (", ".join(f"{k}: {v}" for k, v in fused.items()) or "none") + ".", ""]
    if differing:
        md += ["| doc | first differing token (index) | gptq_torch | quantlab | reference's top-2 gap | max logit "
               "difference | relative L2 of the logits |", "|" + "---|" * 7]
        md += [f"| {d['doc_id']} | {d['token_index']} | {d['gptq_torch_token']!r} | {d['quantlab_token']!r} "
               f"| {d['reference_top2_gap']:.4f} | {d['max_logit_difference']:.4f} | {d['relative_l2']:.2e} |"
               for d in differing]
    atomic_write_text(args.out / "fixture_agreement.json", json.dumps(result, indent=1))
    atomic_write_text(args.out / "fixture_agreement.md", "\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

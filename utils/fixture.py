"""The embedded fixture: the course's own small golden model and its GPTQ-Int4 twin.

Why: without a model hub the course must still compare a golden model with a quantized one that
can lose something. A random-weight model scores 0 on GSM8K and teaches nothing, so the project
trains its own tiny `Qwen2ForCausalLM` (the architecture class of Qwen2.5) on GSM8K-format problems
(`utils.gsm_synth`), then quantizes it with GPTQModel using Qwen's published GPTQ-Int4 settings.
Both sit in the layout of a modelscope snapshot, so every lab just receives two paths.

Remake everything with `python scripts/make_fixture.py all` (training wants a GPU: about two minutes
on an H100; see that script). The committed files are the default, so no one needs to retrain.
"""
from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

from . import generation, gsm_synth

REPO = Path(__file__).resolve().parent.parent
FIXTURE_DIR = REPO / "fixtures" / "tiny-qwen2-gsm"
EOS = "<|endoftext|>"
N_TRAIN, N_TEST = 7473, 1319          # the sizes of GSM8K's own splits

# The model (hidden 256, 6 layers, 4 heads / 2 KV heads, intermediate 768): every linear layer's
# input width (256 or 768) is a multiple of GPTQ's group size 128, so no layer needs a fallback.
MODEL_SHAPE = dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=768, max_position_embeddings=2048, rope_theta=10000.0,
                   tie_word_embeddings=True)
# Qwen's published GPTQ-Int4 settings (Qwen2.5-*-GPTQ-Int4 quantize_config.json), damp 0.01.
GPTQ_SETTINGS = dict(bits=4, group_size=128, sym=True, desc_act=False, damp_percent=0.01)


def fixture_paths(root: str | Path | None = None) -> dict[str, Path]:
    """The fixture pair and its data: {"golden", "int4", "train", "test"}."""
    root = Path(root) if root else FIXTURE_DIR
    return {"golden": root / "bf16", "int4": root / "gptq-int4",
            "train": root / "data" / "train.jsonl", "test": root / "data" / "test.jsonl"}


def make_data(root: str | Path | None = None) -> dict[str, Path]:
    """Write the train and held-out test splits: separate seeds, disjoint problems (gsm_synth.split_of)."""
    paths = fixture_paths(root)
    test = gsm_synth.generate_split(N_TEST, gsm_synth.TEST_SEED, split="test")
    train = gsm_synth.generate_split(N_TRAIN, gsm_synth.TRAIN_SEED, split="train")
    paths["test"].parent.mkdir(parents=True, exist_ok=True)
    gsm_synth.write_gsm8k(train, paths["train"])
    gsm_synth.write_gsm8k(test, paths["test"])
    return paths


def _corpus(n: int, seed: int) -> list[str]:
    gen = gsm_synth.iter_problems(seed)
    return [gsm_synth.render_example(next(gen)) for _ in range(n)]


def build_tokenizer(vocab_size: int = 512, seed: int = gsm_synth.TRAIN_SEED):
    """A byte-level BPE tokenizer (any text round-trips, real GSM8K included) with single-digit tokens.

    Digits are split one by one, as Qwen2's tokenizer does, so that arithmetic is learnable.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(20000, seed) + ["\n\n".join(_corpus(50, seed + 1))], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS,
                                   model_max_length=MODEL_SHAPE["max_position_embeddings"])


def model_config(tokenizer):
    from transformers import Qwen2Config

    eos = tokenizer.convert_tokens_to_ids(EOS)
    return Qwen2Config(vocab_size=len(tokenizer), bos_token_id=eos, eos_token_id=eos, pad_token_id=eos,
                       torch_dtype="bfloat16", **MODEL_SHAPE)


def packed_texts(problems, n_texts: int, per_text: int) -> list[str]:
    """Few-shot-shaped training text: solved problems joined by lm-eval's few-shot delimiter."""
    return ["\n\n".join(gsm_synth.render_example(next(problems)) for _ in range(per_text))
            for _ in range(n_texts)]


def train(out_dir: str | Path, steps: int = 2000, batch: int = 48, seq_len: int = 1024, lr: float = 1e-3,
          warmup: int = 200, device: str = "cuda", seed: int = 0, log_every: int = 100,
          root: str | Path | None = None) -> dict:
    """Train the golden fixture from scratch; save it (bf16) with its tokenizer into out_dir."""
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    paths = fixture_paths(root)
    test_questions = [r["question"] for r in gsm_synth.read_gsm8k(paths["test"])]
    torch.manual_seed(seed)
    random.seed(seed)
    tokenizer = build_tokenizer()
    model = Qwen2ForCausalLM(model_config(tokenizer)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (
        1 + math.cos(math.pi * min(1.0, s / steps))))
    problems = gsm_synth.iter_problems(gsm_synth.TRAIN_SEED, exclude=test_questions, split="train")
    log, t0 = [], time.time()
    model.train()
    for step in range(steps):
        enc = tokenizer(packed_texts(problems, batch, 14), truncation=True, max_length=seq_len,
                        padding="max_length", return_tensors="pt").to(device)
        labels = enc.input_ids.masked_fill(enc.attention_mask == 0, -100)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
            loss = model(**enc, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step(), sched.step(), opt.zero_grad(set_to_none=True)
        if step % log_every == 0 or step == steps - 1:
            log.append({"step": step, "loss": round(loss.item(), 4), "seconds": round(time.time() - t0, 1)})
            print(log[-1], flush=True)
    model = model.to(torch.bfloat16).eval()
    model.generation_config = GenerationConfig(bos_token_id=model.config.bos_token_id,
                                               eos_token_id=model.config.eos_token_id,
                                               pad_token_id=model.config.pad_token_id, do_sample=False)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {"log": log, "seconds": round(time.time() - t0, 1), "parameters": model.num_parameters()}


def quick_accuracy(model, tokenizer, records: list[dict], shots: list[dict], device: str,
                   batch: int = 64, max_new_tokens: int = 96) -> float:
    """A training-time check (greedy, 5-shot, strict '#### N'); the official number is lm-eval's (Lab 03)."""
    import torch

    prefix = "\n\n".join(gsm_synth.render_example(s) for s in shots) + "\n\n"
    tokenizer.padding_side = "left"
    right = 0
    for i in range(0, len(records), batch):
        chunk = records[i:i + batch]
        enc = tokenizer([prefix + generation.prompt(r["question"]) for r in chunk],
                        return_tensors="pt", padding=True).to(device)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        for r, seq in zip(chunk, tokenizer.batch_decode(out[:, enc.input_ids.shape[1]:])):
            right += generation.strict_answer(seq.split("Question:")[0]) == gsm_synth.final_answer(r["answer"])
    return right / len(records)


def quantize(golden: str | Path, out_dir: str | Path, n_calibration: int = 256,
             root: str | Path | None = None) -> Path:
    """The GPTQ-Int4 twin, made with GPTQModel, calibrated on train-split problems.

    On a CPU with few cores GPTQModel needs GPTQMODEL_CPU_WORKERS (2 worked on 2 cores).
    """
    import os

    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")
    from gptqmodel import GPTQModel, QuantizeConfig

    train = gsm_synth.read_gsm8k(fixture_paths(root)["train"])[:n_calibration]
    calibration = [gsm_synth.render_example(r) for r in train]
    model = GPTQModel.load(str(golden), QuantizeConfig(**GPTQ_SETTINGS))
    model.quantize(calibration, batch_size=16)
    model.save(str(out_dir))
    return Path(out_dir)


# ---------------------------------------------------------------- the measured accuracy, in one place
ACCURACY = FIXTURE_DIR / "accuracy.json"
MODELS = ("golden", "int4")


def data_digest(root: str | Path | None = None) -> dict[str, str]:
    """sha256 (first 16 hex) of train.jsonl and test.jsonl: which problems a measurement used."""
    import hashlib

    paths = fixture_paths(root)
    return {s: hashlib.sha256(paths[s].read_bytes()).hexdigest()[:16] for s in ("train", "test")}


def record_accuracy(key: str, run: dict, command: str, machine: str, root: str | Path | None = None,
                    path: str | Path | None = None) -> Path:
    """Keep one fixture model's lm-eval result (utils.evaluation.run_gsm8k) in accuracy.json, with the
    weights and data it was measured on, so that a stale figure is detected rather than quoted."""
    from datetime import date

    from .capture import weights_digest
    from .results import atomic_write_json

    if key not in MODELS:
        raise ValueError(f"model {key!r}: the fixture's models are {MODELS}")
    if run["settings"]["limit"] is not None or run["n"] != N_TEST:
        raise ValueError(f"only a run over all {N_TEST} held-out problems is recorded; this one has {run['n']}")
    path = Path(path) if path else ACCURACY
    record = json.loads(path.read_text()) if path.is_file() else {}
    if record.get("data") != data_digest(root):
        record = {}                              # other problems: the other model's figure is stale too
    record["data"] = data_digest(root)
    record.setdefault("models", {})[key] = {
        "revision": weights_digest(fixture_paths(root)[key]), "machine": machine, "date": date.today().isoformat(),
        "command": command, "device": run["settings"]["device"], "dtype": str(run["settings"]["dtype"]),
        "batch_size": run["settings"]["batch_size"], "gptq_kernels": run["settings"]["gptq_kernels"],
        "lm_eval_version": run["settings"]["lm_eval_version"], "n": run["n"], "accuracy": run["accuracy"],
        "strict_match_correct": "".join(str(p["strict-match"]) for p in run["problems"]),
    }
    return atomic_write_json(path, record)


def read_accuracy(root: str | Path | None = None, path: str | Path | None = None) -> dict:
    """The recorded accuracy of both fixture models; ValueError if it is not of the committed weights and data."""
    from .capture import weights_digest

    path = Path(path) if path else ACCURACY
    redo = "re-measure with scripts/fixture_accuracy.py --record (docs/fixture.md)"
    if not path.is_file():
        raise ValueError(f"{path} does not exist: {redo}")
    record = json.loads(path.read_text())
    if record.get("data") != data_digest(root):
        raise ValueError(f"{path} was measured on other train/test files than {fixture_paths(root)['test'].parent}: {redo}")
    for key in MODELS:
        entry = record.get("models", {}).get(key)
        if entry is None or entry["revision"] != weights_digest(fixture_paths(root)[key]):
            raise ValueError(f"{path}: the {key} model's figure is missing or of other weights than "
                             f"{fixture_paths(root)[key]}: {redo}")
    return record


def recorded_flips(record: dict, limit: int | None = None) -> list[int]:
    """Held-out problems (0-based) that one model gets right and the other wrong (strict-match)."""
    g, q = (record["models"][k]["strict_match_correct"][:limit] for k in MODELS)
    return [i for i, (a, b) in enumerate(zip(g, q)) if a != b]


def accuracy_markdown(record: dict) -> str:
    """The markdown table docs/fixture.md shows, rendered from accuracy.json."""
    names = {"golden": "golden BF16 fixture", "int4": "GPTQ-Int4 twin"}
    rows = ["| model | strict-match | flexible-extract | machine, date | device, dtype | kernel |",
            "|---|---|---|---|---|---|"]
    for key in MODELS:
        e = record["models"][key]
        acc = [f"{100 * e['accuracy'][f]['acc']:.2f} % ± {100 * e['accuracy'][f]['stderr']:.2f}"
               for f in ("strict-match", "flexible-extract")]
        rows.append(f"| {names[key]} | {acc[0]} | {acc[1]} | {e['machine']}, {e['date']} | {e['device']}, "
                    f"{e['dtype']} | {', '.join(e['gptq_kernels'] or ['-'])} |")
    n = len(recorded_flips(record))
    rows.append(f"\n{n} of {record['models']['golden']['n']} problems flip between the two (strict-match).")
    return "\n".join(rows) + "\n"

"""Make a random-weight pair with Qwen2.5-7B-Instruct's exact shapes: a BF16 golden model and its
GPTQ-Int4 twin in the standard checkpoint format, with a tokenizer whose vocabulary spans the model's.

What for: rehearsing the rtx4090 chain (memory, formats, kernels, time) on a GPU with no internet.
It says nothing about accuracy: the weights are random (seeded normal, std 0.02, built directly on the
GPU in under a second), the Int4 twin is their round-to-nearest quantization packed by the project's
packer (utils.gptq.pack_gptq_int4: bits 4, group 128, sym, desc_act off, GPTQ v1 zeros).
The tokenizer is a byte-level BPE with Qwen2's pre-tokenizer (digits one by one), trained on the GSM8K
text given, filled to 151,643 ordinary tokens, Qwen's three special tokens at 151,643-151,645 and
reserved special tokens up to the model's 152,064: every id decodes, GSM8K prompts encode to about the
length Qwen's own tokenizer gives.

    python scripts/make_7b_pair.py --out /tmp/rehearsal/models --data fixtures/tiny-qwen2-gsm/data
    python scripts/make_7b_pair.py --out /tmp/tiny --data ... --tiny --device cpu     # the same, small (tests)

Writes <out>/bf16, <out>/gptq-int4 and <out>/build.json (seconds and bytes of each step); --bf16-only or
--int4-only leave out the other folder.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from utils.gptq import pack_gptq_int4  # noqa: E402

# Qwen/Qwen2.5-7B-Instruct config.json (modelscope, master), the fields that shape the model.
QWEN25_7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                 num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768, rms_norm_eps=1e-6,
                 rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=False,
                 hidden_act="silu", attention_dropout=0.0, use_sliding_window=False, sliding_window=None,
                 max_window_layers=28, bos_token_id=151643, eos_token_id=151645, initializer_range=0.02)
# Qwen/Qwen2.5-14B-Instruct's shapes where they differ from 7B's (about 29.5 GB in BF16: a model that does not
# fit one 24 GB card, for Lab 03's shard rehearsal)
QWEN25_14B = dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=48, num_attention_heads=40,
                  num_key_value_heads=8, max_window_layers=48)
# The same structure, small: every GPTQ shape rule still holds (in % 128, out % 8).
TINY = dict(hidden_size=256, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1024, max_position_embeddings=4096, max_window_layers=2,
            bos_token_id=1000, eos_token_id=1002)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2's pre-tokenizer split (tokenizer.json of Qwen2.5): letters, single digits, punctuation, spaces.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
GPTQ_CONFIG = {"bits": 4, "group_size": 128, "desc_act": False, "sym": True, "quant_method": "gptq",
               "checkpoint_format": "gptq", "damp_percent": 0.01, "static_groups": False, "true_sequential": True,
               "lm_head": False, "pack_dtype": "int32",
               "meta": {"quantizer": ["quant-lab scripts/make_7b_pair.py (round-to-nearest, random weights)"]}}
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] make_7b_pair: {msg}", flush=True)


def gsm8k_texts(data: Path) -> list[str]:
    rows = []
    for split in ("train.jsonl", "test.jsonl"):
        for line in (data / split).read_text(encoding="utf-8").splitlines():
            if line.strip():
                r = json.loads(line)
                rows.append(f"Question: {r['question']}\nAnswer: {r['answer']}\n\n")
    if not rows:
        raise SystemExit(f"--data {data}: no GSM8K problems in train.jsonl / test.jsonl")
    return rows


def build_tokenizer(texts: list[str], vocab_size: int):
    """A fast tokenizer with exactly vocab_size ids (see the module docstring)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    n_plain = vocab_size - 421 if vocab_size > 4096 else vocab_size - 24     # Qwen: 151,643 of 152,064
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=n_plain, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    vocab = tok.get_vocab()
    learned = len(vocab)
    merges = [tuple(m) for m in json.loads(tok.to_str())["model"]["merges"]]
    filler = (f"<{i:06d}>" for i in range(10**6))            # never learned: tokens hold one digit at most
    while len(vocab) < n_plain:
        vocab.setdefault(next(filler), len(vocab))
    full = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    full.pre_tokenizer, full.decoder = tok.pre_tokenizer, tok.decoder
    reserved = [f"<|reserved_{i}|>" for i in range(vocab_size - n_plain - len(SPECIALS))]
    full.add_special_tokens(SPECIALS + reserved)
    fast = PreTrainedTokenizerFast(tokenizer_object=full, bos_token=SPECIALS[0], eos_token=SPECIALS[2],
                                   pad_token=SPECIALS[0], model_max_length=32768)
    assert len(fast) == vocab_size, (len(fast), vocab_size)
    return fast, learned


def build_model(overrides: dict, device: str, seed: int, std: float = 0.02):
    """Qwen2ForCausalLM in bfloat16 made on `device`, weights normal(0, std) from a seeded generator."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**{**QWEN25_7B, **overrides})
    config.dtype = torch.bfloat16
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(old)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.normal_(0.0, std, generator=gen)
    return model.eval()


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def save_bf16(model, tokenizer, out: Path) -> dict:
    t0 = time.perf_counter()
    model.save_pretrained(str(out), max_shard_size="4GB")
    tokenizer.save_pretrained(str(out))
    return {"seconds": round(time.perf_counter() - t0, 2), "bytes": _folder_bytes(out)}


def save_int4(model, tokenizer, out: Path, group_size: int = 128, shard_bytes: int = 4 * 2**30) -> dict:
    """The GPTQ-Int4 twin: every decoder linear RTN-packed (qweight [in/8, out] of W.T), the rest float16."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    pack_s = 0.0
    quantized = {f"model.layers.{i}.{n}" for i in range(model.config.num_hidden_layers) for n in LINEARS}
    shards, current, size, weight_map = [], {}, 0, {}

    def flush():
        nonlocal current, size
        if current:
            name = f"model-{len(shards) + 1:05d}.safetensors"
            save_file({k: v.contiguous().cpu() for k, v in current.items()}, str(out / name), metadata={"format": "pt"})
            shards.append(name)
            weight_map.update({k: name for k in current})
            current, size = {}, 0

    def add(key, tensor):
        nonlocal size
        current[key] = tensor
        size += tensor.numel() * tensor.element_size()
        if size >= shard_bytes:
            flush()

    with torch.no_grad():
        for name, p in model.named_parameters():
            module = name.rsplit(".", 1)[0]
            if module in quantized and name.endswith(".weight"):
                t1 = time.perf_counter()
                qweight, qzeros, scales = pack_gptq_int4(p.t(), group_size)      # y = x @ W.T: pack W.T [in, out]
                pack_s += time.perf_counter() - t1
                add(f"{module}.qweight", qweight)
                add(f"{module}.qzeros", qzeros)
                add(f"{module}.scales", scales)
                add(f"{module}.g_idx", torch.arange(p.shape[1], device=p.device, dtype=torch.int32) // group_size)
            else:
                add(name, p.to(torch.float16))
    flush()
    # renumber as model-0000i-of-0000n like transformers, and write the index
    n = len(shards)
    final = {s: s.replace(".safetensors", f"-of-{n:05d}.safetensors") for s in shards}
    for s, f in final.items():
        (out / s).rename(out / f)
    index = {"metadata": {"total_size": sum((out / f).stat().st_size for f in final.values())},
             "weight_map": {k: final[v] for k, v in sorted(weight_map.items())}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    cfg = model.config.to_dict()
    cfg.update(dtype="float16", quantization_config=GPTQ_CONFIG)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    model.generation_config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return {"seconds": round(time.perf_counter() - t0, 2), "pack_seconds": round(pack_s, 2), "bytes": _folder_bytes(out)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for bf16/, gptq-int4/ and build.json")
    ap.add_argument("--data", type=Path, required=True, help="GSM8K folder (train.jsonl, test.jsonl) for the tokenizer")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="the same structure, small (tests, CPU)")
    ap.add_argument("--shape", choices=("7b", "14b"), default="7b", help="Qwen2.5-7B's shapes, or 14B's")
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--bf16-only", action="store_true", help="no GPTQ-Int4 twin (the shard rehearsal needs none)")
    only.add_argument("--int4-only", action="store_true", help="no BF16 folder (the Int4 shard rehearsal: less "
                      "time and disk)")
    args = ap.parse_args(argv)
    for sub in ("bf16", "gptq-int4"):
        if (args.out / sub).exists():
            raise SystemExit(f"--out {args.out}: {sub}/ exists already; give an empty folder (nothing is overwritten)")
    overrides = TINY if args.tiny else QWEN25_14B if args.shape == "14b" else {}
    vocab_size = {**QWEN25_7B, **overrides}["vocab_size"]
    report = {"device": args.device, "seed": args.seed, "tiny": args.tiny, "shape": args.shape}

    t0 = time.perf_counter()
    tokenizer, learned = build_tokenizer(gsm8k_texts(args.data), vocab_size)
    report["tokenizer"] = {"seconds": round(time.perf_counter() - t0, 2), "ids": len(tokenizer), "learned": learned,
                           "data": str(args.data)}
    log(f"tokenizer: {len(tokenizer)} ids ({learned} learned from {args.data}) in {report['tokenizer']['seconds']} s")
    t0 = time.perf_counter()
    model = build_model(overrides, args.device, args.seed)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    n_params = sum(p.numel() for p in model.parameters())
    report["model"] = {"seconds": round(time.perf_counter() - t0, 2), "parameters": n_params}
    log(f"model: {n_params / 1e9:.3f} B parameters on {args.device} in {report['model']['seconds']} s")
    if not args.int4_only:
        report["bf16"] = save_bf16(model, tokenizer, args.out / "bf16")
        log(f"bf16 saved: {report['bf16']['bytes'] / 2**30:.2f} GiB in {report['bf16']['seconds']} s")
    if args.bf16_only:
        (args.out / "build.json").write_text(json.dumps(report, indent=1))
        return 0
    report["int4"] = save_int4(model, tokenizer, args.out / "gptq-int4")
    log(f"gptq-int4 saved: {report['int4']['bytes'] / 2**30:.2f} GiB in {report['int4']['seconds']} s "
        f"(packing {report['int4']['pack_seconds']} s)")
    (args.out / "build.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

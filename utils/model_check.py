"""A model folder checked against itself before a lab uses it: config.json's shapes against the safetensors
headers (no tensor is loaded), the GPTQ settings against the packed tensors, the tokenizer files against the
embedding.

Why: transformers reports a config that disagrees with the weights as an option the user never set
(`ignore_mismatched_sizes`), gives an untied config over a checkpoint without lm_head a random head without an
error, and loads a folder without tokenizer files as an empty tokenizer that fails later in a reshape. Here each
problem is named with the parameter, the file, the field and what to do, before anything loads.
Layout: decoder-only checkpoints of the Llama/Qwen family (`*embed_tokens`, `*layers.N.self_attn/mlp`), the
course's models; another layout is reported as not checked rather than refused.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from .fetch import ConfigError, safetensors_header

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
NORMS = ("input_layernorm", "post_attention_layernorm")
# Where a tokenizer's vocabulary can live (transformers reads any one of these sets).
VOCAB_FILES = (("tokenizer.json",), ("vocab.json", "merges.txt"), ("tokenizer.model",), ("vocab.txt",))
TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                  "vocab.json")
MIN_VOCAB_SHARE = 0.9   # embeddings are padded a little past the tokenizer (Qwen2.5: 151665 tokens, 151936 rows)
_LAYER = re.compile(r"^(.*?)layers\.(\d+)\.(.+)$")
_CONFIG_FIX = ("To fix: config.json and the weights must come from one model: restore config.json from where "
               "the model came from, or fetch the folder again (Lab 02 re-downloads a modelscope id; the embedded "
               "fixture: git checkout -- fixtures)")
_TOKENIZER_FIX = ("To fix: a model folder needs its own tokenizer files (tokenizer.json and tokenizer_config.json "
                  "for Qwen): copy them from where the model came from, or fetch the folder again")
_CACHE: dict[tuple, list[dict]] = {}


def read_json(path: Path, param: str) -> dict:
    """A JSON object from a model folder's file; ConfigError naming the parameter, the file and the line otherwise."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{param}: {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}): "
                          "the file is damaged or was cut short; restore it from where the model came from") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{param}: {path} cannot be read ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{param}: {path} holds a JSON {type(data).__name__}, not an object of settings")
    return data


def tensor_shapes(path: str | Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{tensor name: (dtype, shape)} over every safetensors file of the folder, from the headers alone."""
    return {name: (meta["dtype"], tuple(meta["shape"])) for f in sorted(Path(path).glob("*.safetensors"))
            for name, meta in safetensors_header(f).items()}


def _whole(cfg: dict, key: str, problems: list, default=None, minimum: int = 1):
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        problems.append(f"config.json: {key} is {value!r}; it must be a whole number >= {minimum}")
        return None
    return value


def _tie_default(model_type) -> bool:
    """transformers' own default for tie_word_embeddings when config.json does not say."""
    try:
        from transformers import AutoConfig
        return bool(getattr(AutoConfig.for_model(model_type), "tie_word_embeddings", True))
    except Exception:  # noqa: BLE001 - an unknown model_type: transformers' base default
        return True


def _quant_fields(path: Path, q: dict, param: str, problems: list) -> dict | None:
    """bits, group_size, desc_act, sym checked for type and range, and against quantize_config.json if present."""
    bits, group, desc, sym = q.get("bits"), q.get("group_size", 128), q.get("desc_act", False), q.get("sym", True)
    ok = True
    if isinstance(bits, bool) or bits not in (2, 3, 4, 8):
        problems.append(f"config.json: quantization_config.bits is {bits!r}; GPTQ packs 2, 3, 4 or 8 bits")
        ok = False
    if isinstance(group, bool) or not isinstance(group, int) or not (group == -1 or group >= 1):
        problems.append(f"config.json: quantization_config.group_size is {group!r}; it must be -1 (one group) or "
                        "a whole number >= 1")
        ok = False
    for key, value in (("desc_act", desc), ("sym", sym)):
        if not isinstance(value, bool):
            problems.append(f"config.json: quantization_config.{key} is {value!r} (a {type(value).__name__}); it must "
                            "be true or false")
    side = path / "quantize_config.json"
    if side.is_file():
        other = read_json(side, param)
        for key in ("bits", "group_size", "desc_act", "sym"):
            if key in other and other[key] != q.get(key):
                problems.append(f"quantize_config.json: {key} is {other[key]!r}, config.json's quantization_config "
                                f"says {q.get(key)!r} (two settings for one checkpoint)")
    return {"bits": bits, "group_size": group, "desc_act": desc} if ok else None


def _check_linear(shapes, name, n_out, n_in, fields, quant, problems):
    """One linear layer (weight [out, in], or GPTQ's packed tensors) against the shape the config gives it."""
    dense, packed = shapes.get(f"{name}.weight"), shapes.get(f"{name}.qweight")
    if dense is None and packed is None:
        problems.append(f"{name}: no weight (neither {name}.weight nor {name}.qweight) in the checkpoint")
        return
    if dense is not None:
        if dense[1] != (n_out, n_in):
            problems.append(f"{name}.weight is {list(dense[1])}; config.json gives [{n_out}, {n_in}] ({fields})")
    elif quant is None:
        problems.append(f"{name}.qweight is GPTQ-packed but config.json has no usable GPTQ quantization_config")
    else:
        from .gptq import packed_shapes
        want = packed_shapes(n_in, n_out, quant["bits"], quant["group_size"])
        for part in ("qweight", "qzeros", "scales", "g_idx"):
            got = shapes.get(f"{name}.{part}")
            if got is None:
                if part != "g_idx" or quant["desc_act"]:
                    why = " (desc_act is true: act-order needs g_idx)" if part == "g_idx" else ""
                    problems.append(f"{name}.{part} is missing from the checkpoint{why}")
            elif got[1] != want[part]:
                problems.append(f"{name}.{part} is {list(got[1])}; config.json gives {list(want[part])} ({fields}, "
                                f"bits {quant['bits']}, group_size {quant['group_size']})")
            elif part in ("qweight", "qzeros", "g_idx") and got[0] != "I32":
                problems.append(f"{name}.{part} is {got[0]}; GPTQ stores it as int32")
    bias = shapes.get(f"{name}.bias")
    if bias is not None and bias[1] != (n_out,):
        problems.append(f"{name}.bias is {list(bias[1])}; config.json gives [{n_out}] ({fields.split(',')[0]})")


def config_rows(path: str | Path, param: str) -> tuple[list[dict], list[str]]:
    """Each config.json field against what the weights' headers say: rows {field, config, weights, ok}, and
    the problems found (empty when the folder agrees with itself)."""
    path = Path(path)
    cfg, problems, rows = read_json(path / "config.json", param), [], []
    shapes = tensor_shapes(path)
    embed = next((n for n in shapes if n.endswith("embed_tokens.weight")), None)
    layers: dict[int, str] = {}
    for n in shapes:
        if (m := _LAYER.match(n)) and embed is not None:
            layers.setdefault(int(m.group(2)), m.group(1) + "layers." + m.group(2))
    if embed is None or not layers:
        what = "no safetensors weights" if not shapes else "not a Llama/Qwen-style layout (embed_tokens, layers.N)"
        return [{"field": "shapes", "config": "-", "weights": f"{what}: not checked", "ok": None}], []
    vocab, hidden = _whole(cfg, "vocab_size", problems), _whole(cfg, "hidden_size", problems)
    n_layers, inter = _whole(cfg, "num_hidden_layers", problems), _whole(cfg, "intermediate_size", problems)
    heads = _whole(cfg, "num_attention_heads", problems)
    kv = _whole(cfg, "num_key_value_heads", problems, default=heads)
    head_dim, hd_text = None, "head_dim"
    if cfg.get("head_dim") is not None:
        head_dim = _whole(cfg, "head_dim", problems)
    elif heads and hidden:
        if hidden % heads:
            problems.append(f"config.json: hidden_size {hidden} is not divisible by num_attention_heads {heads} "
                            "(and no head_dim is given)")
        head_dim, hd_text = hidden // heads, "head_dim = hidden_size / num_attention_heads"
    types = cfg.get("layer_types")
    if n_layers and isinstance(types, list) and len(types) != n_layers:
        problems.append(f"config.json: layer_types lists {len(types)} layers, num_hidden_layers says {n_layers}")
    if heads and kv and heads % kv:
        problems.append(f"config.json: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    tie = cfg.get("tie_word_embeddings", _tie_default(cfg.get("model_type")))
    if not isinstance(tie, bool):
        problems.append(f"config.json: tie_word_embeddings is {tie!r} (a {type(tie).__name__}); it must be true "
                        "or false")
    q = cfg.get("quantization_config") or {}
    gptq = str(q.get("quant_method", "")).lower() == "gptq"
    quant = _quant_fields(path, q, param, problems) if gptq else None

    def row(field, config, weights, where, ok=None):
        ok = config == weights if ok is None else ok
        rows.append({"field": field, "config": config, "weights": weights, "ok": ok})
        if not ok and config is not None and weights is not None:
            problems.append(f"{field} is {config} in config.json, but the weights give {weights} ({where})")

    def out_dim(module):   # a linear's out_features as stored: weight [out, in] or qweight [in*bits/32, out]
        for layer in layers.values():
            got = shapes.get(f"{layer}.{module}.weight") or shapes.get(f"{layer}.{module}.qweight")
            if got is not None:
                return (got[1][0] if f"{layer}.{module}.weight" in shapes else got[1][1]), f"{layer}.{module}"
        return None, module

    e_shape = shapes[embed][1]
    row("vocab_size", vocab, e_shape[0], f"{embed} {list(e_shape)}")
    row("hidden_size", hidden, e_shape[1], f"{embed} {list(e_shape)}")
    row("num_hidden_layers", n_layers, len(layers), f"layers {min(layers)}..{max(layers)}")
    if sorted(layers) != list(range(len(layers))):
        problems.append(f"the weights hold layers {sorted(layers)}: not 0..{len(layers) - 1}, a layer is missing")
    got, where = out_dim("mlp.gate_proj")
    row("intermediate_size", inter, got, f"{where} out_features")
    if heads and head_dim:
        got, where = out_dim("self_attn.q_proj")
        row("num_attention_heads", f"{heads} (× {hd_text} {head_dim} = {heads * head_dim})",
            got, f"{where} out_features", ok=heads * head_dim == got)
        got, where = out_dim("self_attn.k_proj")
        if kv:
            row("num_key_value_heads", f"{kv} (× {hd_text} {head_dim} = {kv * head_dim})",
                got, f"{where} out_features", ok=kv * head_dim == got)
        bias = f"{where}.bias" in shapes
        # Qwen2's q/k/v always carry a bias (its code ignores attention_bias); Llama-style models read the field
        want = True if cfg.get("model_type") == "qwen2" else cfg.get("attention_bias", False)
        row("attention_bias", want, bias, f"{where}.bias {'present' if bias else 'absent'}; transformers would "
            + ("drop it" if bias else "start it at zero"))
    head = next((n for n in ("lm_head.weight", "lm_head.qweight") if n in shapes), None)
    rows.append({"field": "tie_word_embeddings", "config": tie, "weights": head or "no lm_head (one matrix)",
                 "ok": bool(tie) == (head is None)})
    if tie and head:
        problems.append(f"tie_word_embeddings is true in config.json, but the weights hold their own {head}: "
                        "transformers would drop it and use the embedding instead")
    elif not tie and not head:
        problems.append("tie_word_embeddings is false in config.json, but the weights hold no lm_head.weight: "
                        "transformers would start the output layer from random numbers")
    if quant is not None and isinstance(q.get("lm_head", False), bool) and q.get("lm_head", False) != (
            head == "lm_head.qweight"):
        problems.append(f"quantization_config.lm_head is {str(q.get('lm_head', False)).lower()} in config.json, but "
                        f"the weights hold {head or 'no lm_head'}: the output layer is "
                        f"{'' if head == 'lm_head.qweight' else 'not '}GPTQ-packed")
    qname = next((f"{ln}.self_attn.q_proj" for ln in layers.values() if f"{ln}.self_attn.q_proj.qweight" in shapes),
                 None)
    if quant is not None and qname and hidden:
        qw, sc = shapes[f"{qname}.qweight"][1], (shapes.get(f"{qname}.scales") or ("", (0,)))[1]
        bits = qw[0] * 32 / hidden
        row("bits", quant["bits"], int(bits) if bits == int(bits) else round(bits, 3),
            f"{qname}.qweight {list(qw)}: rows = in_features {hidden} × bits / 32")
        groups = 1 if quant["group_size"] == -1 else -(-hidden // quant["group_size"])
        row("group_size", quant["group_size"], f"{sc[0]} group(s) over in_features {hidden}",
            f"{qname}.scales {list(sc)}: one row per group", ok=groups == sc[0])
        has_g = f"{qname}.g_idx" in shapes
        row("desc_act", quant["desc_act"], "no g_idx" if not has_g else "g_idx present",
            f"{qname}; act-order needs g_idx", ok=has_g or not quant["desc_act"])
    fields_wrong, problems = problems, []
    if None not in (hidden, inter, heads, kv, head_dim, vocab) and (quant is not None or not gptq):
        shape_of = {"self_attn.q_proj": (heads * head_dim, hidden, "num_attention_heads × head_dim, hidden_size"),
                    "self_attn.k_proj": (kv * head_dim, hidden, "num_key_value_heads × head_dim, hidden_size"),
                    "self_attn.v_proj": (kv * head_dim, hidden, "num_key_value_heads × head_dim, hidden_size"),
                    "self_attn.o_proj": (hidden, heads * head_dim, "hidden_size, num_attention_heads × head_dim"),
                    "mlp.gate_proj": (inter, hidden, "intermediate_size, hidden_size"),
                    "mlp.up_proj": (inter, hidden, "intermediate_size, hidden_size"),
                    "mlp.down_proj": (hidden, inter, "hidden_size, intermediate_size")}
        for layer in layers.values():
            for module, (n_out, n_in, fields) in shape_of.items():
                _check_linear(shapes, f"{layer}.{module}", n_out, n_in, fields, quant, problems)
            for norm in NORMS:
                got = shapes.get(f"{layer}.{norm}.weight")
                if got is None or got[1] != (hidden,):
                    problems.append(f"{layer}.{norm}.weight is {list(got[1]) if got else 'missing'}; config.json "
                                    f"gives [{hidden}] (hidden_size)")
        if head:
            _check_linear(shapes, head.rsplit(".", 1)[0], vocab, hidden, "vocab_size, hidden_size", quant, problems)
    if fields_wrong and problems:   # the fields say why; the tensors that follow from them, counted
        problems = [f"so {len(problems)} tensor(s) differ from the shapes config.json gives, the first: {problems[0]}"]
    return rows, fields_wrong + problems


def tokenizer_rows(path: str | Path, param: str, rows_in_embedding: int | None) -> tuple[list[dict], list[str]]:
    """The tokenizer files present, readable and loadable, and its vocabulary against the embedding's rows."""
    path, problems = Path(path), []
    if not (path / "tokenizer_config.json").is_file():
        problems.append(f"{path}/tokenizer_config.json is missing: it holds the tokenizer's class and special tokens "
                        "(end of text, padding, chat template); without it transformers guesses them")
    if not any(all((path / f).is_file() for f in files) for files in VOCAB_FILES):
        partial = [f"{' + '.join(fs)} (missing {', '.join(f for f in fs if not (path / f).is_file())})"
                   for fs in VOCAB_FILES if len(fs) > 1 and any((path / f).is_file() for f in fs)]
        problems.append(f"{path} has no tokenizer vocabulary: none of "
                        f"{', '.join(' + '.join(fs) for fs in VOCAB_FILES)}"
                        + (f"; found {partial[0]}" if partial else ""))
    for name in TOKENIZER_JSON:
        if (path / name).is_file():
            try:
                read_json(path / name, param)
            except ConfigError as exc:
                problems.append(str(exc).removeprefix(f"{param}: "))
    if problems:
        return [{"field": "tokenizer", "config": "-", "weights": "not loaded", "ok": False}], problems
    try:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(str(path))
        ids = tok.get_vocab().values()
    except Exception as exc:  # noqa: BLE001 - the library's reason, named with the folder
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        return ([{"field": "tokenizer", "config": "-", "weights": "does not load", "ok": False}],
                [f"transformers cannot load the tokenizer of {path} ({type(exc).__name__}: {first})"])
    n, span = len(tok), max(ids, default=-1) + 1
    if n < 2 or not tok("Question: 12 + 7 = ?").input_ids:
        problems.append(f"the tokenizer of {path} has {n} token(s) and encodes a question to nothing: its "
                        "vocabulary file is empty or not the one transformers reads")
    elif rows_in_embedding is not None and span > rows_in_embedding:
        problems.append(f"the tokenizer has token ids up to {span - 1}, but the embedding has {rows_in_embedding} rows "
                        "(vocab_size): those ids would index past it; the tokenizer is another model's")
    elif rows_in_embedding is not None and n < MIN_VOCAB_SHARE * rows_in_embedding:
        problems.append(f"the tokenizer has {n} tokens, but the embedding has {rows_in_embedding} rows (vocab_size): "
                        f"fewer than {MIN_VOCAB_SHARE:.0%} of them, the tokenizer is another model's")
    return [{"field": "tokenizer", "config": f"{rows_in_embedding} embedding rows", "weights": f"{n} tokens",
             "ok": not problems}], problems


def check_model(path: str | Path, param: str = "model", tokenizer: bool = True) -> list[dict]:
    """The model folder against itself (config_rows, and tokenizer_rows unless tokenizer=False), before anything
    loads: the rows compared, or ConfigError naming `param`, the folder, every problem and what to do."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ConfigError(f"{param}: {path} is not a model folder (no config.json): give the folder of a transformers "
                          "checkpoint, e.g. the one Lab 02 fetched or fixtures/tiny-qwen2-gsm/bf16")
    key = (str(path.resolve()), tokenizer, tuple(sorted((p.name, p.stat().st_mtime_ns, p.stat().st_size)
                                                        for p in path.iterdir() if p.is_file())))
    if key in _CACHE:
        return _CACHE[key]
    rows, problems = config_rows(path, param)
    fix = _CONFIG_FIX
    if tokenizer and not problems:
        vocab = next((r["weights"] for r in rows if r["field"] == "vocab_size"), None)
        if vocab is None:
            vocab = read_json(path / "config.json", param).get("vocab_size")
        tok_rows, problems = tokenizer_rows(path, param, vocab if isinstance(vocab, int) else None)
        rows, fix = rows + tok_rows, _TOKENIZER_FIX
    if problems:
        more = f" (and {len(problems) - 6} more)" if len(problems) > 6 else ""
        raise ConfigError(f"{param}: the model folder {path} disagrees with itself: " + "; ".join(problems[:6])
                          + f"{more}. {fix}.")
    _CACHE[key] = rows
    return rows

"""Golden captures: a model's per-layer outputs and logits on fixed token ids, in a portable file.

Why: post-silicon validation compares a device under test with a known-good reference that may
be another machine (an RTX 4090 vs an AMD or MUSA GPU). A capture is that reference frozen on disk:
`capture.safetensors` (token ids, logits, the output of every decoder layer and its parts) plus
`manifest.json` (model, revision, dtype, prompts, seed, platform record). A later run feeds the
*same token ids* to its model (no tokenizer in the loop) and is compared with the same metrics.

Activations are moved to the CPU as soon as a hook sees them, so the accelerator holds one model.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch

CAPTURE_FILE = "capture.safetensors"
MANIFEST_FILE = "manifest.json"
CAPTURE_SCHEMA = "quant-lab/capture"
CAPTURE_VERSION = 1
PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")  # in execution order
_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.(.+))?$")


class CaptureError(ValueError):
    """A capture is missing, of another schema, or does not match what it is compared with."""


# ---------------------------------------------------------------- which modules, and hooks on them
def decoder_layers(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList]:
    """The ModuleList of decoder layers (model.model.layers for Qwen2/Llama), with its qualified name."""
    best = None
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and name.split(".")[-1] == "layers" and len(mod):
            if best is None or len(mod) > len(best[1]):
                best = (name, mod)
    if best is None:
        raise ValueError(f"{type(model).__name__} has no decoder 'layers' ModuleList: "
                         "pass a transformers causal LM (Qwen2, Llama, ...).")
    return best


def hooked_modules(model: torch.nn.Module, parts: bool = True, ends: bool = False,
                   ) -> "OrderedDict[str, torch.nn.Module]":
    """Every decoder layer and (parts=True) its parts, in execution order: layer i's parts, then layer i.

    ends=True adds the token embedding first and the final norm last: a fault in either (or in an
    lm_head tied to the embedding) then has a module of its own instead of showing up in layer 0.
    """
    prefix, layers = decoder_layers(model)
    found: OrderedDict[str, torch.nn.Module] = OrderedDict()
    named = dict(model.named_modules())
    if ends:
        emb = model.get_input_embeddings()
        found.update((n, m) for n, m in named.items() if m is emb)
    for i, layer in enumerate(layers):
        if parts:
            for part in PARTS:
                if hasattr(layer, part):
                    found[f"{prefix}.{i}.{part}"] = getattr(layer, part)
        found[f"{prefix}.{i}"] = layer
    final_norm = f"{prefix.rsplit('.', 1)[0]}.norm" if "." in prefix else "norm"  # Qwen2/Llama: model.norm
    if ends and final_norm in named:
        found[final_norm] = named[final_norm]
    return found


def module_label(name: str) -> tuple[int, str]:
    """'model.layers.3.mlp' -> (3, 'mlp'); 'model.layers.3' -> (3, 'layer')."""
    m = _LAYER_RE.search(name)
    if not m:
        raise ValueError(f"{name!r} is not a decoder layer or one of its parts")
    return int(m.group(1)), m.group(2) or "layer"


def first_tensor(value: Any) -> torch.Tensor:
    """A module's main output: the tensor itself, or the first element of a tuple (attention, layers)."""
    while isinstance(value, (tuple, list)):
        value = value[0]
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"module output is {type(value).__name__}, not a tensor")
    return value


@contextmanager
def hooks(modules: "dict[str, torch.nn.Module]", on_output: Callable | None = None,
          replace_input: Callable | None = None):
    """Forward hooks on `modules`, removed on exit (also after an exception).

    on_output(name, tensor): sees each module's main output.
    replace_input(name, tensor) -> tensor | None: may swap a module's main input (hidden_states) before it
    runs; this is how the isolated mode feeds a layer the golden model's input (Numeric Suite's shadow).
    """
    handles = []
    try:
        for name, mod in modules.items():
            if on_output is not None:
                def post(m, args, out, _n=name):
                    on_output(_n, first_tensor(out))  # returns None: the output itself is never changed
                handles.append(mod.register_forward_hook(post))
            if replace_input is not None:
                def pre(m, args, kwargs, _n=name):
                    if args:
                        new = replace_input(_n, args[0])
                        return None if new is None else ((new, *args[1:]), kwargs)
                    if "hidden_states" in kwargs:
                        new = replace_input(_n, kwargs["hidden_states"])
                        return None if new is None else (args, {**kwargs, "hidden_states": new})
                    raise TypeError(f"{_n}: no positional input and no hidden_states keyword to replace")
                handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def input_recorder(modules: "dict[str, torch.nn.Module]", store: dict):
    """Record each module's main input (to the CPU) into store[name]."""
    handles = []

    def pre(m, args, kwargs, _n):
        x = args[0] if args else kwargs.get("hidden_states")
        store[_n] = first_tensor(x).detach().to("cpu")

    try:
        for name, mod in modules.items():
            handles.append(mod.register_forward_pre_hook(
                lambda m, a, k, _n=name: pre(m, a, k, _n), with_kwargs=True))
        yield
    finally:
        for h in handles:
            h.remove()


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def forward_capture(model: torch.nn.Module, input_ids: torch.Tensor, parts: bool = True,
                    inputs: bool = False, ends: bool = False) -> dict[str, torch.Tensor]:
    """One forward on `input_ids` ([1, T] or [T]); every hooked module's output (and input) and logits, on CPU.

    Outputs are kept in the model's own dtype (a bf16 model's activations stay bf16): the metrics
    upcast to float64 themselves. Keys: 'logits', '<module>' and, with inputs=True, '<module>:input'.
    """
    ids = input_ids.reshape(1, -1).to(model_device(model))
    mods = hooked_modules(model, parts, ends)
    got: dict[str, torch.Tensor] = {}
    ins: dict[str, torch.Tensor] = {}
    with hooks(mods, on_output=lambda n, t: got.__setitem__(n, t.detach().to("cpu"))):
        if inputs:
            with input_recorder(mods, ins):
                logits = model(input_ids=ids, use_cache=False).logits
        else:
            logits = model(input_ids=ids, use_cache=False).logits
    got["logits"] = logits.detach().to("cpu")
    got.update({f"{n}:input": t for n, t in ins.items()})
    return got


# ---------------------------------------------------------------- the portable file
def weights_digest(path: str | Path | None) -> str:
    """sha256 (first 16 hex) of a local checkpoint's *.safetensors files: the revision of a local model."""
    if not path or not Path(path).is_dir():
        return ""
    h = hashlib.sha256()
    for f in sorted(Path(path).glob("*.safetensors")):
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def portable_id(path: str | Path) -> str:
    """'tiny-qwen2-gsm/bf16' for a local folder: the model's name without this machine's directories."""
    p = Path(path)
    return f"{p.parent.name}/{p.name}" if p.parent.name else p.name


@dataclass
class Capture:
    tensors: dict[str, torch.Tensor]      # 'ids/<k>', 'logits/<k>', '<module>/<k>' for prompt k
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def n_prompts(self) -> int:
        return int(self.manifest["n_prompts"])

    @property
    def modules(self) -> list[str]:
        return list(self.manifest["modules"])

    def ids(self, k: int) -> torch.Tensor:
        return self.tensors[f"ids/{k}"]


def make_capture(model, tokenizer, prompts: list[str], *, seed: int = 0, max_tokens: int | None = 32,
                 parts: bool = True, model_id: str = "", revision: str = "", platform: dict | None = None,
                 ids: list[torch.Tensor] | None = None) -> Capture:
    """Capture `model` on `prompts` (or on given token `ids`, e.g. another capture's) to CPU tensors."""
    if ids is None:
        if not prompts:
            raise ValueError("prompts is empty: give at least one prompt to capture.")
        ids = [tokenizer(p, return_tensors="pt").input_ids[0][:max_tokens] for p in prompts]
    torch.manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    modules: list[str] = []
    for k, tok in enumerate(ids):
        got = forward_capture(model, tok, parts=parts)
        modules = [n for n in got if n != "logits"]
        tensors[f"ids/{k}"] = tok.reshape(-1).to(torch.int64).cpu()
        tensors[f"logits/{k}"] = got["logits"][0]
        for n in modules:
            tensors[f"{n}/{k}"] = got[n][0]
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    manifest = {
        "schema": CAPTURE_SCHEMA, "schema_version": CAPTURE_VERSION,
        "model": model_id, "revision": revision, "dtype": dtype,
        "device": str(model_device(model)), "prompts": list(prompts), "n_prompts": len(ids),
        "max_tokens": max_tokens, "seed": seed, "parts": parts, "modules": modules,
        "platform": platform or {},
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch_version": torch.__version__,
    }
    return Capture(tensors, manifest)


def save_capture(cap: Capture, folder: str | Path) -> Path:
    """Write capture.safetensors and manifest.json into `folder` (created; existing files replaced)."""
    from safetensors.torch import save_file

    from .results import atomic_write_json
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in cap.tensors.items()}, str(folder / CAPTURE_FILE))
    atomic_write_json(folder / MANIFEST_FILE, cap.manifest)  # written last: its presence means complete
    return folder


def load_capture(folder: str | Path) -> Capture:
    """Read a capture folder; CaptureError naming what is wrong when it is not one."""
    from safetensors.torch import load_file
    folder = Path(folder)
    man, st = folder / MANIFEST_FILE, folder / CAPTURE_FILE
    if not man.is_file() or not st.is_file():
        raise CaptureError(f"reference_capture {folder} has no {MANIFEST_FILE} and {CAPTURE_FILE}: give the "
                           "folder that save_capture wrote (python -m utils.capture --help).")
    manifest = json.loads(man.read_text(encoding="utf-8"))
    if manifest.get("schema") != CAPTURE_SCHEMA or manifest.get("schema_version") != CAPTURE_VERSION:
        raise CaptureError(f"{man} is not a quant-lab capture v{CAPTURE_VERSION} "
                           f"(schema={manifest.get('schema')!r}, version={manifest.get('schema_version')!r}).")
    return Capture(load_file(str(st)), manifest)


def compare_captures(ref: Capture, test: Capture) -> list[dict[str, Any]]:
    """Per module (and logits): cosine, normalized L2, SQNR dB, max abs of test against ref, over all prompts."""
    from .metrics import MetricAccumulator
    if ref.n_prompts != test.n_prompts:
        raise CaptureError(f"captures hold {ref.n_prompts} vs {test.n_prompts} prompts: capture the test run "
                           "with capture_like(reference, model) so both see the same token ids.")
    for k in range(ref.n_prompts):
        if not torch.equal(ref.ids(k), test.ids(k)):
            raise CaptureError(f"prompt {k}: token ids differ between the captures; capture the test run "
                               "with capture_like(reference, model).")
    missing = [m for m in ref.modules if m not in test.modules]
    if missing:
        raise CaptureError(f"the test capture lacks modules {missing[:3]}...: capture it with the same parts=.")
    rows = []
    for name in ref.modules + ["logits"]:
        acc = MetricAccumulator()
        for k in range(ref.n_prompts):
            acc.update(test.tensors[f"{name}/{k}"], ref.tensors[f"{name}/{k}"])
        layer, part = module_label(name) if name != "logits" else (None, "logits")
        rows.append({"module": name, "layer": layer, "part": part, **acc.result()})
    return rows


def capture_like(ref: Capture, model, *, model_id: str = "", revision: str = "",
                 platform: dict | None = None) -> Capture:
    """Capture `model` on exactly the reference's token ids, prompts and seed (the comparable run)."""
    m = ref.manifest
    return make_capture(model, None, m["prompts"], seed=m["seed"], max_tokens=m["max_tokens"],
                        parts=m["parts"], model_id=model_id, revision=revision, platform=platform,
                        ids=[ref.ids(k) for k in range(ref.n_prompts)])


def main(argv: list[str] | None = None) -> None:
    """Make a capture from the command line (how the fixture's shipped CPU fp32 capture is made)."""
    import argparse

    from .platform import detect_platform
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", help="a local checkpoint folder (transformers layout)")
    p.add_argument("out", help="folder to write capture.safetensors + manifest.json into")
    p.add_argument("--prompts", default="", help="a jsonl file with 'question' fields (GSM8K layout)")
    p.add_argument("--n", type=int, default=2, help="how many prompts")
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-parts", action="store_true", help="decoder layers only, not their parts")
    a = p.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=getattr(torch, a.dtype)).to(a.device).eval()
    if a.prompts:
        lines = Path(a.prompts).read_text(encoding="utf-8").splitlines()[: a.n]
        prompts = [json.loads(line)["question"] for line in lines]
    else:
        prompts = ["Natalia sold clips to 48 of her friends in April."][: a.n]
    cap = make_capture(model, tok, prompts, max_tokens=a.max_tokens, parts=not a.no_parts,
                       model_id=portable_id(a.model), revision=weights_digest(a.model),
                       platform=detect_platform().as_dict())
    print(save_capture(cap, a.out))


if __name__ == "__main__":
    main()

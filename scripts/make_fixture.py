"""Remake the embedded fixture (fixtures/tiny-qwen2-gsm/): data, golden BF16 model, GPTQ-Int4 twin.

    python scripts/make_fixture.py data                      # train/test jsonl (seconds, deterministic)
    python scripts/make_fixture.py train --device cuda       # the golden model (~2-3 min on an H100)
    python scripts/make_fixture.py quantize                  # its GPTQ-Int4 twin with GPTQModel (CPU is fine)
    python scripts/make_fixture.py capture                   # Lab 04's CPU fp32 reference capture of the golden model
    python scripts/make_fixture.py check --device cuda       # quick greedy 5-shot accuracy of both
    python scripts/make_fixture.py all --device cuda         # all of the above, in order

Steps can be chained: after a retrained bf16/ is unpacked, `make_fixture.py quantize capture` remakes
everything that depends on the golden weights (the Int4 twin and the capture Lab 04 compares against).

Through the device tool, training and its check run in one call:
    run(carry=['.whl'], command='bash scripts/device_fixture.sh')
The official accuracy is lm-eval's, measured by scripts/fixture_accuracy.py (Lab 03's code path).
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from utils import fixture, gsm_synth  # noqa: E402


def _replace_dir(tmp: Path, dest: Path) -> None:
    """Swap a finished folder into place, so a failed step never leaves a half-made model."""
    if dest.exists():
        old = dest.with_name(dest.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        dest.rename(old)
        tmp.rename(dest)
        shutil.rmtree(old)
    else:
        tmp.rename(dest)


def cmd_data(args) -> None:
    paths = fixture.make_data(args.root)
    print(f"wrote {paths['train']} ({fixture.N_TRAIN}) and {paths['test']} ({fixture.N_TEST})")


def cmd_train(args) -> None:
    dest = fixture.fixture_paths(args.root)["golden"]
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".bf16-", dir=dest.parent))
    try:
        info = fixture.train(tmp, steps=args.steps, device=args.device, root=args.root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    (tmp / "training_log.json").write_text(json.dumps(info, indent=1))
    _replace_dir(tmp, dest)
    print(f"golden model in {dest}: {info['parameters']} parameters, {info['seconds']} s")


def cmd_quantize(args) -> None:
    paths = fixture.fixture_paths(args.root)
    tmp = Path(tempfile.mkdtemp(prefix=".int4-", dir=paths["int4"].parent))
    try:
        fixture.quantize(paths["golden"], tmp, root=args.root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _replace_dir(tmp, paths["int4"])
    print(f"GPTQ-Int4 twin in {paths['int4']}")


def cmd_capture(args) -> None:
    from utils import capture

    paths = fixture.fixture_paths(args.root)
    dest = paths["golden"].parent / "captures" / "cpu-fp32"
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".capture-", dir=dest.parent))
    tmp.chmod(0o755)
    try:
        capture.main([str(paths["golden"]), str(tmp), "--prompts", str(paths["test"]), "--n", "2",
                      "--max-tokens", "24", "--device", "cpu", "--dtype", "float32"])
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _replace_dir(tmp, dest)
    print(f"capture of {paths['golden']} in {dest}")


def cmd_check(args) -> None:
    import torch
    from utils import models

    paths = fixture.fixture_paths(args.root)
    test = gsm_synth.read_gsm8k(paths["test"])[: args.n]
    shots = random.Random(1234).sample(gsm_synth.read_gsm8k(paths["train"]), 5)
    for key in args.models:
        if not paths[key].is_dir():
            print(f"{key}: {paths[key]} missing")
            continue
        model = models.load_model(paths[key], device=args.device)
        tok = models.load_tokenizer(paths[key])
        acc = fixture.quick_accuracy(model, tok, test, shots, args.device)
        print(f"{key}: quick greedy 5-shot strict accuracy {acc:.3f} on {len(test)} held-out problems")
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", nargs="+", choices=["data", "train", "quantize", "capture", "check", "all"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--n", type=int, default=500, help="held-out problems for the quick check")
    ap.add_argument("--models", nargs="+", choices=["golden", "int4"], default=["golden", "int4"],
                    help="which models the quick check runs (an Int4 twin needs optimum and GPTQModel)")
    ap.add_argument("--root", default=None, help="fixture folder (default fixtures/tiny-qwen2-gsm)")
    args = ap.parse_args(argv)
    steps = ["data", "train", "quantize", "capture", "check"] if "all" in args.step else args.step
    for step in steps:
        globals()[f"cmd_{step}"](args)


if __name__ == "__main__":
    main()

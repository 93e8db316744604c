"""Where a data-parallel launch's fixed seconds go (Lab 03 over N GPUs divides only the generation; every
launch also pays its start, model load and exit once, whatever N). Each line runs in a fresh process, as
a worker would, on one GPU, and prints a table:

    python scripts/launch_costs.py --model /tmp/m/bf16 [--repeat 2] [--out OUT/launch_costs.md]

- imports: python alone, torch, transformers, lm-eval's HF model, the worker's own module;
- load: lm-eval's HFLM as a worker builds it (utils.evaluation.load_lm), transformers' from_pretrained onto
  the GPU (async loader on, off), and the raw safetensors files read onto the GPU (the floor); each time
  includes the process's CUDA context, which the load creates;
- exit: a process holding the model on the GPU after a compiled call, from its last line to gone, when
  it exits normally and when it leaves through os._exit (what the worker does once its files are written).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

LOADED = '\ntorch.cuda.synchronize() if D != "cpu" else None; print("T", time.time() - t)'   # a load probe's end

CHILD = {
    "python": "pass",
    "import torch": "import torch",
    "import transformers": "import torch, transformers",
    "import lm-eval HFLM": "import lm_eval.models.huggingface",
    "import the worker": "import utils.eval_parallel",
    "launch: accelerate, 1 process of `pass`": """
import subprocess, sys, tempfile, time
with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
    f.write("pass")
t = time.time()
subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
                "--mixed_precision", "no", "--dynamo_backend", "no", f.name], check=True)
print("T", time.time() - t)""",
    "load: HFLM (the worker's)": """
import torch, time; t = time.time()
from utils import evaluation as ev
lm = ev.load_lm(M, device=D, batch_size=16, dtype="auto", max_length=2048)""" + LOADED,
    "load: from_pretrained": """
import torch, time, transformers; t = time.time()
m = transformers.AutoModelForCausalLM.from_pretrained(M, dtype=torch.bfloat16, device_map={"": D})""" + LOADED,
    "load: from_pretrained, sync loader": """
import os; os.environ["HF_DEACTIVATE_ASYNC_LOAD"] = "1"
import torch, time, transformers; t = time.time()
m = transformers.AutoModelForCausalLM.from_pretrained(M, dtype=torch.bfloat16, device_map={"": D})""" + LOADED,
    "load: safetensors to GPU (floor)": """
import torch, time, glob; from safetensors.torch import load_file; t = time.time()
sd = {k: v for f in sorted(glob.glob(M + "/*.safetensors")) for k, v in load_file(f, device=D).items()}""" + LOADED,
}
EXIT = """
import torch, time, transformers, sys, os
m = transformers.AutoModelForCausalLM.from_pretrained(M, dtype=torch.bfloat16, device_map={"": D})
f = torch.compile(lambda x: torch.nn.functional.silu(x) * 2)
f(torch.ones(8, device=D))
print("DONE", time.time(), flush=True)
if FAST:
    sys.stdout.flush(); sys.stderr.flush(); os._exit(0)
"""


def timed(code: str, model: str, device: str) -> tuple[float, float | None, float | None]:
    """Wall of a fresh `python -c code` (M: the model folder), the 'T' seconds it prints, and for the exit
    probes the seconds from its 'DONE' stamp to the process gone."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    t0 = time.time()
    p = subprocess.run([sys.executable, "-c", f"M = {model!r}\nD = {device!r}\n" + code], cwd=REPO, env=env, capture_output=True,
                       text=True)
    t1 = time.time()
    if p.returncode != 0:
        raise SystemExit(f"launch_costs: {code.strip().splitlines()[0]!r} failed:\n{p.stderr[-3000:]}")
    inner = done = None
    for line in p.stdout.splitlines():
        if line.startswith("T "):
            inner = float(line.split()[1])
        if line.startswith("DONE "):
            done = t1 - float(line.split()[1])
    return t1 - t0, inner, done


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a BF16 model folder (safetensors)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--device", default="cuda:0", help="cpu: a dry run of this script")
    ap.add_argument("--out", type=Path, help="also write the table here (refused if it exists)")
    args = ap.parse_args(argv)
    if args.out and args.out.exists():
        raise SystemExit(f"--out: {args.out} exists already (nothing is overwritten)")
    for f in Path(args.model).glob("*.safetensors"):       # every measured launch finds the files in the page cache
        with open(f, "rb") as fh:
            while fh.read(1 << 26):
                pass
    rows = ["| what | process wall s, each run | measured inside s, each run | exit s, each run |", "|---|---|---|---|"]
    probes = list(CHILD.items()) + [("exit: normal", EXIT.replace("FAST", "False")),
                                    ("exit: os._exit", EXIT.replace("FAST", "True"))]
    for name, code in probes:
        runs = [timed(code, args.model, args.device) for _ in range(args.repeat)]
        cols = [", ".join("-" if v is None else f"{v:.2f}" for v in col) for col in zip(*runs)]
        rows.append(f"| {name} | " + " | ".join(cols) + " |")
        print(rows[-1], flush=True)
    text = "\n".join(rows) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A/B on one machine (issue 8): the probe's f16x2 kernel against utils.kernels.int4_gemv at the same
tile and split, interleaved, so machine-to-machine variance cannot pass for a difference.

    python scripts/gemv_ab.py      # GPU
"""
from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import gemv_probe as gp  # noqa: E402
from utils import kernels, roofline  # noqa: E402


def main():
    print(subprocess.run(["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip(), flush=True)
    for K, N, bn, nw, sk in ((3584, 18944, 512, 4, 14), (3584, 18944, 128, 1, 14), (18944, 3584, 128, 1, 37),
                             (18944, 3584, 256, 2, 37), (18944, 3584, 256, 2, 50)):
        qw, qz, s, wd = gp.shape_setup(K, N, "cuda")
        x = torch.randn(1, K, device="cuda", dtype=torch.float16)
        fns = {"probe": lambda: gp.probe_gemv(x, qw, qz, s, block_n=bn, split_k=sk, num_warps=nw, f16x2=True,
                                              prefetch=False, fixup=True),
               "utils fixed": lambda: kernels.int4_gemv(x, qw, qz, s, 128, block_n=bn, split_k=sk, num_warps=nw),
               "utils autotuned": lambda: kernels.int4_gemv(x, qw, qz, s, 128)}
        times = {k: [] for k in fns}
        for _ in range(5):
            for k, f in fns.items():
                times[k].append(roofline.time_kernel(f, "cuda") * 1e6)
        print(f"{K}->{N} bn={bn} w={nw} sk={sk}: " + "; ".join(
            f"{k} {statistics.median(v):.1f} us [{min(v):.1f}-{max(v):.1f}]" for k, v in times.items()), flush=True)
    print(subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()

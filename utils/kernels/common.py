"""What the kernel modules share: the interpreter switch, argument checks, GEMM tile configs, the cache.

Every kernel runs on a GPU (compiled, autotuned) and on a CPU through Triton's interpreter
(TRITON_INTERPRET=1, set before triton is imported) at small sizes. The interpreter has no bfloat16
and ignores input_precision (it computes the dot in numpy); `interpreter_limits()` says so, and
Lab 05 reports it rather than pretending otherwise.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INPUT_PRECISIONS = ("tf32", "tf32x3", "ieee")


def interpreted() -> bool:
    """True when Triton runs through its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def interpreter_limits() -> list[str]:
    """What the interpreter cannot show; empty on a GPU."""
    if not interpreted():
        return []
    return ["no bfloat16: bf16 GEMMs are skipped under TRITON_INTERPRET=1",
            "input_precision (tf32 / tf32x3 / ieee) is ignored: the dot runs in numpy at fp32",
            "fp16 accumulation (out_dtype=fp16) is numpy's fp16 dot, not a tensor core's"]


def require(cond: bool, msg: str) -> None:
    """A bad argument raises ValueError with `msg`, which names the argument and what it must be."""
    if not cond:
        raise ValueError(msg)




def precision(input_precision: str | None) -> str:
    """tl.dot's input_precision for matmul and grouped_matmul: "ieee" when None (tl.dot's own default on a
    GPU is tf32, which would give fp32 inputs a 10-bit mantissa without saying so)."""
    require(input_precision is None or input_precision in INPUT_PRECISIONS,
           f"input_precision must be one of {INPUT_PRECISIONS} or None, got {input_precision!r}")
    return input_precision or "ieee"


# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps): the GEMM autotuners' candidates
GEMM_TILES = [(128, 256, 64, 3, 8), (128, 256, 64, 4, 8), (256, 128, 64, 3, 8), (128, 128, 64, 4, 4),
              (128, 128, 64, 4, 8), (128, 128, 32, 4, 4), (64, 128, 64, 4, 4), (64, 64, 64, 4, 4)]


def gpu_configs() -> list:
    """The GEMM autotuners' candidate configs (GEMM_TILES, GROUP_M 8)."""
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_stages=st, num_warps=w)
            for bm, bn, bk, st, w in GEMM_TILES]


def fits_shared_memory(configs, named_args, **kwargs):
    """Drop tiles whose pipelined A and B buffers exceed ~220 KB of shared memory (fp32 needs smaller ones)."""
    size = named_args["a_ptr"].element_size()
    ok = [c for c in configs if (c.kwargs["BLOCK_M"] + c.kwargs["BLOCK_N"]) * c.kwargs["BLOCK_K"] * size
          * c.num_stages <= 220 * 1024]
    return ok or configs[-1:]


def small_config() -> dict:
    """The interpreter's fixed tile (it is slow per element, not per tile)."""
    return dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=4)


@triton.jit
def tile_of(pid, num_m, num_n, GROUP_M: tl.constexpr):
    """Grouped ordering (Triton's matmul tutorial): GROUP_M row-tiles in a row share B's tiles in L2."""
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    gsize = min(num_m - first_m, GROUP_M)
    return first_m + ((pid % group) % gsize), (pid % group) // gsize


class KernelCache:
    """Everything the kernels keep between calls, in one place (`kernels.cache`).

    - gemv_plans: (device, dtype, shapes, options) -> the Int4 GEMV's launch plan (gemv.GemvPlan), so a
      call with a shape seen before does no planning, no device queries and no allocation but its output;
    - gemv_states: the split-K fix-up's workspace and counters per device and tile (gemv_plan.gemv_state);
    - w4a16_partials: the W4A16 kernel's split-K partials per device, parts and N (w4a16_launch.split_partials);
    - devices: per device, its SM count and compute capability (queried once);
    - gluon_failure: why the Gluon grouped GEMM failed here, once it has ("auto" then skips it);
    - plans_made: how many GEMV plans were built (a cache miss each).

    reset() forgets all of it (tests use it to start clean); the next call rebuilds what it needs.
    Not thread-safe, and the GEMV's and W4A16's state must not serve two streams at once (int4_gemv says why).
    """

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.gemv_plans: dict = {}
        self.gemv_states: dict = {}
        self.w4a16_partials: dict = {}
        self.devices: dict = {}
        self.gluon_failure: str | None = None
        self.plans_made = 0

    def device_info(self, device: torch.device) -> dict:
        """{"sms", "capability", "nvidia"} of a device, queried once (a CPU: 0 SMs, capability (0, 0))."""
        info = self.devices.get(device)
        if info is None:
            cuda = device.type == "cuda"
            info = {"sms": torch.cuda.get_device_properties(device).multi_processor_count if cuda else 0,
                    "capability": tuple(torch.cuda.get_device_capability(device)) if cuda else (0, 0),
                    "nvidia": cuda and torch.version.hip is None}
            self.devices[device] = info
        return info


cache = KernelCache()

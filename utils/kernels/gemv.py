"""int4_gemv, the Int4 (GPTQ) GEMV of a decode step, and its launch plan.

A call from Python has to be cheap next to the ~12 us kernel, or an eager caller measures Python. So
everything that depends only on the shapes, dtypes, device and options is worked out once and kept in
a GemvPlan (kernels.cache.gemv_plans): the argument checks, the tile and split, the fix-up's workspace,
the kernel's constants and, once compiled, the compiled kernel itself, launched directly (Triton's
per-call dispatch, binding and specialization, skipped). A call with a plan does a dictionary lookup,
allocates its output and launches.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch
import triton

from .common import require, cache, interpreted
from .gemv_kernels import gemv_sum_kernel, int4_gemv_kernel
from .gemv_plan import (GEMV_CONFIGS, GEMV_FIXUPS, SUM_BLOCK, fixup_args, gemv_candidates, gemv_pdl, gemv_state,
                        gemv_state_words, int4_gemv_default_tile, int4_gemv_dequant, row_acc)


def _prune(configs, named_args, **kwargs):
    """The autotuner's early_config_prune: gemv_candidates for this call's shape and device."""
    x = named_args["x_ptr"]
    return gemv_candidates(named_args["K"], named_args["N"], kwargs.get("GROUP", 128),
                           cache.device_info(x.device)["sms"], gemv_pdl(x), configs)


def _sum_consts(group: int, split: int, pdl: bool) -> tuple[dict, dict]:
    """The sum kernel's constants and launch options for a split."""
    return (dict(GROUP=group, SPLIT_K=split, SPLIT_P2=triton.next_power_of_2(split), BLOCK=SUM_BLOCK, PDL=pdl),
            dict(num_warps=1, num_stages=1, **({"launch_pdl": True} if pdl else {})))


def _sum_after_bench(nargs, exception):
    """The autotuner's post_hook: a candidate that leaves its sum to the sum kernel is timed with it."""
    if exception is None and nargs["SUM_KERNEL"]:
        N, split = nargs["N"], nargs["SPLIT_K"]
        part = nargs["part_ptr"][nargs["WS_OFF"]:nargs["WS_OFF"] + split * N].view(torch.float32)
        consts, opts = _sum_consts(nargs["GROUP"], split, nargs["PDL"])
        gemv_sum_kernel[(triton.cdiv(N, SUM_BLOCK),)](part, nargs["y_ptr"], nargs["x_ptr"], nargs["qw_ptr"],
                                                       nargs["qz_ptr"], nargs["s_ptr"], nargs["K"], N, **consts, **opts)


# Timed by Triton's do_bench, which flushes L2 before each call: a decode step reads every layer's
# weights cold, and a timer that let a layer stay in L2 picked configs that were slower cold.
_int4_gemv_tuned = triton.autotune(
    configs=[triton.Config({"BLOCK_N": b, "GROUPS_PER_PROGRAM": gpp, "NUM_STAGES": st}, num_warps=w, num_stages=1)
             for b, w, gpp, st in GEMV_CONFIGS],
    post_hook=_sum_after_bench, key=["K", "N", "GROUP", "F16X2"],
    prune_configs_by={"early_config_prune": _prune})(int4_gemv_kernel)


def direct_launch(compiled, grid):
    """The compiled kernel's launcher called as Triton's own per-call wrapper calls it, on the current
    device's current stream, without the wrapper's lookups (device, stream, launch hooks, metadata): a few
    microseconds of an eager call (on Triton 3.6, its C launcher without the Python around it, which only
    allocates scratch memory these kernels do not use). None where this Triton lays its launcher out
    otherwise, or where a launch hook (a profiler's) is set: then Triton's wrapper, which reports to it (a
    hook set after a plan's first launch does not see that plan's launches)."""
    from triton import knobs
    run, fn, meta = (getattr(compiled, a, None) for a in ("run", "function", "packed_metadata"))
    stream, device = (getattr(torch._C, a, None) for a in ("_cuda_getCurrentRawStream", "_cuda_getDevice"))
    try:
        params = list(inspect.signature(run).parameters.values())
        hooked = any(h is not None and getattr(h, "calls", True) for h in (knobs.runtime.launch_enter_hook,
                                                                            knobs.runtime.launch_exit_hook))
    except (TypeError, ValueError, AttributeError):
        return None
    head = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    # (grid, stream, function, metadata, launch metadata, two hooks, the kernel's arguments): named in
    # Triton 3.9, the last six in *args in 3.6
    if hooked or None in (fn, meta, stream, device) or head[:5] != ["gridX", "gridY", "gridZ", "stream", "function"] \
            or len(head) not in (5, 9) or params[-1].kind is not params[-1].VAR_POSITIONAL:
        return None
    g0, g1, g2 = tuple(grid) + (1,) * (3 - len(grid))
    launcher = getattr(run, "__self__", None)
    raw = getattr(launcher, "launch", None)
    if triton.__version__.startswith("3.6.") and type(raw).__name__ == "builtin_function_or_method" \
            and getattr(launcher, "global_scratch_size", 1) == 0 and getattr(launcher, "profile_scratch_size", 1) == 0:
        # Triton 3.6's C launcher itself, as its Python __call__ calls it for a kernel without scratch memory
        coop, pdl = launcher.launch_cooperative_grid, launcher.launch_pdl

        def launch(*args):
            raw(g0, g1, g2, stream(device()), fn, coop, pdl, None, None, meta, None, None, None, *args)
        return launch

    def launch(*args):
        run(g0, g1, g2, stream(device()), fn, meta, None, None, None, *args)
    return launch


class Launch:
    """One kernel's launch within a plan: through Triton's JIT the first time (it compiles), then through
    the compiled kernel directly (direct_launch, or Triton's runner). Under the interpreter, or for pointers
    not 16-byte aligned (the compiled kernel assumes the alignment its first call had), always through the JIT."""

    def __init__(self, fn, grid, consts: dict, options: dict):
        self.fn, self.grid, self.consts, self.options = fn, grid, consts, options
        self.runner = None
        self.tail = None
        self.compiled = None          # Triton's compiled kernel (registers, spills, PTX/SASS), once launched

    def __call__(self, args: tuple, aligned: bool) -> None:
        if self.runner is not None and aligned:
            self.runner(*args, *self.tail)
            return
        compiled = self.compiled = self.fn[self.grid](*args, **self.consts, **self.options)
        if aligned and not interpreted() and hasattr(compiled, "__getitem__"):
            names = self.fn.arg_names[len(args):]
            self.tail = tuple(self.consts[n] for n in names)
            grid = tuple(self.grid) + (1,) * (3 - len(self.grid))
            tritons = compiled[grid]              # Triton's wrapper; it also loads the kernel's handles
            self.runner = direct_launch(compiled, grid) or tritons


@dataclass
class GemvPlan:
    """How int4_gemv runs one (device, dtypes, shapes, options): the checked shapes, the dequant, the tile
    (None until the autotuner has chosen one, on the first call), the fix-up's workspace and counters
    (shared with other plans of the same tile, gemv_plan.gemv_state) and the launches."""
    K: int
    N: int
    group_size: int
    dequant: str
    pdl: bool
    tile: dict | None
    workspace: torch.Tensor
    counters: torch.Tensor
    calls: int = 0
    _gemv: Launch | None = field(default=None, repr=False)
    _sum: Launch | None = field(default=None, repr=False)
    _part: torch.Tensor | None = field(default=None, repr=False)

    def _set_tile(self, block_n: int, split_k: int, num_warps: int, num_stages: int, sum_kernel: bool,
                  ws_off: int = 0, lock_off: int = 0) -> None:
        self.tile = {"block_n": block_n, "num_warps": num_warps, "num_stages": num_stages, "split_k": split_k,
                     "fixup": "sum kernel" if sum_kernel else "in-kernel"}
        consts = dict(GROUP=self.group_size, BLOCK_N=block_n, SPLIT_K=split_k, F16X2=self.dequant == "f16x2",
                      NUM_STAGES=num_stages, ROW_ACC=row_acc(block_n, num_warps),
                      **fixup_args(block_n, num_warps, split_k, self.N, ws_off, lock_off),
                      SUM_KERNEL=sum_kernel, PDL=self.pdl)
        self._gemv = Launch(int4_gemv_kernel, (triton.cdiv(self.N, block_n), split_k), consts,
                             dict(num_warps=num_warps, num_stages=1))
        if sum_kernel:
            self._part = self.workspace[ws_off:ws_off + split_k * self.N].view(torch.float32)
            self._sum = Launch(gemv_sum_kernel, (triton.cdiv(self.N, SUM_BLOCK),),
                                *_sum_consts(self.group_size, split_k, self.pdl))

    def run(self, x, qweight, qzeros, scales) -> torch.Tensor:
        """y [1, N] for operands of this plan's shapes (int4_gemv_plan checked them)."""
        if not (x.is_contiguous() and qweight.is_contiguous() and qzeros.is_contiguous() and scales.is_contiguous()):
            x, qweight, qzeros, scales = (t.contiguous() for t in (x, qweight, qzeros, scales))
        if x.data_ptr() % 16:
            x = x.clone()                         # f16x2 reads x 16 bytes at a time: 16-byte aligned
        y = torch.empty((1, self.N), device=x.device, dtype=x.dtype)
        self.calls += 1
        if self._gemv is None:                    # autotuned: the first call chooses the tile
            self._autotune(x, qweight, qzeros, scales, y)
            return y
        aligned = (qweight.data_ptr() | qzeros.data_ptr() | scales.data_ptr()) % 16 == 0
        self._gemv((x, qweight, qzeros, scales, y, self.workspace, self.counters, self.K, self.N), aligned)
        if self._sum is not None:
            self._sum((self._part, y, x, qweight, qzeros, scales, self.K, self.N), aligned)
        return y

    def _autotune(self, x, qweight, qzeros, scales, y) -> None:
        grid = lambda m: (triton.cdiv(self.N, m["BLOCK_N"]), m["SPLIT_K"])  # noqa: E731
        _int4_gemv_tuned[grid](x, qweight, qzeros, scales, y, self.workspace, self.counters, self.K, self.N,
                               GROUP=self.group_size, F16X2=self.dequant == "f16x2", PDL=self.pdl)
        best = _int4_gemv_tuned.best_config
        kw = best.kwargs
        self._set_tile(kw["BLOCK_N"], kw["SPLIT_K"], best.num_warps, kw["NUM_STAGES"], kw["SUM_KERNEL"],
                       kw["WS_OFF"], kw["LOCK_OFF"])
        if self._sum is not None:                 # this call's partials still need their sum
            self._sum((self._part, y, x, qweight, qzeros, scales, self.K, self.N), True)


def int4_gemv_plan(x: torch.Tensor, qweight, qzeros, scales, group_size: int = 128,
                   block_n: int | None = None, split_k: int | None = None, num_warps: int = 4,
                   dequant: str | None = None, num_stages: int = 2, fixup: str | None = None) -> GemvPlan:
    """The plan int4_gemv runs for these operands and options (arguments as int4_gemv's), made and checked
    on the first call with their device, dtypes and shapes and taken from kernels.cache after that."""
    key = (x.device, qweight.device, qzeros.device, scales.device, x.dtype, x.shape, qweight.shape, qweight.dtype,
           qzeros.shape, qzeros.dtype, scales.shape, scales.dtype, group_size, block_n, split_k, num_warps, dequant,
           num_stages, fixup)
    plan = cache.gemv_plans.get(key)
    if plan is None:
        plan = _make_plan(x, qweight, qzeros, scales, group_size, block_n, split_k, num_warps, dequant, num_stages,
                          fixup)
        cache.gemv_plans[key] = plan
        cache.plans_made += 1
    return plan


def _make_plan(x, qweight, qzeros, scales, group_size, block_n, split_k, num_warps, dequant, num_stages, fixup):
    require(x.ndim == 2 and x.shape[0] == 1, f"x must be [1, K] (batch 1 decode), got {tuple(x.shape)}")
    K, N = qweight.shape[0] * 8, qweight.shape[1]
    require(x.shape[1] == K, f"x has K={x.shape[1]} but qweight packs K={K}")
    require(qweight.dtype == torch.int32 and qzeros.dtype == torch.int32,
           "qweight and qzeros must be int32 (GPTQ packing)")
    require(qweight.device == x.device and qzeros.device == x.device and scales.device == x.device,
           f"x, qweight, qzeros and scales must be on one device, got {x.device}, {qweight.device}, "
           f"{qzeros.device}, {scales.device}")
    require(group_size >= 8 and group_size & (group_size - 1) == 0,
           f"group_size must be a power of two of at least 8 (GPTQ uses 32, 64, 128), got {group_size}")
    require(K % group_size == 0 and scales.shape == (K // group_size, N),
           f"scales must be [K/group_size, N] = {(K // group_size, N)}, got {tuple(scales.shape)}")
    require(N % 8 == 0 and qzeros.shape == (K // group_size, N // 8),
           f"qzeros must be [K/group_size, N/8] = {(K // group_size, N // 8)}, got {tuple(qzeros.shape)}")
    auto = int4_gemv_dequant(x)
    dequant = dequant or auto
    require(isinstance(num_stages, int) and num_stages >= 1, f"num_stages must be an int >= 1, got {num_stages!r}")
    require(dequant in ("f32", "f16x2") and (dequant == "f32" or auto == "f16x2"),
           f"dequant must be 'f32', or 'f16x2' for fp16 x on an NVIDIA GPU (here: {auto!r}), got {dequant!r}")
    require(dequant == "f32" or group_size >= 16,      # f16x2 takes two packed rows per asm call
           f"the f16x2 dequant needs group_size >= 16, got {group_size}: pass dequant='f32'")
    fixed = interpreted() or block_n is not None or split_k is not None
    require(fixup is None or (fixup in GEMV_FIXUPS and fixed),
           f"fixup must be one of {GEMV_FIXUPS}, given with block_n and split_k (autotuned calls choose their "
           f"own), got {fixup!r}")
    tile = None if fixed else int4_gemv_default_tile(x, K, N, group_size, dequant)
    if tile is not None:
        block_n, split_k, num_warps, num_stages, fixup = (tile[k] for k in ("block_n", "split_k", "num_warps",
                                                                             "num_stages", "fixup"))
        fixed = True
    ng = K // group_size
    pdl = gemv_pdl(x)
    if not fixed:   # one state for all of this shape's candidates, each its own slice of it (gemv_candidates)
        def sizes():
            each = [gemv_state_words(c.kwargs["BLOCK_N"], c.kwargs["SPLIT_K"], N)
                    for c in _prune(_int4_gemv_tuned.configs, {"K": K, "N": N, "x_ptr": x}, GROUP=group_size)]
            return sum(w for w, _ in each), sum(c for _, c in each)
        work, locks = gemv_state(x.device, ("tuned", K, N, group_size), sizes)
        return GemvPlan(K, N, group_size, dequant, pdl, None, work, locks)
    block_n = block_n or (32 if interpreted() else 256)
    split_k = max(1, min(split_k or 1, ng))
    sum_kernel = fixup == "sum kernel" and split_k > 1
    # the sum kernel's partials are plain floats: never in a workspace the tagged fix-up reads
    work, locks = gemv_state(x.device, ("fixed", N, block_n, split_k) + (("sum kernel",) if sum_kernel else ()),
                             lambda: gemv_state_words(block_n, split_k, N))
    plan = GemvPlan(K, N, group_size, dequant, pdl, None, work, locks)
    plan._set_tile(block_n, split_k, num_warps, num_stages, sum_kernel)
    return plan


def int4_gemv(x: torch.Tensor, qweight, qzeros, scales, group_size: int = 128,
              block_n: int | None = None, split_k: int | None = None, num_warps: int = 4,
              dequant: str | None = None, num_stages: int = 2, fixup: str | None = None) -> torch.Tensor:
    """y [1, N] = x [1, K] @ dequant(W), the weights dequantized inside the kernel (the decode step).

    Per group and column: sum_k (q - z) x_k, times the group's scale, accumulated in fp32; split over K,
    the partials summed in a fixed order (the same bits every run) by one of two fix-ups (GEMV_FIXUPS):
    "in-kernel" (the last program of a column block sums them) or "sum kernel" (a second kernel does,
    launched with PDL on sm_90+, gemv_pdl). Autotuned calls take the fix-up that their tile's split
    calls for (gemv_plan.takes_sum_kernel); with block_n and split_k given, fixup picks it (default
    "in-kernel"). dequant "f32" is exact; "f16x2" (the default for fp16 x on NVIDIA, int4_gemv_dequant)
    rounds each product and 8-term sum to fp16, about 2^-11 relative, and redoes a column block in "f32"
    if fp16 overflowed. On an sm_90 GPU with the f16x2 dequant, block_n and split_k left None take the
    measured tile (gemv_hopper_tile); on other GPUs they, with num_warps, are autotuned per shape on the
    first call. Give block_n and split_k to fix them (and num_stages, how many groups of codes are in
    flight per program; the interpreter ignores it).

    The first call with a (device, dtypes, shapes, options) plans it (int4_gemv_plan); later calls reuse
    the plan. Call it once before capturing it in a CUDA graph: the plan, autotuning and the fix-up's
    state are made outside the graph. Not on two streams at once: calls of one tile share that state.
    """
    return int4_gemv_plan(x, qweight, qzeros, scales, group_size, block_n, split_k, num_warps, dequant,
                          num_stages, fixup).run(x, qweight, qzeros, scales)

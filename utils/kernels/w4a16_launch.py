"""The tile a W4A16 call gets and its launch plan: which kernel, how wide, how K is split, and how the
split-K partials are summed (w4a16.py's functions call it; the kernels are in w4a16_kernels.py and
w4a16_fragment.py).

Split-K partials are summed in a fixed order, 0, 1, ..., so a call's bits never depend on timing: by a second,
small kernel, or (the Gluon kernel, where its last program's reads stay small) by each column block's last
program to arrive, one launch less. Both orders are the same, so both give the same bits.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
import triton

from .common import cache, interpreted
from .gemv import Launch
from . import w4a16_fragment
from .w4a16_kernels import w4a16_kernel, w4a16_sum_kernel

W4A16_MAX_ROWS = 16           # rows the fused kernel takes (one 16-row tensor-core tile); more: dequant + cuBLAS
V1_ZERO_WORD = 0x11111111     # what the GPTQ v1 layout subtracted from each qzeros word (utils.gptq)
SUM_BLOCK = 256

@dataclass(frozen=True)
class W4A16Tile:
    """The launch shape: columns per program, K rows per step, split-K, warps, and the loop's pipeline depth
    (num_stages: how many K steps' loads Triton keeps in flight ahead of the one computed), and how the packed
    codes are unpacked (UNPACKS: the weight tile as the second operand of the tile product, each word loaded
    once then reshaped, or once per row it feeds; or transposed as the first operand, unpacked word by word
    in its thread, in Triton or in PTX; or loaded straight into the tensor-core operand's layout by the Gluon
    kernel, 'fragment' (NVIDIA sm_80+): 64 or 128 columns, 128 K rows per step, 4 warps, w4a16_fragment.py;
    its num_stages 1 or 2 are steps loaded ahead into registers, from 3 a ring of that many shared-memory slots)."""
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int = 2
    unpack: str = "reshape"


UNPACKS = ("reshape", "rows", "join", "ptx", "fragment")    # the Triton kernel's UNPACK 0..3; 'fragment': Gluon


def w4a16_block_k(K: int, group_size: int) -> int:
    """K rows per step: the largest power of two up to 128 dividing both K and the group (one group per
    tile, so a tile reads one row of scales and zeros), at least 16 (a tensor-core step)."""
    b = 128
    while b >= 16 and (K % b or group_size % b):
        b //= 2
    return b


PROGRAMS_PER_SM = 8           # the split-K aims at about this many programs per SM (docs/kernels.md)


def fragment_refusal(x_dtype, device, K: int, group_size: int, scales_dtype, act_order: bool) -> str | None:
    """Why the Gluon 'fragment' kernel cannot serve a call, or None when it can."""
    if w4a16_fragment.w4a16_fragment_kernel is None:
        return "a Triton whose Gluon has mma_v2 and num_warps (3.6 or later; 3.5 has neither)"
    if interpreted() or torch.device(device).type != "cuda" or torch.version.hip is not None \
            or torch.cuda.get_device_capability(device)[0] < 8:
        return "an NVIDIA GPU from Ampere on (sm_80+: mma.sync on 16-bit operands)"
    if act_order or scales_dtype != torch.float16 or x_dtype not in (torch.float16, torch.bfloat16):
        return "float16 scales, float16 or bfloat16 x, and no act-order"
    if K % w4a16_fragment.BLOCK_K or group_size < 32:
        return f"K a multiple of {w4a16_fragment.BLOCK_K} and groups of at least 32 rows"
    return None


def w4a16_default_unpack(scales_dtype: torch.dtype, act_order: bool, x: torch.Tensor | None = None,
                         group_size: int = 128) -> str:
    """The unpacking a call gets: on Hopper (sm_90, where it was measured against the rest) the Gluon kernel
    where it serves the call (x; K = x's last dimension), which sm_80/89 run only when a tile asks for it.
    Otherwise the weight as the first operand, unpacked in PTX (fp16 scales, NVIDIA) or in Triton (other
    scales, ROCm, or the interpreter, which run no PTX); act-order's per-row groups: 'reshape'."""
    if act_order:
        return "reshape"
    if x is not None and fragment_refusal(x.dtype, x.device, x.shape[-1], group_size, scales_dtype, act_order) is None \
            and torch.cuda.get_device_capability(x.device)[0] == 9:
        return "fragment"
    return "ptx" if scales_dtype == torch.float16 and not interpreted() and torch.version.hip is None else "join"


def w4a16_default_tile(M: int, K: int, N: int, group_size: int, sms: int, unpack: str = "ptx",
                       gated: bool = False) -> W4A16Tile:
    """The tile a call gets unless told otherwise: 64 columns on 4 warps (one warpgroup); the split-K that
    gives about PROGRAMS_PER_SM programs per SM, each over whole K steps; a 3-deep load pipeline (4 for
    'reshape'). Chosen from cold sweeps on the H100 at Qwen2.5-7B's shapes, M = 1 and 16 (docs/kernels.md);
    the same rule for every M up to 16, so a batch changes no summation order.
    Under the interpreter one wide program per up to 256 columns (it is slow per program, not per element).
    'fragment': 128 columns (64 gated: two weights' registers), K steps of 128, the largest split whose programs
    all fit the GPU at once at every M (w4a16_fragment.PROGRAMS_PER_SM: one wave, never a partial second);
    loads one step ahead into registers, from RING_ROWS rows (and at one row, gated) through a ring of
    RING_STAGES slots in shared memory (the same bits): its sweeps on the H100."""
    per_sm = PROGRAMS_PER_SM
    if unpack == "fragment":
        block_k, block_n = w4a16_fragment.BLOCK_K, (64 if gated else w4a16_fragment.BLOCK_N)
        per_sm = w4a16_fragment.GATED_PROGRAMS_PER_SM if gated else w4a16_fragment.PROGRAMS_PER_SM
    else:
        block_k, block_n = w4a16_block_k(K, group_size), 64
    if interpreted():             # numpy's cost is per program and step: few, wide programs
        return W4A16Tile(max(16, min(256, triton.next_power_of_2(N))), block_k, 1, 1, 1, unpack)
    steps = K // block_k
    n_blocks = triton.cdiv(N, block_n)
    if unpack == "fragment":       # one wave: as many programs as fit at once
        split = max(1, min(steps, per_sm * max(sms, 1) // n_blocks))
    else:
        split = max(1, min(steps, triton.cdiv(per_sm * max(sms, 1), n_blocks)))
    per = triton.cdiv(steps, split)
    split = triton.cdiv(steps, per)                             # no program left without a K step
    if unpack == "fragment":       # the ring in shared memory (w4a16_fragment.uses_ring): the same bits either way
        stages = w4a16_fragment.RING_STAGES if w4a16_fragment.uses_ring(M, gated) else w4a16_fragment.DEPTH
        return W4A16Tile(block_n, block_k, split, w4a16_fragment.WARPS, stages, unpack)
    return W4A16Tile(block_n, block_k, split, 4, 4 if unpack == "reshape" and per >= 4 else 3, unpack)


def kept_zeros(device: torch.device, n: int, dtype: torch.dtype) -> torch.Tensor | None:
    """n zeros that a plan keeps across calls, or None while this thread captures a CUDA graph (the plan then
    does without them: a per-call allocation, or the sum kernel, the same bits). Made on a thread of its own:
    while torch.compile's CUDA graphs warm up they send the calling thread's allocations to their memory pool,
    which must hold nothing that outlives them, and these outlive every graph."""
    if device.type != "cuda":
        return torch.zeros(n, dtype=dtype, device=device)
    if torch.cuda.is_current_stream_capturing():
        return None
    made: list = []

    def make():
        try:
            made.append(torch.zeros(n, dtype=dtype, device=device))
        except BaseException as exc:  # noqa: BLE001 - raised again on the calling thread
            made.append(exc)

    worker = threading.Thread(target=make, name="w4a16-kept-zeros")
    worker.start()
    worker.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    torch.cuda.synchronize(device)          # zeroed on the worker's stream before any call of ours reads them
    return made[0]


def split_partials(device: torch.device, parts: int, M: int, N: int) -> torch.Tensor | None:
    """The split-K partials [parts, M, N] (fp32) for a plan's calls: a view of one workspace per device, parts
    and N, sized for W4A16_MAX_ROWS rows and shared by the plans of every M (kernels.cache.w4a16_partials), so
    an eager call allocates only its output. None while capturing a CUDA graph (a call then allocates them).
    Like the counts, shared by every stream: calls must not run on two streams at once."""
    key = (device, parts, N)
    ws = cache.w4a16_partials.get(key)
    if ws is None:
        ws = kept_zeros(device, parts * W4A16_MAX_ROWS * N, torch.float32)
        if ws is None:
            return None
        cache.w4a16_partials[key] = ws
    return ws[:parts * M * N].view(parts, M, N)


class W4A16Plan:
    """How w4a16_matmul (or w4a16_gated_silu: gated) runs one (device, dtypes, shapes, options): the tile and
    its launches, made and checked once; a call then allocates its output and launches.
    pdl: the sum kernel launches as a programmatic dependent of the GEMM (sm_90), hiding its launch gap.
    partials: the split-K partials' workspace (split_partials), kept, as are counts: the Gluon kernel's arrival
    counts when its last program sums the partials (w4a16_fragment.last_sum). Both are shared by every call, so
    calls must not run on two streams of a device at once (one stream, or a CUDA graph replayed on it: fine)."""

    def __init__(self, M, K, N, group_size, zero_format, act_order, has_bias, tile: W4A16Tile, precision,
                 device: torch.device, gated: bool = False, pdl: bool = False):
        self.M, self.K, self.N, self.group_size, self.tile = M, K, N, group_size, tile
        self.act_order, self.has_bias, self.gated = act_order, has_bias, gated
        pdl = pdl and tile.split_k > 1 and tile.unpack != "fragment"
        grid = (triton.cdiv(N, tile.block_n), tile.split_k)
        self.counts = None
        if tile.unpack == "fragment" and w4a16_fragment.last_sum(M, tile.split_k, tile.block_n, gated):
            self.counts = kept_zeros(device, grid[0], torch.int32)
        self.counts_ptr = None if self.counts is None else self.counts.data_ptr()
        zp_add = V1_ZERO_WORD if zero_format == 1 else 0
        self.unaligned = None           # the launch for operands not 16-byte aligned, where it differs
        if tile.unpack == "fragment":
            fragment = lambda stages: Launch(  # noqa: E731
                w4a16_fragment.w4a16_fragment_kernel, grid,
                dict(GROUP=group_size, ZP_ADD=zp_add, HAS_BIAS=has_bias, BLOCK_M=16, BLOCK_N=tile.block_n,
                     SPLIT_K=tile.split_k, GATED=gated, LAST_SUM=self.counts is not None, SUM_ROWS=1 if M == 1 else 16,
                     **w4a16_fragment.pipeline(M, stages)),
                dict(num_warps=tile.num_warps))
            self.gemm = fragment(tile.num_stages)
            if tile.num_stages >= w4a16_fragment.RING_FROM:      # cp.async copies whole 4- to 16-byte runs
                self.unaligned = fragment(1)
        else:
            self.gemm = Launch(w4a16_kernel, grid,
                               dict(GROUP=group_size, ZP_ADD=zp_add, ACT_ORDER=act_order, HAS_BIAS=has_bias,
                                    BLOCK_M=16, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, SPLIT_K=tile.split_k,
                                    PRECISION=precision, UNPACK=UNPACKS.index(tile.unpack), GATED=gated, PDL=pdl),
                               dict(num_warps=tile.num_warps, num_stages=tile.num_stages))
        self.sum = None
        if tile.split_k > 1 and self.counts is None:
            self.sum = Launch(w4a16_sum_kernel, (triton.cdiv(M * N, SUM_BLOCK),),
                               dict(SPLIT_K=tile.split_k, HAS_BIAS=has_bias, BLOCK=SUM_BLOCK, GATED=gated, PDL=pdl),
                               dict(num_warps=4, num_stages=1, **({"launch_pdl": True} if pdl else {})))
        self.parts = (2 if gated else 1) * tile.split_k
        self.partials = split_partials(device, self.parts, M, N) if tile.split_k > 1 else None
        self.shape = (M, N)
        self.cuda_index = device.index if device.type == "cuda" else None
        self.calls = 0

    def run(self, x, qweight, qzeros, scales, g_idx, bias, second=None) -> torch.Tensor:
        """second: the gated plan's other weight, (qweight, qzeros, scales, bias) of the up projection.
        Triton launches on the current device: a model sharded over GPUs calls with x on another one."""
        # torch.cuda.current_device() without its Python around it
        if self.cuda_index is not None and self.cuda_index != torch._C._cuda_getDevice():
            with torch.cuda.device(x.device):
                return self._launch(x, qweight, qzeros, scales, g_idx, bias, second)
        return self._launch(x, qweight, qzeros, scales, g_idx, bias, second)

    def launch_args(self, x, qweight, qzeros, scales, g_idx, bias, y, part, second=None,
                    pointers: bool = False) -> tuple[tuple, tuple, bool]:
        """The GEMM's and the sum kernel's arguments, in their order, for output y and split-K partials part (a
        missing g_idx, bias or second weight stands in by another tensor the kernel does not read), and
        whether the operands are 16-byte aligned (y and part: fresh from the allocator, aligned).
        pointers: where aligned, each tensor by its address, which a compiled kernel's launcher takes as is,
        without asking every tensor for it and the driver whether it lies on a GPU (the plan's key names every
        operand's device): a few microseconds of an eager call. Only for launches already compiled."""
        g = g_idx if g_idx is not None else qweight
        b = bias if bias is not None else y
        qw2, qz2, s2, b2 = (qweight, qzeros, scales, b) if second is None else second
        b2 = b2 if b2 is not None else y
        px, pw, pz, ps, pg, pb, py = (x.data_ptr(), qweight.data_ptr(), qzeros.data_ptr(), scales.data_ptr(),
                                      g.data_ptr(), b.data_ptr(), y.data_ptr())
        second_ptrs = (pw, pz, ps, pb) if second is None else (qw2.data_ptr(), qz2.data_ptr(), s2.data_ptr(),
                                                               b2.data_ptr())
        aligned = (px | pw | pz | ps | pg | pb | second_ptrs[0] | second_ptrs[1] | second_ptrs[2]
                   | second_ptrs[3]) % 16 == 0
        if pointers and aligned:
            t = (px, pw, pz, ps, pg, pb, py, py if part is y else part.data_ptr(), *second_ptrs,
                 py if self.counts is None else self.counts_ptr)
        else:
            t = (x, qweight, qzeros, scales, g, b, y, part, qw2, qz2, s2, b2,
                 self.counts if self.counts is not None else y)
        fragment = self.tile.unpack == "fragment"          # the Gluon kernel also takes the arrival counts
        return ((*t[:12], self.M, self.K, self.N, self.K, *t[12:13 if fragment else 12]),
                (t[7], t[5], t[11], t[6], self.M * self.N, self.N), aligned)

    def _launch(self, x, qweight, qzeros, scales, g_idx, bias, second) -> torch.Tensor:
        y = x.new_empty(self.shape)
        part = y if self.tile.split_k == 1 else self.partials
        if part is None:
            part = torch.empty((self.parts, self.M, self.N), device=x.device, dtype=torch.float32)
        compiled = self.gemm.runner is not None and (self.sum is None or self.sum.runner is not None)
        gemm_args, sum_args, aligned = self.launch_args(x, qweight, qzeros, scales, g_idx, bias, y, part, second,
                                                        pointers=compiled)
        self.calls += 1
        (self.gemm if aligned or self.unaligned is None else self.unaligned)(gemm_args, aligned)
        if self.sum is not None:
            self.sum(sum_args, aligned)
        return y

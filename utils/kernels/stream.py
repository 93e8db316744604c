"""The read floor: a kernel that only reads, the bound for any memory-bound kernel moving the same bytes."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import require


@triton.jit
def _stream_read_kernel(q_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    q = tl.load(q_ptr + offs, mask=offs < n, other=0, eviction_policy="evict_first")
    tl.store(out_ptr + tl.program_id(0), tl.xor_sum(q, axis=0))


def stream_read(t: torch.Tensor, block: int = 4096) -> torch.Tensor:
    """Read every 32-bit word of t once and do nothing else: what a memory-bound kernel that moves the
    same bytes can hope for on this device (the copy bandwidth also writes). Each program xors `block`
    words (so the reads are not optimized away) and the int32 xors are returned, one per block."""
    require(t.is_contiguous() and (t.numel() * t.element_size()) % 4 == 0 and t.data_ptr() % 4 == 0,
           f"stream_read needs a contiguous tensor whose bytes are a multiple of 4 bytes, 4-byte aligned; "
           f"got {tuple(t.shape)} {t.dtype}")
    require(block >= 16 and block & (block - 1) == 0, f"block must be a power of two >= 16, got {block}")
    words = t.reshape(-1).view(torch.uint8).view(torch.int32)
    out = torch.empty(triton.cdiv(words.numel(), block), device=t.device, dtype=torch.int32)
    _stream_read_kernel[(out.numel(),)](words, out, words.numel(), BLOCK=block, num_warps=4)
    return out

"""The grouped GEMM on Hopper (sm_90), written in Gluon and warp-specialized: `kernels.grouped_matmul`'s
"gluon" kernel.

Why a second language: Triton's compiler pipelines the grouped GEMM well per tile, but every warp of
its kernel issues each k-step's TMA loads (predicated off in all but one thread), the CTA barriers
around them and the waits: more instructions than cuBLAS for the same tiles, which on a power-capped
GPU is energy and so clock. Gluon, Triton's lower-level language, lets the kernel say which warps do
what:

- one **producer** warp issues every TMA load (A [128 x 64] and B [64 x 256] per k-step) into a ring of
  STAGES shared-memory stages, and waits only for a stage to be handed back (`empty`);
- the **compute** warps (two warp groups, 8 warps) wait for a stage to land (`ready`), run its wgmma
  (128 x 256 x 64, fp32 accumulator), hand back the stage before it, and at a tile's end write the tile
  with one TMA store that finishes in the background;
- the kernel is **persistent**: one program per SM walks tiles pid, pid + programs, ... of every group
  (GROUP_M row-tiles side by side in a group), so the producer loads the next tile's first stages while
  the compute warps store this one.

It runs level with the torch.matmul loop (cuBLAS) where each group fills the GPU and ahead of it on
smaller groups; the variants that were tried and lost are listed in docs/kernels.md. Needs a Triton
with Gluon (3.5+); compiled on first use.
Rows of a tile past its group's end (ragged groups) are read (the next group's rows, or TMA's zero
fill) and never stored: such a tile is written by masked stores from registers instead.
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .common import cache

# the tile that measured fastest (docs/kernels.md: other tiles, stages, GROUP_M and producer registers lost)
BLOCK_M, BLOCK_N, BLOCK_K, STAGES, COMPUTE_WARPS, GROUP_M, PRODUCER_REGS = 128, 256, 64, 3, 8, 16, 40
GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}
# TMA's load and store under the names of the Triton at hand (3.6 has only the long ones; later ones
# renamed them and made the long ones raise)
_tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
_tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global


@gluon.constexpr_function
def _acc_layout(block_m, block_n, num_warps):
    """The wgmma accumulator: warps stacked along M (16 rows each, 4 warps to a warp group), one
    instruction N-wide (n <= 256)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, block_n, 16])


@gluon.jit
def _tile_origin(tile, group_ends_ptr, per_group, num_m, num_n, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 GROUP_M: gl.constexpr):
    """(group, its first row, the tile's row and column offsets in the group): tiles counted with the
    largest group's rows, GROUP_M row-tiles side by side (Triton's matmul tutorial ordering)."""
    g = tile // per_group
    r = tile % per_group
    width = GROUP_M * num_n
    first_m = (r // width) * GROUP_M
    rows = gl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (r % width) % rows
    pid_n = (r % width) // rows
    start = gl.where(g > 0, gl.load(group_ends_ptr + gl.maximum(g - 1, 0)), 0)
    return g, start, pid_m * BLOCK_M, pid_n * BLOCK_N


@gluon.jit
def _masked_store(out, c_ptr, start, off_m, off_n, Mg, N, layout: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr):
    """The rows of the tile that are its group's (Mg rows from start), from registers."""
    offs_m = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    offs_n = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
    mask = (offs_m < Mg)[:, None] & (offs_n < N)[None, :]
    gl.store(c_ptr + (start + offs_m)[:, None] * N + offs_n[None, :], out, mask=mask)


@gluon.jit
def _store_tile(acc, c_desc, c_ptr, c_smem, start, off_m, off_n, Mg, N, TMA_STORE: gl.constexpr):
    """A tile inside its group, with TMA_STORE: one TMA store from shared memory, left to finish in the
    background (waited for before c_smem is written again). Otherwise, or a tile past its group's end:
    masked stores from registers."""
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    out = acc.to(c_desc.dtype)
    layout: gl.constexpr = acc.type.layout
    if TMA_STORE:
        if off_m + BLOCK_M <= Mg:
            tma.store_wait(0)
            c_smem.store(out)
            fence_async_shared()
            _tma_store(c_desc, [start + off_m, off_n], c_smem)
        else:
            _masked_store(out, c_ptr, start, off_m, off_n, Mg, N, layout, BLOCK_M, BLOCK_N)
    else:
        _masked_store(out, c_ptr, start, off_m, off_n, Mg, N, layout, BLOCK_M, BLOCK_N)


@gluon.jit
def _shared_buffers(a_desc, b_desc, c_desc, STAGES: gl.constexpr, TMA_STORE: gl.constexpr):
    """The ring's STAGES A and B tiles, and the tile the TMA store reads (without TMA_STORE none: a_bufs
    stands in, unused)."""
    dtype: gl.constexpr = a_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    if TMA_STORE:
        c_smem = gl.allocate_shared_memory(dtype, c_desc.block_type.shape, c_desc.layout)
    else:
        c_smem = a_bufs
    return a_bufs, b_bufs, c_smem


@gluon.jit
def _tile_count(G, MAX_ROWS, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    num_m = gl.cdiv(MAX_ROWS, BLOCK_M)
    num_n = gl.cdiv(N, BLOCK_N)
    return num_m, num_n, num_m * num_n, G * num_m * num_n


@gluon.jit
def _producer(a_desc, b_desc, a_bufs, b_bufs, ready, empty, group_ends_ptr, G, N, K, MAX_ROWS,
              GROUP_M: gl.constexpr, STAGES: gl.constexpr):
    """One warp: every k-step's A and B tiles of this program's tiles, into the ring, STAGES ahead."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[1]
    num_m, num_n, per_group, total = _tile_count(G, MAX_ROWS, N, BLOCK_M, BLOCK_N)
    k_tiles = K // BLOCK_K
    step = 0
    for tile in range(gl.program_id(0), total, gl.num_programs(0)):
        g, start, off_m, off_n = _tile_origin(tile, group_ends_ptr, per_group, num_m, num_n, BLOCK_M, BLOCK_N, GROUP_M)
        for k in range(k_tiles):
            slot = step % STAGES
            mbarrier.wait(empty.index(slot), ((step // STAGES) & 1) ^ 1)    # the compute warps freed it
            mbarrier.expect(ready.index(slot), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            _tma_load(a_desc, [start + off_m, k * BLOCK_K], ready.index(slot), a_bufs.index(slot))
            _tma_load(b_desc, [g * K + k * BLOCK_K, off_n], ready.index(slot), b_bufs.index(slot))
            step += 1


@gluon.jit
def _compute(a_bufs, b_bufs, ready, empty, c_desc, c_ptr, c_smem, group_ends_ptr, G, N, K, MAX_ROWS,
             GROUP_M: gl.constexpr, STAGES: gl.constexpr, TMA_STORE: gl.constexpr, num_warps: gl.constexpr):
    """The default partition (num_warps warps, two warp groups at 8): wait for a stage, its wgmma, free
    the one before; at a tile's end its epilogue."""
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_bufs.type.shape[2]
    num_m, num_n, per_group, total = _tile_count(G, MAX_ROWS, N, BLOCK_M, BLOCK_N)
    k_tiles = K // BLOCK_K
    acc = gl.zeros((BLOCK_M, BLOCK_N), gl.float32, layout=_acc_layout(BLOCK_M, BLOCK_N, num_warps))
    step = 0
    for tile in range(gl.program_id(0), total, gl.num_programs(0)):
        for k in range(k_tiles):
            slot = step % STAGES
            mbarrier.wait(ready.index(slot), (step // STAGES) & 1)
            acc = warpgroup_mma(a_bufs.index(slot), b_bufs.index(slot), acc, use_acc=k > 0, is_async=True)
            acc = warpgroup_mma_wait(1, deps=[acc])
            if k > 0:                                   # the step before is done: its stage is free
                mbarrier.arrive(empty.index((step - 1) % STAGES), count=1)
            step += 1
        acc = warpgroup_mma_wait(0, deps=[acc])
        mbarrier.arrive(empty.index((step - 1) % STAGES), count=1)
        g, start, off_m, off_n = _tile_origin(tile, group_ends_ptr, per_group, num_m, num_n, BLOCK_M, BLOCK_N, GROUP_M)
        Mg = gl.load(group_ends_ptr + g) - start
        _store_tile(acc, c_desc, c_ptr, c_smem, start, off_m, off_n, Mg, N, TMA_STORE)
    tma.store_wait(0)


@gluon.jit
def grouped_ws_kernel(a_desc, b_desc, c_desc, c_ptr, group_ends_ptr, G, N, K, MAX_ROWS, STAGES: gl.constexpr,
                       GROUP_M: gl.constexpr, PRODUCER_REGS: gl.constexpr, TMA_STORE: gl.constexpr,
                       num_warps: gl.constexpr):
    """Persistent and warp-specialized: one producer warp, num_warps compute warps; a ring stage is
    handed over by `ready` (its loads landed) and `empty` (its wgmma is done)."""
    a_bufs, b_bufs, c_smem = _shared_buffers(a_desc, b_desc, c_desc, STAGES, TMA_STORE)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    gl.warp_specialize([
        (_compute, (a_bufs, b_bufs, ready, empty, c_desc, c_ptr, c_smem, group_ends_ptr, G, N, K, MAX_ROWS, GROUP_M,
                    STAGES, TMA_STORE, num_warps)),
        (_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, group_ends_ptr, G, N, K, MAX_ROWS, GROUP_M, STAGES)),
    ], [1], [PRODUCER_REGS])


def descriptors(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, block_m: int, block_n: int, block_k: int):
    """TMA descriptors of A [rows, K], B viewed as [G*K, N] and C [rows, N], each with its tile's block
    shape and the widest swizzle that tile allows."""
    G, K, N = b.shape
    dt = GL_DTYPES[a.dtype]
    lay = gl.NVMMASharedLayout.get_default_for
    return (TensorDescriptor.from_tensor(a, [block_m, block_k], lay([block_m, block_k], dt)),
            TensorDescriptor.from_tensor(b.reshape(G * K, N), [block_k, block_n], lay([block_k, block_n], dt)),
            TensorDescriptor.from_tensor(c, [block_m, block_n], lay([block_m, block_n], dt)))


def grouped_matmul_ws(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, max_rows: int, block_m: int = BLOCK_M,
                      block_n: int = BLOCK_N, block_k: int = BLOCK_K, stages: int = STAGES,
                      warps: int = COMPUTE_WARPS, group_m: int = GROUP_M, producer_regs: int = PRODUCER_REGS,
                      tma_store: bool = True) -> torch.Tensor:
    """out[offs[g-1]:offs[g]] = a[...] @ b[g], on an sm_90 GPU. Operands as `kernels.grouped_matmul`
    checks them (fp16/bf16, contiguous, K % block_k == 0, N % 8 == 0); the tile knobs default to the measured tile."""
    G, K, N = b.shape
    c = torch.empty((a.shape[0], N), device=a.device, dtype=a.dtype)
    a_desc, b_desc, c_desc = descriptors(a, b, c, block_m, block_n, block_k)
    sms = cache.device_info(a.device)["sms"]
    tiles = G * triton.cdiv(max(max_rows, 1), block_m) * triton.cdiv(N, block_n)
    grouped_ws_kernel[(min(sms, tiles),)](a_desc, b_desc, c_desc, c, offs, G, N, K, max_rows, STAGES=stages,
                                          GROUP_M=group_m, PRODUCER_REGS=producer_regs, TMA_STORE=tma_store,
                                          num_warps=warps)
    return c

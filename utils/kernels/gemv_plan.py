"""How the Int4 GEMV is launched: its tile (columns per program, warps, stages), its split-K, which
fix-up adds the partials, and the fix-up's workspace. All of it is host-side arithmetic, done once per
shape and device (gemv.int4_gemv_plan caches the result); docs/kernels.md has the measurements behind
each rule.
"""
from __future__ import annotations

import torch
import triton

from .common import cache, interpreted
from .gemv_kernels import gdc_wait

GEMV_FIXUPS = ("in-kernel", "sum kernel")

# The autotuner's candidates, (block_n, num_warps, groups per program, NUM_STAGES). block_n = 128 x
# num_warps gives each thread all rows of its 4 columns (16-byte loads, a thread-local sum over rows);
# narrower tiles spread a group's rows over the warp (ROW_ACC). Groups per program 0 means "as many
# programs per column block as fill one wave of resident warps" (gemv_one_wave_split): the fastest grids
# measured cold were those, because a second wave costs more than the split saves.
GEMV_CONFIGS = [(512, 4, 2, 2), (512, 4, 4, 2), (256, 2, 2, 2), (256, 2, 4, 2), (128, 1, 2, 2), (128, 2, 4, 1),
                (128, 2, 4, 2), (512, 4, 4, 1), (256, 2, 2, 1), (128, 1, 2, 1), (32, 1, 5, 1), (32, 1, 0, 1)]
# The sum kernel (a second kernel adds the partials, launched with PDL) beat the in-kernel fix-up only
# for many partials on the 32-column one-warp tile; elsewhere it lost or was not measured. So the split
# decides the fix-up, not the autotuner (which, timing one launch at a time, did not pick it).
SUM_MIN_SPLIT = 16
SUM_TILE = (32, 1)            # (BLOCK_N, num_warps) of the tiles that take the sum kernel
SUM_BLOCK = 32                # columns per program of the sum kernel (one warp)
# Registers of the 32-column one-warp tile compiled for sm_90 by Triton 3.6: they size its one-wave
# split. Another compiler or GPU may give another count; the candidate is timed like the others anyway.
ONE_WAVE_REGS = 72


def resident_programs(regs: int, warps: int, sms: int, shared: int = 0) -> int:
    """Programs of `warps` warps resident at once on sm_90 (one wave): 64K registers per SM allocated
    256 per warp, at most 64 warps and 32 blocks per SM, and 228 KiB of shared memory (1 KiB of it
    reserved per block)."""
    per_warp = -(-regs * 32 // 256) * 256
    by_smem = 233472 // (shared + 1024) if shared else 32
    return sms * min(32, (65536 // per_warp) // warps, 64 // warps, by_smem)


def row_acc(block_n: int, num_warps: int) -> bool:
    """ROW_ACC for a tile: one warp's 32 threads x 4 columns cover 128 columns, so a narrower tile
    spreads each group's rows over warps (or threads) and keeps one sum per row."""
    return block_n < 128 * num_warps


def gemv_split(ng: int, groups_per_program: int) -> int:
    """split-K for a K of ng groups: programs of ~groups_per_program groups, at most 64 of them (past
    about 60 the GEMV fell off a cliff)."""
    return triton.cdiv(ng, max(groups_per_program, triton.cdiv(ng, 64)))


def gemv_one_wave_split(ng: int, n_blocks: int, num_warps: int, sms: int, reserve: int = 0) -> int:
    """split-K whose programs (n_blocks column blocks x split) just fit in one wave of resident warps,
    with `reserve` programs' room left (the sum kernel's). At most ng and 64, at least 1."""
    return max(1, min(ng, 64, (resident_programs(ONE_WAVE_REGS, num_warps, sms) - reserve) // n_blocks))


def takes_sum_kernel(split: int, block_n: int, num_warps: int, pdl: bool) -> bool:
    """The fix-up rule: the sum kernel for SUM_TILE from SUM_MIN_SPLIT partials, launched with PDL; the
    in-kernel fix-up otherwise."""
    return pdl and split >= SUM_MIN_SPLIT and (block_n, num_warps) == SUM_TILE


def one_wave_tile_split(ng: int, N: int, block_n: int, num_warps: int, sms: int, pdl: bool) -> int:
    """A tile's one-wave split; where that split gives the tile the sum kernel, the split that leaves room
    in the wave for the sum kernel's programs (one per SUM_BLOCK columns)."""
    split = gemv_one_wave_split(ng, triton.cdiv(N, block_n), num_warps, sms)
    if takes_sum_kernel(split, block_n, num_warps, pdl):
        split = gemv_one_wave_split(ng, triton.cdiv(N, block_n), num_warps, sms, triton.cdiv(N, SUM_BLOCK))
    return split


def fixup_args(block_n: int, num_warps: int, split: int, N: int, ws_off: int = 0, lock_off: int = 0) -> dict:
    """The fix-up's constants for a tile: where its own workspace (split x N words) and counters (one
    per column block) start, and how many partials its last program reads per round trip (POLL_ROWS:
    a power of two, about 32 per thread, so the reads fit in registers)."""
    per_thread = max(1, 32 * 32 * num_warps // block_n)
    poll = min(triton.next_power_of_2(split), triton.next_power_of_2(per_thread))
    return {"WS_OFF": ws_off, "LOCK_OFF": lock_off, "POLL_ROWS": poll, "THREADS": 32 * num_warps}


def gemv_state_words(block_n: int, split: int, N: int) -> tuple[int, int]:
    """(workspace words, counters) a tile's fix-up needs: none without a split."""
    blocks = triton.cdiv(N, block_n)
    return (blocks * split * block_n, blocks) if split > 1 else (0, 0)


def gemv_candidates(K: int, N: int, group_size: int, sms: int, pdl: bool, configs=None) -> list:
    """The autotuner's candidates for a shape: each of GEMV_CONFIGS (or `configs`, triton.Configs with
    BLOCK_N, GROUPS_PER_PROGRAM, NUM_STAGES) with its groups per program turned into this shape's
    constant SPLIT_K, duplicates dropped, its fix-up chosen (takes_sum_kernel) and its own slice of the
    shape's fix-up state, one after another (WS_OFF, LOCK_OFF)."""
    if configs is None:
        configs = [triton.Config({"BLOCK_N": b, "GROUPS_PER_PROGRAM": g, "NUM_STAGES": st}, num_warps=w, num_stages=1)
                   for b, w, g, st in GEMV_CONFIGS]
    ng = K // group_size
    seen, out, ws_off, lock_off = set(), [], 0, 0
    for c in configs:
        b, w, gpp = c.kwargs["BLOCK_N"], c.num_warps, c.kwargs["GROUPS_PER_PROGRAM"]
        split = gemv_split(ng, gpp) if gpp else one_wave_tile_split(ng, N, b, w, sms, pdl)
        sum_kernel = takes_sum_kernel(split, b, w, pdl)
        key = (b, w, split, c.kwargs["NUM_STAGES"], sum_kernel)
        if key not in seen:
            seen.add(key)
            out.append(triton.Config({"BLOCK_N": b, "SPLIT_K": split, "NUM_STAGES": key[3],
                                      "ROW_ACC": row_acc(b, w), "SUM_KERNEL": sum_kernel,
                                      **fixup_args(b, w, split, N, ws_off, lock_off)},
                                     num_warps=w, num_stages=1))
            words, counters = gemv_state_words(b, split, N)
            ws_off, lock_off = ws_off + words, lock_off + counters
    return out


def gemv_state(device: torch.device, key: tuple, sizes) -> tuple[torch.Tensor, torch.Tensor]:
    """The tagged fix-up's workspace (int32, every word's parity bit 1: matched by no call before it is
    written) and counters (zeros), made once per device and key (a shape's autotuned tiles, or one fixed
    tile and split) and kept in kernels.cache; sizes() gives (words, counters) when they are made. Each
    tile then only ever sees its own slots, at most one call stale. Shared by every stream of the
    device: int4_gemv calls must not run concurrently on two streams (a CUDA graph replays on its own
    capture stream, one call after another, which is fine)."""
    key = (device,) + key
    state = cache.gemv_states.get(key)
    if state is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("int4_gemv: call it once before capturing a CUDA graph (its split-K "
                               "state, and its autotuning, must be made outside the graph)")
        words, counters = sizes()
        state = (torch.ones(max(words, 1), dtype=torch.int32, device=device),
                 torch.zeros(max(counters, 1), dtype=torch.int32, device=device))
        cache.gemv_states[key] = state
    return state


def gemv_hopper_tile(ng: int, N: int, sms: int, pdl: bool) -> dict:
    """The Int4 GEMV tile an sm_90 GPU gets by default (f16x2 dequant): 32 columns on one warp, one
    stage, the one-wave split of ng groups (with room for the sum kernel's programs when it takes it),
    and the fix-up that split calls for. It was the fastest tile at both of Qwen2.5-7B's MLP shapes in
    every cold sweep on the H200, where the autotuner (timing one launch at a time after an L2 flush)
    often picked a slower one; so on sm_90 the measured tile is the default (docs/kernels.md)."""
    block_n, num_warps = SUM_TILE
    split = one_wave_tile_split(ng, N, block_n, num_warps, sms, pdl)
    return {"block_n": block_n, "num_warps": num_warps, "num_stages": 1, "split_k": split,
            "fixup": "sum kernel" if takes_sum_kernel(split, block_n, num_warps, pdl) else "in-kernel"}


def int4_gemv_dequant(x: torch.Tensor) -> str:
    """Which dequant int4_gemv runs for x: "f16x2" (two weights per instruction, inline PTX, fp16 x on an
    NVIDIA GPU) or "f32" (exact fp32 dequant: the interpreter, ROCm, bf16/fp32 activations)."""
    nvidia = x.device.type == "cuda" and torch.version.hip is None and not interpreted()
    return "f16x2" if nvidia and x.dtype == torch.float16 else "f32"


def gemv_pdl(x: torch.Tensor) -> bool:
    """Whether int4_gemv launches its sum kernel with programmatic dependent launch: an NVIDIA GPU of
    sm_90 or later (Hopper), compiled (not the interpreter), and a Triton that has griddepcontrol."""
    if x.device.type != "cuda" or interpreted() or gdc_wait is None:
        return False
    info = cache.device_info(x.device)
    return info["nvidia"] and info["capability"] >= (9, 0)


def int4_gemv_default_tile(x: torch.Tensor, K: int, N: int, group_size: int, dequant: str) -> dict | None:
    """The fixed tile int4_gemv takes when block_n and split_k are left None: gemv_hopper_tile on an
    sm_90 GPU with the f16x2 dequant; None (autotuned) elsewhere."""
    if dequant != "f16x2":
        return None
    info = cache.device_info(x.device)
    if not info["nvidia"] or info["capability"] != (9, 0):
        return None
    return gemv_hopper_tile(K // group_size, N, info["sms"], gemv_pdl(x))

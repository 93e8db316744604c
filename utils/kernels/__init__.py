"""Triton kernels written in the project: GEMM, int8 GEMM, grouped GEMM and an Int4 (GPTQ) GEMV.

Why hand-written: Lab 05 opens the operators, so the kernels whose precision and speed it measures
are ours, small enough to read. Each runs on a GPU (compiled, autotuned) and on a CPU through
Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported) at small sizes.

    common.py        interpreted(), interpreter_limits(), tile configs, `cache` (all state kept between calls)
    gemm.py          matmul, int8_matmul
    grouped.py       grouped_matmul and its kernel choice (pointer and TMA kernels in Triton)
    grouped_gluon.py the warp-specialized grouped GEMM in Gluon (sm_90)
    gemv_kernels.py  the Int4 GEMV's Triton code; gemv_plan.py how it is launched; gemv.py int4_gemv
    w4a16_kernels.py the W4A16 kernel's Triton code (M = 1..16 rows, tensor cores), w4a16_fragment.py its Gluon
                     code (sm_80+), w4a16_launch.py the tile a call gets and its launches; w4a16.py w4a16_matmul,
                     w4a16_gated_silu (a gated MLP's gate and up in one launch) and their torch custom ops
                     (torch.ops.quantlab.*), what gptq_backend quantlab runs
    stream.py        stream_read, the read floor

GPTQ packing lives in utils.gptq; pack_gptq_int4 and dequant_gptq_int4 are re-exported here. What was
measured to choose each kernel's design is in docs/kernels.md.
"""
from ..gptq import dequant_gptq_int4, pack_gptq_int4
from .common import GEMM_TILES, INPUT_PRECISIONS, KernelCache, cache, gpu_configs, interpreted, interpreter_limits
from .gemm import int8_matmul, matmul, matmul_tuned_config
from .gemv import GemvPlan, int4_gemv, int4_gemv_plan
from .gemv_plan import (GEMV_CONFIGS, GEMV_FIXUPS, gemv_candidates, gemv_hopper_tile, gemv_one_wave_split, gemv_pdl,
                        gemv_split, gemv_state_words, int4_gemv_default_tile, int4_gemv_dequant, resident_programs)
from .grouped import (GROUPED_KERNELS, group_offsets, grouped_kernel, grouped_kernels_here, grouped_matmul,
                      grouped_matmul_loop)
from .stream import stream_read
from .w4a16 import W4A16_MAX_ROWS, W4A16Tile, w4a16_dequant, w4a16_gated_silu, w4a16_matmul

__all__ = ["GEMM_TILES", "GEMV_CONFIGS", "GEMV_FIXUPS", "GROUPED_KERNELS", "INPUT_PRECISIONS", "GemvPlan",
           "KernelCache", "cache", "dequant_gptq_int4", "gemv_candidates", "gemv_hopper_tile", "gemv_one_wave_split",
           "gemv_pdl", "gemv_split", "gemv_state_words", "gpu_configs", "group_offsets", "grouped_kernel",
           "grouped_kernels_here", "grouped_matmul", "grouped_matmul_loop", "int4_gemv", "int4_gemv_default_tile",
           "int4_gemv_dequant", "int4_gemv_plan", "int8_matmul", "interpreted", "interpreter_limits", "matmul",
           "matmul_tuned_config", "pack_gptq_int4", "resident_programs", "stream_read", "W4A16_MAX_ROWS", "W4A16Tile", "w4a16_dequant",
           "w4a16_gated_silu", "w4a16_matmul"]

"""Grouped GEMM experiments for issue 8 (a bench, not a test): does a persistent kernel (one program
per SM walking every group's tiles) close the gap to a torch.matmul loop at a few large groups?

    python scripts/grouped_probe.py        # GPU (sm_90); prints a table

Round 1 (docs/device-runs/20261123-lab05-kernels-h100/grouped_probe.log) compared TMA loads with
pointer loads; TMA won and is now utils.kernels' path on Hopper ("shipped" below). Round 2 is this
file: the persistent variant, same TMA descriptors (B viewed as [G*K, N], K a multiple of BLOCK_K).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from bench_kernels import grouped_case  # noqa: E402
from utils import kernels, metrics, roofline  # noqa: E402


@triton.jit
def _grouped_tma_persistent_kernel(a_desc, b_desc, c_ptr, offs_ptr, G, N, K, scm, scn, MAX_ROWS,
                                   NUM_SMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """One program per SM walks the tiles of every group (tiles counted with MAX_ROWS; a tile past its
    group's rows computes nothing useful and stores nothing); the tile and K loops are flattened so the
    TMA loads of the next tile overlap this one's epilogue (Triton tutorial 09's persistent scheme)."""
    num_m, num_n = tl.cdiv(MAX_ROWS, BLOCK_M), tl.cdiv(N, BLOCK_N)
    per_group = num_m * num_n
    k_tiles = K // BLOCK_K
    total = G * per_group * k_tiles
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    zero = tl.program_id(0) * 0                  # int32 scalars, so the loop-carried types never change
    tile = tl.program_id(0) - NUM_SMS
    ki = zero - 1
    g = zero
    start = zero
    pid_m = zero
    pid_n = zero
    for _ in tl.range(0, tl.cdiv(G * per_group - tl.program_id(0), NUM_SMS) * k_tiles, flatten=True):
        ki = tl.where(ki == k_tiles - 1, 0, ki + 1)
        if ki == 0:
            tile += NUM_SMS
            g = tile // per_group
            start = tl.load(offs_ptr + g - 1, mask=g > 0, other=0)
            pid_m, pid_n = kernels._tile_of(tile % per_group, num_m, num_n, GROUP_M)
        a = a_desc.load([start + pid_m * BLOCK_M, ki * BLOCK_K])
        b = b_desc.load([g * K + ki * BLOCK_K, pid_n * BLOCK_N])
        acc = tl.dot(a, b, acc)
        if ki == k_tiles - 1:
            Mg = tl.load(offs_ptr + g) - start
            rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = (rm < Mg)[:, None] & (rn < N)[None, :]
            tl.store(c_ptr + (start + rm)[:, None] * scm + rn[None, :] * scn, acc.to(c_ptr.dtype.element_ty),
                     mask=mask)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)


def grouped_tma_persistent(a, b, offs, max_rows, BM, BN, BK, stages, warps, GM=8):
    G, K, N = b.shape
    assert K % BK == 0
    c = torch.empty((a.shape[0], N), device=a.device, dtype=a.dtype)
    a_desc = TensorDescriptor.from_tensor(a, [BM, BK])
    b_desc = TensorDescriptor.from_tensor(b.reshape(G * K, N), [BK, BN])
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    tiles = G * triton.cdiv(max_rows, BM) * triton.cdiv(N, BN)
    _grouped_tma_persistent_kernel[(min(sms, tiles),)](a_desc, b_desc, c, offs, G, N, K, c.stride(0), c.stride(1),
                                                       max_rows, NUM_SMS=min(sms, tiles), BLOCK_M=BM, BLOCK_N=BN,
                                                       BLOCK_K=BK, GROUP_M=GM, num_stages=stages, num_warps=warps)
    return c


CONFIGS = [("persistent TMA", grouped_tma_persistent, (128, 256, 64, 3, 8)),
           ("persistent TMA", grouped_tma_persistent, (128, 256, 64, 4, 8)),
           ("persistent TMA", grouped_tma_persistent, (128, 128, 64, 4, 8)),
           ("persistent TMA", grouped_tma_persistent, (128, 128, 64, 5, 4)),
           ("persistent TMA", grouped_tma_persistent, (256, 128, 64, 3, 8))]


def main():
    print(torch.cuda.get_device_name(0), "triton", triton.__version__, flush=True)
    lines = ["| groups | kernel | TFLOP/s | x loop |", "|---|---|---|---|"]
    for G, m, K, N in [(8, 2048, 4096, 4096), (8, 512, 4096, 4096), (64, 128, 2048, 1408)]:
        dt = torch.bfloat16
        a, b, offs, sizes, ref = grouped_case(G, m, K, N, dt)
        flop = 2 * G * m * K * N
        tf = lambda t: flop / t / 1e12  # noqa: E731
        t_loop = roofline.time_kernel(lambda: kernels.grouped_matmul_loop(a, b, sizes), "cuda")
        t_ptr = roofline.time_kernel(lambda: kernels.grouped_matmul(a, b, offs, max_rows=m), "cuda")
        lines += [f"| {G}x{m}x{K}x{N} | torch.matmul loop | {tf(t_loop):.0f} | 1.00 |",
                  f"| {G}x{m}x{K}x{N} | shipped grouped_matmul (autotuned) | {tf(t_ptr):.0f} | {t_loop / t_ptr:.2f} |"]
        print(lines[-2], lines[-1], sep="\n", flush=True)
        for name, fn, cfg in CONFIGS:
            try:
                out = fn(a, b, offs, m, *cfg)
                err = metrics.relative_l2(out, ref)
                assert err <= metrics.matmul_error_bound(dt, K), f"rel L2 {err:.3g}"
                t = roofline.time_kernel(lambda: fn(a, b, offs, m, *cfg), "cuda")
            except Exception as exc:  # noqa: BLE001 - a config that fails is reported, not fatal
                print(f"  {name} {cfg}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                continue
            lines.append(f"| {G}x{m}x{K}x{N} | {name} {cfg} | {tf(t):.0f} | {t_loop / t:.2f} |")
            print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

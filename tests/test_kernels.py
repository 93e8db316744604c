"""The project's Triton GEMM, grouped GEMM and int8 GEMM (through TRITON_INTERPRET=1 on CPU, compiled on a GPU)."""
import pytest
import torch

from utils import kernels, metrics

# Where Triton runs: the CPU under TRITON_INTERPRET=1 (the default here, tests/conftest.py; CI) and the GPU
# with TRITON_INTERPRET=0 on a CUDA box (scripts/device_bench.sh runs this file there; the GEMV's f16x2
# dequant and its fp32 fallback run only there): the same assertions, on compiled kernels.
DEVICE = "cpu" if kernels.interpreted() else "cuda"


@pytest.mark.parametrize("prec", ["ieee", "tf32", "tf32x3"])
def test_matmul_fp32_against_fp64(prec):
    torch.manual_seed(0)
    a, b = torch.randn(70, 96, device=DEVICE), torch.randn(96, 50, device=DEVICE)   # ragged: masks exercised
    c = kernels.matmul(a, b, input_precision=prec)
    bound = metrics.matmul_error_bound("tf32" if prec == "tf32" else torch.float32, 96)
    assert metrics.relative_l2(c, a.double() @ b.double()) <= bound


def test_matmul_fp16_within_bound_and_bad_input():
    torch.manual_seed(0)
    a, b = torch.randn(64, 128, device=DEVICE).half(), torch.randn(128, 40, device=DEVICE).half()
    ref = a.double() @ b.double()
    assert metrics.relative_l2(kernels.matmul(a, b), ref) <= metrics.matmul_error_bound(torch.float16, 128)
    assert metrics.relative_l2(kernels.matmul(a, b, acc_dtype=torch.float16), ref) < 1e-2
    with pytest.raises(ValueError, match="input_precision"):
        kernels.matmul(a.float(), b.float(), input_precision="fp64")
    with pytest.raises(ValueError, match="a.shape"):
        kernels.matmul(a, a)
    with pytest.raises(ValueError, match="acc_dtype"):
        kernels.matmul(a.float(), b.float(), acc_dtype=torch.float16)


def test_grouped_matmul_matches_loop_with_empty_group():
    torch.manual_seed(0)
    sizes = [5, 0, 40, 17]
    offs = kernels.group_offsets(sizes, DEVICE)
    assert offs.tolist() == [5, 5, 45, 62] and offs.dtype == torch.int32
    a, b = torch.randn(sum(sizes), 64, device=DEVICE), torch.randn(4, 64, 48, device=DEVICE)
    out = kernels.grouped_matmul(a, b, offs)
    ref = kernels.grouped_matmul_loop(a.double(), b.double(), sizes)
    # fp32 stays fp32 on a GPU too (tl.dot's default there is tf32: a rel L2 of 7.8e-4 on the H200 here)
    assert metrics.relative_l2(out, ref) <= metrics.matmul_error_bound(torch.float32, 64)
    tf32 = kernels.grouped_matmul(a, b, offs, input_precision="tf32")
    assert metrics.relative_l2(tf32, ref) <= metrics.matmul_error_bound("tf32", 64)
    with pytest.raises(ValueError, match="input_precision"):
        kernels.grouped_matmul(a, b, offs, input_precision="fp64")
    with pytest.raises(ValueError, match="offs must be non-decreasing"):
        kernels.grouped_matmul(a, b, torch.tensor([5, 4, 45, 62], dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="int32"):
        kernels.grouped_matmul(a, b, offs.long())


def test_grouped_matmul_every_kernel_that_runs_here_matches_the_loop_on_ragged_groups():
    """16-bit groups of ragged sizes (an empty one, a single row, one past a tile's edge), N not a multiple of
    any tile: each kernel that runs here (on Hopper gluon and tma, everywhere pointers) against the fp64
    loop, and the same bits on a second call; "auto" picks the first of them."""
    torch.manual_seed(0)
    gpu = DEVICE == "cuda"
    sizes, K, N = ([300, 0, 129, 1, 64], 128, 264) if gpu else ([70, 0, 33, 1, 16], 128, 72)
    offs = kernels.group_offsets(sizes, DEVICE)
    for dt in [torch.float16] + ([torch.bfloat16] if gpu else []):     # the interpreter has no bf16
        a = torch.randn(sum(sizes), K, device=DEVICE).to(dt)
        b = torch.randn(len(sizes), K, N, device=DEVICE).to(dt)
        ref = kernels.grouped_matmul_loop(a.double(), b.double(), sizes)
        ran = []
        for kernel in kernels.GROUPED_KERNELS:
            try:
                out = kernels.grouped_matmul(a, b, offs, kernel=kernel)
            except ValueError as exc:
                assert "cannot run here" in str(exc)
                continue
            ran.append(kernel)
            assert metrics.relative_l2(out, ref) <= metrics.matmul_error_bound(dt, K), (kernel, dt)
            assert torch.equal(out, kernels.grouped_matmul(a, b, offs, kernel=kernel)), (kernel, dt)
        assert ran == kernels.grouped_kernels_here(a, b) and ran[0] == kernels.grouped_kernel(a, b)
        assert ran[-1] == "pointers"
        if gpu and torch.cuda.get_device_capability() == (9, 0):
            assert ran == list(kernels.GROUPED_KERNELS)


def test_grouped_kernel_says_why_a_kernel_cannot_run():
    a, b = torch.randn(8, 64), torch.randn(2, 64, 16)
    offs = kernels.group_offsets([3, 5])
    assert kernels.grouped_kernel(a, b) == "pointers"            # a CPU tensor: only the pointer kernel
    assert kernels.grouped_kernels_here(a, b) == ["pointers"]
    for kernel, why in (("gluon", "NVIDIA GPU"), ("tma", "NVIDIA GPU")):
        with pytest.raises(ValueError, match=f"the {kernel} grouped GEMM cannot run here: .*{why}"):
            kernels.grouped_matmul(a, b, offs, kernel=kernel)
    with pytest.raises(ValueError, match="kernel must be"):
        kernels.grouped_matmul(a, b, offs, kernel="cutlass")
    with pytest.raises(ValueError, match="fixed config runs the pointer kernel"):
        kernels.grouped_matmul(a, b, offs, kernel="tma", config={"BLOCK_M": 16})


def test_gluon_grouped_gemm_descriptors_view_b_as_one_matrix():
    """The Gluon kernel's TMA descriptors (built on the host, so checkable on a CPU): B [G, K, N] is one
    [G*K, N] matrix whose group g starts at row g*K; each tile's rows are 128-byte swizzled (the widest)."""
    gg = pytest.importorskip("utils.kernels.grouped_gluon", reason="this Triton has no Gluon")
    a = torch.zeros(300, 128, dtype=torch.bfloat16)
    b = torch.zeros(3, 128, 264, dtype=torch.bfloat16)
    c = torch.zeros(300, 264, dtype=torch.bfloat16)
    a_desc, b_desc, c_desc = gg.descriptors(a, b, c, gg.BLOCK_M, gg.BLOCK_N, gg.BLOCK_K)
    assert [list(d.shape) for d in (a_desc, b_desc, c_desc)] == [[300, 128], [384, 264], [300, 264]]
    assert [d.block_shape for d in (a_desc, b_desc, c_desc)] == [[128, 64], [64, 256], [128, 256]]
    assert all(d.layout.swizzle_byte_width == 128 for d in (a_desc, b_desc, c_desc))


_COMPILE_GLUON_FOR_SM90 = """
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
import utils.kernels.grouped_gluon as gg
lay = gg.gl.NVMMASharedLayout.get_default_for
desc = lambda shape: f"tensordesc<bf16[{shape[0]}, {shape[1]}],{lay(shape, gg.gl.bfloat16)!r}>"
sig = {"a_desc": desc([gg.BLOCK_M, gg.BLOCK_K]), "b_desc": desc([gg.BLOCK_K, gg.BLOCK_N]),
       "c_desc": desc([gg.BLOCK_M, gg.BLOCK_N]), "c_ptr": "*bf16", "group_ends_ptr": "*i32", "G": "i32", "N": "i32",
       "K": "i32", "MAX_ROWS": "i32", "STAGES": "constexpr", "GROUP_M": "constexpr", "PRODUCER_REGS": "constexpr",
       "TMA_STORE": "constexpr", "num_warps": "constexpr"}
const = {"STAGES": gg.STAGES, "GROUP_M": gg.GROUP_M, "PRODUCER_REGS": gg.PRODUCER_REGS, "TMA_STORE": True,
         "num_warps": gg.COMPUTE_WARPS}
ck = triton.compile(GluonASTSource(fn=gg.grouped_ws_kernel, signature=sig, constexprs=const),
                    target=GPUTarget("cuda", 90, 32), options={"num_warps": gg.COMPUTE_WARPS})
print("RESULT " + json.dumps({"ptx": ck.asm["ptx"], "shared": ck.metadata.shared}))
"""


def test_gluon_grouped_gemm_compiles_for_hopper_here(tmp_path):
    """The Gluon kernel only runs on an sm_90 GPU, but it compiles on a CPU machine with Triton's own ptxas:
    a renamed or removed Gluon call (Triton 3.9 turned tma.async_copy_* into raising stubs) fails here,
    not first on the GPU. What it compiles to is what the design says: warp-specialized (setmaxnreg),
    TMA loads and store, wgmma, within the H100/H200's 227 KB of shared memory. In a fresh process with
    the interpreter off (kernels this session interpreted leave Triton's language patched for it) and an
    empty cache (a cached kernel would hide a change to a Gluon call it makes)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    pytest.importorskip("utils.kernels.grouped_gluon", reason="this Triton has no Gluon")
    pytest.importorskip("triton.backends.nvidia.compiler", reason="this Triton has no NVIDIA backend")
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path),    # compiled afresh, not cached
               PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, "-c", _COMPILE_GLUON_FOR_SM90], cwd=root, env=env, capture_output=True,
                         text=True, timeout=240)
    line = next((x for x in run.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, run.stderr[-3000:]
    got = json.loads(line[len("RESULT "):])
    for what in ("setmaxnreg", "global.mbarrier::complete_tx::bytes", "wgmma.mma_async",      # TMA loads, wgmma
                 "cp.async.bulk.tensor.2d.global.shared::cta"):                                   # the TMA store
        assert what in got["ptx"], what
    assert got["shared"] <= 227 * 1024


def test_int8_matmul_exact():
    torch.manual_seed(0)
    a = torch.randint(-128, 128, (33, 200), dtype=torch.int8, device=DEVICE)
    b = torch.randint(-128, 128, (200, 40), dtype=torch.int8, device=DEVICE)
    assert torch.equal(kernels.int8_matmul(a, b).cpu(), (a.cpu().long() @ b.cpu().long()).int())   # no int64 GEMM on CUDA
    with pytest.raises(ValueError, match="int8"):
        kernels.int8_matmul(a.float(), b)


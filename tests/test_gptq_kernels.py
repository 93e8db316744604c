"""Every GPTQ kernel of GPTQModel side by side (utils.gptq_kernels), on the CPU: the ones that run agree
with the float64 reference, the ones that cannot run here say why, and a wrong kernel is a finding."""
import pytest
import torch

from utils import gptq, gptq_kernels


def _layer(n_in=256, n_out=64, seed=0) -> dict:
    """A small GPTQ v1 Int4 layer packed by the project's packer (symmetric, groups of 128), as read_layer gives."""
    w = torch.randn(n_in, n_out, generator=torch.Generator().manual_seed(seed))
    qweight, qzeros, scales = gptq.pack_gptq_int4(w, 128)
    return {"qweight": qweight, "qzeros": qzeros, "scales": scales,
            "g_idx": (torch.arange(n_in) // 128).to(torch.int32)}


def test_the_table_is_gptqmodels_own():
    from gptqmodel.nn_modules.qlinear.marlin import MarlinLinear
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear

    classes = gptq_kernels.kernel_classes()
    assert classes["gptq_torch"] is TorchLinear and classes["gptq_marlin"] is MarlinLinear
    assert {"gptq_triton", "gptq_exllama_v2", "gptq_machete", "gptq_torch_aten"} <= set(classes)


def test_torch_kernels_run_and_agree_and_leave_the_tensors_alone():
    t = _layer()
    before = {k: v.clone() for k, v in t.items()}
    # two kernels that both convert v1 zeros to v2: the second must not see the first's conversion
    rows = gptq_kernels.compare_kernels(t, "cpu", backends=["gptq_torch_aten", "gptq_torch"], repeats=2)
    assert [r["backend"] for r in rows] == ["gptq_torch_aten", "gptq_torch"]
    for r in rows:
        assert r["runs"] and r["reason"] is None and r["ok"], r
        assert 0 < r["rel_l2"] <= r["tolerance"] and r["us_per_call"] > 0
    torch_row = rows[1]
    assert torch_row["kernel"] == "TorchLinear"
    assert torch_row["tolerance"] == gptq.kernel_tolerance("TorchLinear", torch.float16, torch.float16, 256)
    assert all(torch.equal(t[k], before[k]) for k in t)
    # a layer with a bias (Qwen2's q, k, v projections): the kernel adds it, and so does the reference
    biased = {**t, "bias": torch.randn(64, generator=torch.Generator().manual_seed(1)).half()}
    (r,) = gptq_kernels.compare_kernels(biased, "cpu", backends=["gptq_torch"], repeats=2)
    assert r["ok"] and r["rel_l2"] <= r["tolerance"], r


def test_kernels_that_cannot_run_here_are_rows_with_the_librarys_reason():
    t = _layer()
    rows = {r["backend"]: r for r in gptq_kernels.compare_kernels(t, "cpu", repeats=2)}
    assert set(rows) == set(gptq_kernels.kernel_classes()) | {gptq_kernels.GEMV, gptq_kernels.QUANTLAB}
    for name in ("gptq_marlin", "gptq_triton", "gptq_exllama_v2", "gptq_machete", gptq_kernels.GEMV):
        r = rows[name]
        assert r["runs"] is False and r["ok"] is None and r["rel_l2"] is None, r
        assert "cuda" in r["reason"].lower() or "cpu" in r["reason"].lower(), r
    assert rows["gptq_torch"]["runs"] and rows["gptq_torch"]["ok"]
    assert rows["gptq_torch"]["us_at_1_rows"] > 0 and rows["gptq_torch"]["us_at_16_rows"] > 0
    # the course's W4A16 kernel runs here through Triton's interpreter (TRITON_INTERPRET=1), within its bound,
    # at 1 and 16 rows
    q = rows[gptq_kernels.QUANTLAB]
    assert q["runs"] and q["ok"] and 0 < q["rel_l2"] <= q["tolerance"], q
    assert q["us_at_1_rows"] > 0 and q["us_at_16_rows"] > 0
    with pytest.raises(gptq_kernels.KernelUnavailable, match="gptq_marlin"):
        gptq_kernels.build_kernel("gptq_marlin", t, "cpu")


def test_a_kernel_that_disagrees_is_a_finding_not_an_error(monkeypatch):
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear

    forward = TorchLinear.forward
    monkeypatch.setattr(TorchLinear, "forward", lambda self, x: forward(self, x) * 1.01)   # 1 % off
    (r,) = gptq_kernels.compare_kernels(_layer(), "cpu", backends=["gptq_torch"], repeats=2)
    assert r["runs"] and r["ok"] is False and r["rel_l2"] > r["tolerance"], r
    assert r["rel_l2"] == pytest.approx(0.01, rel=0.05)


def test_unknown_backend_names_the_parameter():
    with pytest.raises(ValueError, match="backends"):
        gptq_kernels.compare_kernels(_layer(), "cpu", backends=["gptq_torch", "gptq_warp_drive"])
    with pytest.raises(ValueError, match="backend='gptq_warp_drive'"):
        gptq_kernels.build_kernel("gptq_warp_drive", _layer(), "cpu")


def test_no_cuda_extension_is_compiled_unless_asked():
    """GPTQModel compiles a missing CUDA extension on first use (minutes of nvcc): the comparison refuses
    that compile by default, through the one function GPTQModel compiles with."""
    import torch.utils.cpp_extension
    from gptqmodel.utils import cpp

    assert cpp.load is torch.utils.cpp_extension.load
    with gptq_kernels.compiling(False):
        with pytest.raises(RuntimeError, match="compile_extensions=True"):
            cpp.load(name="gptqmodel_marlin_fp16_ops", sources=[])
    assert cpp.load is torch.utils.cpp_extension.load
    with gptq_kernels.compiling(True):
        assert cpp.load is torch.utils.cpp_extension.load


def test_gptqmodels_own_extension_loader_is_refused_its_compile(tmp_path):
    """End to end through GPTQModel's extension loader, on a CPU extension and an empty build folder (in a
    subprocess: GPTQModel remembers a failed build for the rest of the process)."""
    import os
    import subprocess
    import sys

    code = ("from utils import gptq_kernels\nfrom gptqmodel import extension\n"
            "with gptq_kernels.compiling(False):\n    ok = extension.is_available('floatx_cpu')\n"
            "print('AVAILABLE', ok)\nprint('ERROR', extension.error('floatx_cpu'))\n")
    env = {**os.environ, "GPTQMODEL_TORCH_EXTENSIONS_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert "AVAILABLE False" in out.stdout, out.stdout + out.stderr
    assert "compile_extensions=True" in out.stdout
    assert not any(p.suffix == ".so" for p in tmp_path.rglob("*"))


def test_a_kernel_that_rounds_its_activations_to_fp8_is_judged_with_that_rounding():
    """W4AFP8 quantizes activations to FP8 e4m3 per token by design: its bound includes that rounding,
    while a plain fp16 kernel with the same error is out of bounds."""
    gen = torch.Generator().manual_seed(0)
    k = 3584
    x, w = torch.randn(1, k, generator=gen, dtype=torch.float64), torch.randn(64, k, generator=gen, dtype=torch.float64)
    scale = x.abs().amax(dim=-1, keepdim=True) / 448                  # per token, e4m3's largest normal
    x8 = (x / scale).to(torch.float8_e4m3fn).to(torch.float64) * scale
    rel = (torch.linalg.vector_norm(x8 @ w.T - x @ w.T) / torch.linalg.vector_norm(x @ w.T)).item()
    assert rel > gptq.kernel_tolerance("TritonV2Linear", torch.float16, torch.float16, k)
    assert rel <= gptq.kernel_tolerance("W4AFP8Linear", torch.float16, torch.float16, k)
    assert gptq.kernel_tolerance("TorchAtenLinear", torch.float16, torch.float16, k) == \
        gptq.kernel_tolerance("TritonV2Linear", torch.bfloat16, torch.bfloat16, k)

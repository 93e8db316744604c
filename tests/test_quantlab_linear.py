"""gptq_backend 'quantlab': a loaded GPTQ layer swapped for QuantlabLinear keeps its tensors (no copy) and
computes the same function (through Triton's interpreter on CPU)."""
import pytest
import torch

from bad_input_table import record
from utils import gptq, gptq_kernels, metrics, models
from utils.quantlab_linear import QuantlabGatedMLP, QuantlabLinear, swap_gptq_linears


def loaded_layer(act_order=False, sym=True, bias=True, seed=0):
    """A GPTQModel TorchLinear as a model load makes it (v1 checkpoint tensors, zeros converted to v2 on load)."""
    gen = torch.Generator().manual_seed(seed)
    K, N, G = 256, 64, 64
    q = torch.randint(0, 16, (K, N), generator=gen, dtype=torch.int32)
    z = torch.full((K // G, N), 8, dtype=torch.int32) if sym else torch.randint(0, 16, (K // G, N), generator=gen,
                                                                                 dtype=torch.int32)
    g_idx = (torch.randperm(K, generator=gen) // G) if act_order else torch.arange(K) // G
    t = {"qweight": gptq.pack_int32(q, 4, 0), "qzeros": gptq.pack_zero_points(z, 4, "gptq"),
         "scales": (torch.rand(K // G, N, generator=gen) * 0.02 + 0.002).half(), "g_idx": g_idx.to(torch.int32)}
    if bias:
        t["bias"] = torch.randn(N, generator=gen).half()
    mod = gptq_kernels.build_kernel("gptq_torch", t, "cpu", torch.float16, group_size=G, sym=sym, desc_act=act_order)
    return mod, t


@pytest.mark.parametrize("act_order,sym", [(False, True), (True, False)])
def test_swap_reuses_the_tensors_and_agrees(act_order, sym):
    mod, t = loaded_layer(act_order, sym)
    holder = torch.nn.Module()
    holder.proj = mod
    before = {k: getattr(mod, k).data_ptr() for k in ("qweight", "qzeros", "scales", "bias")}
    assert swap_gptq_linears(holder) == ["proj"]
    new = holder.proj
    assert isinstance(new, QuantlabLinear) and new.zero_format == mod.qzero_format() == 2
    assert {k: getattr(new, k).data_ptr() for k in before} == before          # the same storage: nothing copied
    assert (new.g_idx is not None) == act_order
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(1))
    w = gptq.dequantize(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], 4, "gptq", 64)
    ref = x.double() @ w.double().t() + t["bias"].double()
    rel = metrics.relative_l2(new(x), ref)
    assert rel <= gptq.kernel_tolerance("QuantlabLinear", torch.float32, torch.float32, 256), rel
    with torch.no_grad():
        theirs = mod(x.half()).double()
    assert metrics.relative_l2(theirs, ref) <= gptq.kernel_tolerance("TorchLinear", torch.float16, torch.float16, 256)


def test_a_model_without_gptq_layers_is_refused():
    with pytest.raises(ValueError, match="no GPTQ quantized layer") as e:
        swap_gptq_linears(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    record("gptq_backend", "quantlab on a model with no GPTQ layer", str(e.value))


def test_quantlab_is_a_backend_name_and_refused_on_a_plain_cpu(monkeypatch):
    monkeypatch.delenv(models.GPTQ_ENV, raising=False)
    assert models.gptq_backend("cuda:0", "quantlab", record=type("R", (), {"backend": "cuda"})()) == "quantlab"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="gptq_backend='quantlab' is a Triton kernel for a GPU") as e:
        models.gptq_backend("cpu", "quantlab")
    record("gptq_backend", "quantlab on a CPU", str(e.value))


def test_the_fixture_loads_with_quantlab_and_generates_as_gptq_torch(monkeypatch):
    """load_model(backend='quantlab') on the trained fixture's Int4 model: every GPTQ layer swapped, and greedy
    generations identical to GPTQModel's torch kernel on the same checkpoint (CPU, fp16, interpreter)."""
    monkeypatch.delenv(models.GPTQ_ENV, raising=False)
    path = "fixtures/tiny-qwen2-gsm/gptq-int4"
    tok = models.load_tokenizer(path)
    ids = tok("Question: 3 apples and 4 more apples?\nAnswer:", return_tensors="pt").input_ids
    outs = {}
    for backend in ("gptq_torch", "quantlab"):
        model = models.load_model(path, "cpu", torch.float16, backend=backend)
        kinds = {type(m).__name__ for m in model.modules() if hasattr(m, "qweight")}
        assert kinds == ({"QuantlabLinear"} if backend == "quantlab" else {"TorchLinear"}), kinds
        mlps = [type(layer.mlp) for layer in model.model.layers]
        assert all(m is QuantlabGatedMLP for m in mlps) == (backend == "quantlab"), mlps   # gate and up as one
        with torch.no_grad():
            outs[backend] = model.generate(ids, max_new_tokens=4, do_sample=False)[0, ids.shape[1]:].tolist()
    assert outs["quantlab"] == outs["gptq_torch"], outs

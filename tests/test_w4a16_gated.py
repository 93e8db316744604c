"""w4a16_gated_silu, a gated MLP's gate and up projections in one launch, and QuantlabGatedMLP, which runs it
inside a loaded model: the same numbers as two layers and torch's silu (through Triton's interpreter on CPU)."""
import warnings

import pytest
import torch

from bad_input_table import record
from test_w4a16 import DEVICE, FRAGMENT, call, layer
from utils import gptq, metrics
from utils.kernels import w4a16
from utils.quantlab_linear import QuantlabGatedMLP, QuantlabLinear, swap_gptq_linears


def pair(bias=False, K=256, N=64, group=64):
    (tg, wg), (tu, wu) = layer(K=K, N=N, group=group, bias=bias, seed=11), layer(K=K, N=N, group=group, bias=bias,
                                                                              seed=12, sym=False)
    gate = (tg["qweight"], tg["qzeros"], tg["scales"], tg["bias"])
    up = (tu["qweight"], tu["qzeros"], tu["scales"], tu["bias"])
    return gate, up, (tg, wg), (tu, wu)


def two_layers(x, tg, tu, group, fmt, **kw):
    """What the model computed before: each projection in x's dtype, then silu(gate) * up in fp32, rounded once."""
    g, u = call(x, tg, group, fmt, **kw), call(x, tu, group, fmt, **kw)
    return (torch.nn.functional.silu(g.float()) * u.float()).to(x.dtype)


@pytest.mark.parametrize("M", [1, 5, 16, 17])
@pytest.mark.parametrize("split_k,bias", [(1, False), (2, True), (4, False)])
@pytest.mark.parametrize("unpack", ["join"] + (["fragment"] if FRAGMENT else []))
def test_fused_is_two_layers_and_silu(M, split_k, bias, unpack):
    gate, up, (tg, wg), (tu, wu) = pair(bias)
    tile = w4a16.W4A16Tile(32, 64, split_k, 1, 1, "join") if unpack == "join" else \
        w4a16.W4A16Tile(64, 128, split_k, 4, 1, "fragment")        # the Gluon kernel: fp16 or bf16 x only
    for dtype in (torch.float16, torch.float32) if unpack == "join" else (torch.float16, torch.bfloat16):
        x = torch.randn(M, 256, generator=torch.Generator().manual_seed(M)).to(DEVICE, dtype)
        y = w4a16.w4a16_gated_silu(x, gate, up, 64, 1, tile)
        assert y.shape == (M, 64) and y.dtype == dtype
        ref = two_layers(x, tg, tu, 64, 1, **({"tile": tile} if M <= 16 else {}))
        # the interpreter computes sigmoid in numpy, torch in its own way: an fp32 ulp may round apart
        assert (y.float() - ref.float()).abs().max() <= 2 * torch.finfo(dtype).eps * ref.float().abs().max()
        xd = x.cpu().double()
        exact = torch.nn.functional.silu(xd @ wg.double() + (tg["bias"].cpu().double() if bias else 0)) \
            * (xd @ wu.double() + (tu["bias"].cpu().double() if bias else 0))
        assert metrics.relative_l2(y.cpu(), exact) <= 2 * gptq.kernel_tolerance("QuantlabLinear", dtype, dtype, 256)
        assert torch.equal(w4a16.w4a16_gated_silu(x, gate, up, 64, 1, tile), y)        # the same bits again
        if unpack == "fragment":            # both weights through a ring in shared memory: the same bits
            ring = w4a16.W4A16Tile(64, 128, split_k, 4, 4, "fragment")
            assert torch.equal(w4a16.w4a16_gated_silu(x, gate, up, 64, 1, ring), y)


def test_the_op_passes_opcheck_and_compiles_whole():
    from torch._dynamo.testing import CompileCounterWithBackend

    gate, up, _, _ = pair(bias=True)
    x = torch.randn(3, 256).to(DEVICE)
    args = (x, *gate, *up, 64, 1)
    torch.library.opcheck(w4a16.w4a16_gated_op, args, test_utils=("test_schema", "test_faketensor",
                                                                  "test_aot_dispatch_dynamic"))
    counter = CompileCounterWithBackend("aot_eager")
    f = torch.compile(lambda v: w4a16.w4a16_gated_op(v, *gate, *up, 64, 1) * 2, backend=counter, fullgraph=True)
    assert torch.equal(f(x), w4a16.w4a16_gated_silu(x, gate, up, 64, 1) * 2) and counter.frame_count == 1


@pytest.mark.parametrize("case,change,needle", [
    ("up of another shape", "shape", "up projection's qweight must match"),
    ("a bias on one projection only", "bias", "to both projections or to neither"),
    ("up's bias of another length", "up bias", "up projection's bias must match"),
    ("up's scales strided", "strided", "up projection's scales must be contiguous"),
    ("act-order's reshape unpack", "unpack", "tile.unpack 'join', 'ptx' or 'fragment'"),
])
def test_a_pair_that_cannot_be_fused_is_named(case, change, needle):
    gate, up, _, _ = pair()
    tile = None
    if change == "shape":
        t, _ = layer(K=256, N=32, group=64)
        up = (t["qweight"], t["qzeros"], t["scales"], None)
    elif change == "bias":
        up = (*up[:3], torch.zeros(64, dtype=torch.float16, device=DEVICE))
    elif change == "strided":
        up = (up[0], up[1], up[2].t().contiguous().t(), up[3])
    elif change == "up bias":
        gate, up, _, _ = pair(bias=True)
        up = (*up[:3], up[3][:32])
    else:
        tile = w4a16.W4A16Tile(32, 64, 1, 1, 1, "reshape")
    with pytest.raises(ValueError, match=needle) as e:
        w4a16.w4a16_gated_silu(torch.randn(1, 256).to(DEVICE), gate, up, 64, 1, tile)
    record("w4a16_gated_silu", case, str(e.value))


def quant_source(t, group):
    src = torch.nn.Module()
    src.bits, src.group_size, src.pack_dtype = 4, group, torch.int32
    for k in ("qweight", "qzeros", "scales", "bias"):
        setattr(src, k, t[k])
    src.qzero_format = lambda: 1
    return src


class GatedMLP(torch.nn.Module):
    """Qwen2MLP's forward, or another formula over the same parts (`swap`: silu on up instead of gate)."""

    def __init__(self, bias=False, swap=False):
        super().__init__()
        (tg, _), (tu, _), (td, _) = (layer(K=256, N=256, group=64, bias=bias, seed=s) for s in (21, 22, 23))
        self.gate_proj, self.up_proj, self.down_proj = (quant_source(t, 64) for t in (tg, tu, td))
        for m in (self.gate_proj, self.up_proj, self.down_proj):
            m.forward = lambda v, _m=m: torch.zeros(())            # replaced by the swap; never called
        self.act_fn, self.swap = torch.nn.SiLU(), swap

    def forward(self, x):
        if self.swap:
            return self.down_proj(self.gate_proj(x) * self.act_fn(self.up_proj(x)))
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def test_the_swap_fuses_a_gated_mlp_on_the_same_tensors():
    plain, model = torch.nn.Module(), torch.nn.Module()
    plain.mlp, model.mlp = GatedMLP(bias=True), GatedMLP(bias=True)
    ptrs = {n: m.qweight.data_ptr() for n, m in model.mlp.named_children() if hasattr(m, "qweight")}
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(3)).to(DEVICE, torch.float16)
    assert sorted(swap_gptq_linears(plain, fuse_mlp=False)) == ["mlp.down_proj", "mlp.gate_proj", "mlp.up_proj"]
    assert sorted(swap_gptq_linears(model)) == ["mlp." + n for n in sorted(ptrs)]
    assert not isinstance(plain.mlp, QuantlabGatedMLP) and isinstance(model.mlp, QuantlabGatedMLP)
    assert {n: getattr(model.mlp, n).qweight.data_ptr() for n in ptrs} == ptrs        # nothing copied
    with torch.no_grad():
        unfused, fused = plain.mlp(x), model.mlp(x)
    assert metrics.relative_l2(fused.float(), unfused.float()) <= 1e-3


def test_an_mlp_of_another_formula_is_left_unfused_and_said():
    model = torch.nn.Module()
    model.mlp = GatedMLP(swap=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        swap_gptq_linears(model)
    assert not isinstance(model.mlp, QuantlabGatedMLP) and isinstance(model.mlp.gate_proj, QuantlabLinear)
    assert any("is not down(silu(gate(x)) * up(x))" in str(w.message) for w in caught)


def test_a_plan_is_made_per_sum_kernel_launch_setting(monkeypatch):
    """w4a16.SUM_PDL is part of a plan's key: flipping it (a benchmark does) never reuses a plan made under the other."""
    t, _ = layer(seed=31)
    x = torch.randn(2, 256).to(DEVICE)
    args = (x, t["qweight"], t["qzeros"], t["scales"], None, None, 64, 1)
    plain = w4a16.w4a16_plan(*args)
    monkeypatch.setattr(w4a16, "SUM_PDL", True)
    flipped = w4a16.w4a16_plan(*args)
    assert flipped is not plain and w4a16.w4a16_plan(*args) is flipped
    monkeypatch.setattr(w4a16, "SUM_PDL", False)
    assert w4a16.w4a16_plan(*args) is plain

"""The reference GPTQ unpacker: hand-built packed tensors, round trips, and GPTQModel's own kernels."""
import os
from pathlib import Path

import pytest
import torch

from utils import gptq

REPO = Path(__file__).resolve().parents[1]


def _int4_checkpoint() -> Path:
    """The fixture's GPTQ-Int4 twin (a real GPTQModel checkpoint); the stand-in while it is not committed."""
    for root in (REPO / "fixtures" / "tiny-qwen2-gsm", Path("/work/standin/tiny-qwen2-gsm")):
        if (root / "gptq-int4" / "config.json").is_file():
            return root / "gptq-int4"
    raise FileNotFoundError("fixtures/tiny-qwen2-gsm/gptq-int4 is missing: restore it with git")


def test_unpack_known_word():
    # codes 1..8, least significant nibble first: 0x87654321, a negative int32
    word = torch.tensor([[0x87654321 - 2**32]], dtype=torch.int32)
    assert gptq.unpack_int32(word, 4, dim=0)[:, 0].tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert gptq.unpack_int32(word, 4, dim=1)[0].tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    # all ones: every code 15 (no sign extension leaking into the codes)
    assert gptq.unpack_int32(torch.tensor([-1], dtype=torch.int32), 4).tolist() == [15] * 8
    assert gptq.unpack_int32(torch.tensor([0x0403_0201], dtype=torch.int32), 8).tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("dim", [0, 1])
def test_pack_unpack_round_trip(bits, dim):
    gen = torch.Generator().manual_seed(bits + dim)
    codes = torch.randint(0, 2**bits, (64, 48), generator=gen)
    packed = gptq.pack_int32(codes, bits, dim=dim)
    p = 32 // bits
    assert packed.dtype == torch.int32
    assert packed.shape == ((64 // p, 48) if dim == 0 else (64, 48 // p))
    assert torch.equal(gptq.unpack_int32(packed, bits, dim=dim).long(), codes)


def _loop_dequant(codes, zeros, scales, g_idx):
    """The definition, one element at a time: W[o, i] = s[g(i), o] * (q[i, o] - z[g(i), o])."""
    n_in, n_out = codes.shape
    w = torch.empty(n_out, n_in, dtype=scales.dtype)
    for o in range(n_out):
        for i in range(n_in):
            g = int(g_idx[i])
            w[o, i] = scales[g, o] * torch.tensor(float(codes[i, o] - zeros[g, o]), dtype=scales.dtype)
    return w


def test_dequantize_hand_built_v1_and_v2():
    n_in, n_out, gs = 16, 8, 8
    codes = torch.arange(n_in * n_out).reshape(n_in, n_out) % 16
    zeros = torch.tensor([[8] * n_out, [3] * n_out])                   # true zero points per group
    scales = torch.tensor([[0.5] * n_out, [0.25] * n_out], dtype=torch.float16)
    g_idx = torch.arange(n_in) // gs
    qweight = gptq.pack_int32(codes, 4, dim=0)
    stored_v1 = gptq.pack_int32(zeros - 1, 4, dim=1)                  # v1 stores zero minus one
    w = gptq.dequantize(qweight, stored_v1, scales, g_idx, 4, "gptq")
    assert w.shape == (n_out, n_in) and w.dtype == torch.float16
    assert torch.equal(w, _loop_dequant(codes, zeros, scales, g_idx))
    assert w[0, 0].item() == 0.5 * (0 - 8) and w[1, 8].item() == 0.25 * (1 - 3)
    # the same stored zeros read as v2 are off by one step of the scale
    w2 = gptq.dequantize(qweight, stored_v1, scales, g_idx, 4, "gptq_v2")
    assert torch.equal(w2 - w, scales[g_idx].t().contiguous())
    assert torch.equal(gptq.dequantize(qweight, gptq.pack_int32(zeros, 4, dim=1), scales, g_idx, 4, "gptq_v2"), w)
    # g_idx None means i // group_size
    assert torch.equal(gptq.dequantize(qweight, stored_v1, scales, None, 4, "gptq"), w)


def test_v1_zero_of_zero_borrows_across_the_word():
    # true zeros (0, 5, 8, 8, 8, 8, 8, 8): the word minus 0x11111111 borrows, nibbles (15, 3, 7, ...)
    zeros = torch.tensor([[0, 5, 8, 8, 8, 8, 8, 8]])
    stored = gptq.pack_zero_points(zeros, 4, "gptq")
    assert gptq.unpack_int32(stored, 4, dim=1)[0].tolist() == [15, 3, 7, 7, 7, 7, 7, 7]
    assert torch.equal(gptq.zero_points(stored, 4, "gptq"), zeros.to(torch.int16))
    top = torch.tensor([[8, 8, 8, 8, 8, 8, 8, 0]])       # a borrow out of the top nibble wraps the word
    assert torch.equal(gptq.zero_points(gptq.pack_zero_points(top, 4, "gptq"), 4, "gptq"), top.to(torch.int16))
    for bits in (2, 8):
        z = torch.randint(0, 2**bits, (3, 32), generator=torch.Generator().manual_seed(bits))
        z[:, 0] = 0
        assert torch.equal(gptq.zero_points(gptq.pack_zero_points(z, bits, "gptq"), bits, "gptq").long(), z)


def _gptqmodel_layer(sym: bool, desc_act: bool, group_size: int = 32):
    """A Linear(128 -> 64) quantized by GPTQModel's own GPTQ and packed by its own packer
    (TorchLinear.pack_original), then converted to v1 as GPTQModel does on save. Output rows 0-2 have no
    negative weight, so asymmetric quantization gives them zero points of 0 in every group."""
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    from gptqmodel.quantization import QuantizeConfig
    from gptqmodel.quantization.gptq import GPTQ
    from gptqmodel.utils.model import convert_gptq_v2_to_v1_format_module

    gen = torch.Generator().manual_seed(int(sym) * 2 + int(desc_act))
    lin = torch.nn.Linear(128, 64, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(64, 128, generator=gen) * 0.05)
        lin.weight[:3] = lin.weight[:3].abs()
    qcfg = QuantizeConfig(bits=4, group_size=group_size, sym=sym, desc_act=desc_act, act_group_aware=False)
    quant = GPTQ(lin, qcfg)
    quant.quantizer.configure(perchannel=True)
    x = torch.randn(4, 32, 128, generator=gen)
    quant.add_batch(x, lin(x))
    q_weight, scale, zero, g_idx, *_ = quant.quantize()
    lin.weight.data = q_weight.to(lin.weight.dtype)
    mod = TorchLinear(bits=4, group_size=group_size, sym=sym, desc_act=desc_act, in_features=128,
                      out_features=64, bias=False)
    mod.pack_original(linear=lin, scales=scale, zeros=zero, g_idx=g_idx)
    convert_gptq_v2_to_v1_format_module(mod, qcfg)
    tensors = {k: getattr(mod, k).detach().clone() for k in ("qweight", "qzeros", "scales", "g_idx")}
    return tensors, zero.t().round().to(torch.int16), scale.t(), q_weight


@pytest.mark.parametrize("sym", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("desc_act", [False, True], ids=["no-act-order", "act-order"])
def test_gptqmodel_quantizer_and_packer_v1(sym, desc_act):
    """GPTQModel quantizes and packs; our unpacker reads its v1 tensors bit for bit, zero points of 0 included."""
    tensors, zero, scale, q_weight = _gptqmodel_layer(sym, desc_act)
    assert bool((zero[:, :3] == 0).all()) != sym               # asym: zero points of 0 are present
    assert torch.equal(gptq.zero_points(tensors["qzeros"], 4, "gptq"), zero)
    assert torch.equal(gptq.pack_zero_points(zero, 4, "gptq"), tensors["qzeros"])   # our packing == theirs
    r = gptq.check_layer(tensors, group_size=32, sym=sym, desc_act=desc_act)
    assert r["weight_bit_exact"] and r["output_ok"], r
    # with the quantizer's own fp32 scales, the unpacked weight is the quantizer's weight, bit for bit
    ours = gptq.dequantize(tensors["qweight"], tensors["qzeros"], scale.float(), tensors["g_idx"], 4, "gptq")
    assert torch.equal(ours, q_weight.float())


def test_dequantize_act_order_g_idx():
    gen = torch.Generator().manual_seed(1)
    n_in, n_out, groups = 32, 16, 4
    codes = torch.randint(0, 16, (n_in, n_out), generator=gen)
    zeros = torch.randint(1, 16, (groups, n_out), generator=gen)
    scales = (torch.rand(groups, n_out, generator=gen) / 10).half()
    g_idx = (torch.arange(n_in) // (n_in // groups))[torch.randperm(n_in, generator=gen)].int()
    w = gptq.dequantize(gptq.pack_int32(codes, 4, 0), gptq.pack_int32(zeros - 1, 4, 1), scales, g_idx)
    assert torch.equal(w, _loop_dequant(codes, zeros, scales, g_idx))


def test_clear_errors():
    with pytest.raises(ValueError, match="bits=3"):
        gptq.unpack_int32(torch.zeros(1, dtype=torch.int32), 3)
    with pytest.raises(TypeError, match="int32"):
        gptq.unpack_int32(torch.zeros(1, dtype=torch.int64), 4)
    with pytest.raises(ValueError, match="codes must lie"):
        gptq.pack_int32(torch.full((8,), 16), 4)
    with pytest.raises(ValueError, match="format"):
        gptq.zero_points(torch.zeros(1, 1, dtype=torch.int32), 4, "awq")
    q = gptq.pack_int32(torch.zeros(16, 8, dtype=torch.long), 4, 0)
    z = gptq.pack_int32(torch.zeros(2, 8, dtype=torch.long), 4, 1)
    with pytest.raises(ValueError, match="inconsistent"):
        gptq.dequantize(q, z, torch.ones(2, 16, dtype=torch.float16))


def test_bit_exact_against_gptqmodel_torch_kernel_synthetic():
    """Random codes, asymmetric zeros and act-order g_idx: our weight equals GPTQModel's TorchLinear's."""
    gen = torch.Generator().manual_seed(2)
    n_in, n_out, gs = 256, 64, 128
    codes = torch.randint(0, 16, (n_in, n_out), generator=gen)
    zeros = torch.randint(1, 15, (n_in // gs, n_out), generator=gen)
    tensors = {"qweight": gptq.pack_int32(codes, 4, 0), "qzeros": gptq.pack_int32(zeros - 1, 4, 1),
               "scales": (torch.rand(n_in // gs, n_out, generator=gen) / 50 + 1e-3).half(),
               "g_idx": (torch.arange(n_in) // gs)[torch.randperm(n_in, generator=gen)].int()}
    r = gptq.check_layer(tensors, group_size=gs, sym=False, desc_act=True)
    assert r["reference_kernel"] == "TorchLinear"
    assert r["weight_bit_exact"] and r["weight_max_abs_diff"] == 0.0
    assert r["output_ok"], r


def test_bit_exact_against_gptqmodel_on_the_int4_checkpoint():
    path = _int4_checkpoint()
    names = gptq.layer_names(path)
    assert len(names) >= 7 and all(n.startswith("model.layers.") for n in names)
    for name in (names[0], names[-1]):
        r = gptq.check_layer(gptq.read_layer(path, name))
        assert r["weight_bit_exact"], (name, r)
        assert r["output_ok"], (name, r)
    with pytest.raises(KeyError, match="layer_names"):
        gptq.read_layer(path, "model.no_such_layer")


def test_against_the_kernel_transformers_picks():
    """Load the Int4 twin through transformers' GPTQ integration: its in-memory zeros are v2 (GPTQModel
    added the one back), and the kernel that runs the model matches our weight within the tolerance."""
    from transformers import AutoModelForCausalLM

    path = _int4_checkpoint()
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16, device_map="cpu")
    modules = gptq.gptq_linear_modules(model)
    name = gptq.layer_names(path)[0]
    mod, stored = modules[name], gptq.read_layer(path, name)
    assert mod.qzero_format() == 2
    assert torch.equal(gptq.zero_points(mod.qzeros, 4, "gptq_v2"), gptq.zero_points(stored["qzeros"], 4, "gptq"))
    ours = gptq.dequantize(stored["qweight"], stored["qzeros"], stored["scales"], stored["g_idx"])
    assert torch.equal(gptq.kernel_dequantize(mod).to(ours.dtype), ours)
    r = gptq.check_layer(stored, kernel_module=mod, dtype=torch.bfloat16)
    assert r["output_kernel"] == "TorchAtenLinear" and r["output_dtype"] == "bfloat16"
    assert r["model_kernel_weight_bit_exact"] is True and r["weight_bit_exact"] and r["output_ok"], r
    # after its first forward the CPU kernel has repacked its weights: no GPTQ layout to compare
    r = gptq.check_layer(stored, kernel_module=mod, dtype=torch.bfloat16)
    assert r["model_kernel_weight_bit_exact"] is None and r["output_ok"], r

"""The W4A16 kernel (utils.kernels.w4a16) against the course's reference dequant, through Triton's
interpreter on CPU (compiled on a GPU: scripts/bench_w4a16.py runs this file there)."""
import dataclasses

import pytest
import torch

from bad_input_table import record
from utils import gptq, kernels, metrics
from utils.kernels import w4a16, w4a16_fragment, w4a16_launch

DEVICE = "cpu" if kernels.interpreted() else "cuda"
# the Gluon kernel runs here (an NVIDIA sm_80+ GPU, a Triton with Gluon): its tile joins every unpacking's test
FRAGMENT = DEVICE == "cuda" and w4a16.fragment_refusal(torch.float16, "cuda", 512, 64, torch.float16, False) is None


def layer(K=256, N=64, group=64, sym=True, act_order=False, fmt=1, bias=False, seed=0, zero_heavy=False):
    """GPTQ tensors for a random Int4 layer in the v1 (fmt 1) or v2 (fmt 2) qzeros layout, and the
    reference weight [K, N] (utils.gptq.dequantize: scale * (q - z), one rounding in fp16)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (K, N), generator=gen, dtype=torch.int32)
    if sym:
        z = torch.full((K // group, N), 8, dtype=torch.int32)
    else:   # zero points of 0 make v1's stored words borrow across codes (utils.gptq's docstring)
        hi = 2 if zero_heavy else 16
        z = torch.randint(0, hi, (K // group, N), generator=gen, dtype=torch.int32)
    s = (torch.rand(K // group, N, generator=gen) * 0.02 + 0.002).half()
    g_idx = (torch.randperm(K, generator=gen) // group).to(torch.int32) if act_order else None
    qz = gptq.pack_zero_points(z, 4, "gptq" if fmt == 1 else "gptq_v2")
    t = {"qweight": gptq.pack_int32(q, 4, 0), "qzeros": qz, "scales": s, "g_idx": g_idx,
         "bias": torch.randn(N, generator=gen).half() if bias else None}
    w = gptq.dequantize(t["qweight"], qz, s, g_idx, 4, "gptq" if fmt == 1 else "gptq_v2", group).t()
    return {k: (None if v is None else v.to(DEVICE)) for k, v in t.items()}, w


def call(x, t, group, fmt, **kw):
    return w4a16.w4a16_matmul(x, t["qweight"], t["qzeros"], t["scales"], t["g_idx"], t["bias"], group, fmt, **kw)


@pytest.mark.parametrize("group,sym,act_order,fmt", [(32, True, False, 1), (64, False, False, 1),
                                                      (128, False, True, 1), (64, True, True, 2),
                                                      (32, False, False, 2)])
def test_dequant_is_the_reference_bit_for_bit(group, sym, act_order, fmt):
    t, w = layer(group=group, sym=sym, act_order=act_order, fmt=fmt, zero_heavy=not sym)
    got = w4a16.w4a16_dequant(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], group, fmt)
    assert got.dtype == torch.float16 and torch.equal(got.cpu(), w)


def test_v1_zero_of_zero_borrows_across_codes():
    # asymmetric groups whose zero point is 0: v1 stores 0 - 1, which borrows from the next code of the
    # word; reading code by code plus one would give 16 and shift the next zero by one
    t, w = layer(sym=False, zero_heavy=True, seed=3)
    z = gptq.zero_points(t["qzeros"].cpu(), 4, "gptq")
    assert (z == 0).any() and (z == 1).any()
    got = w4a16.w4a16_dequant(t["qweight"], t["qzeros"], t["scales"], None, 64, 1)
    assert torch.equal(got.cpu(), w)
    wrong = w4a16.w4a16_dequant(t["qweight"], t["qzeros"], t["scales"], None, 64, 2)   # the v1 words read as v2
    assert not torch.equal(wrong.cpu(), w)


@pytest.mark.parametrize("M", [1, 3, 16, 17, 40])
@pytest.mark.parametrize("group,sym,act_order,bias", [(32, True, False, False), (64, False, False, True),
                                                       (128, False, True, True)])
def test_matmul_within_the_derived_bound(M, group, sym, act_order, bias):
    t, w = layer(group=group, sym=sym, act_order=act_order, bias=bias, seed=M)
    for dtype in (torch.float32, torch.float16):
        x = torch.randn(M, 256, generator=torch.Generator().manual_seed(M)).to(DEVICE, dtype)
        y = call(x, t, group, 1)
        ref = x.cpu().double() @ w.double() + (0 if t["bias"] is None else t["bias"].cpu().double())
        assert y.dtype == dtype and y.shape == (M, 64)
        rel = metrics.relative_l2(y.cpu(), ref)
        assert 0 < rel <= gptq.kernel_tolerance("QuantlabLinear", dtype, dtype, 256), (dtype, rel)


@pytest.mark.parametrize("split_k", [1, 2, 4])
def test_split_k_is_deterministic_and_agrees(split_k):
    t, w = layer(K=512, group=64, bias=True, seed=7)
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    tile = w4a16.W4A16Tile(block_n=32, block_k=64, split_k=split_k, num_warps=1)
    y = call(x, t, 64, 1, tile=tile)
    ref = x.cpu().double() @ w.double() + t["bias"].cpu().double()
    assert metrics.relative_l2(y.cpu(), ref) <= metrics.matmul_error_bound(torch.float32, 512)
    for _ in range(2):                                   # partials summed in a fixed order: the same bits
        assert torch.equal(call(x, t, 64, 1, tile=tile), y)
    poisoned = torch.full_like(y, float("nan"))          # every element written: no NaN left from anywhere
    assert torch.isfinite(y).all() and not torch.isfinite(poisoned).any()


def test_split_partials_are_kept_and_shared_by_every_row_count(monkeypatch):
    """One workspace per device, parts and N serves every plan (M = 1..16) and every layer of that shape: calls
    in any order give the bits of calls that each allocate their own partials."""
    (ta, _), (tb, _) = layer(K=512, group=64, seed=11), layer(K=512, group=64, bias=True, sym=False, seed=12)
    tile = w4a16.W4A16Tile(block_n=32, block_k=64, split_k=2, num_warps=1)
    xs = {M: torch.randn(M, 512, generator=torch.Generator().manual_seed(M)).to(DEVICE) for M in (1, 16)}
    order = [(16, ta), (1, tb), (1, ta), (16, tb)]
    kernels.cache.reset()
    monkeypatch.setattr(w4a16_launch, "split_partials", lambda *a: None)      # each call allocates them
    fresh = [call(xs[M], t, 64, 1, tile=tile) for M, t in order]
    monkeypatch.undo()
    kernels.cache.reset()
    kept = [call(xs[M], t, 64, 1, tile=tile) for M, t in order]
    assert all(torch.equal(a, b) for a, b in zip(fresh, kept))
    (ws,) = kernels.cache.w4a16_partials.values()
    assert ws.numel() == 2 * w4a16.W4A16_MAX_ROWS * 64
    plans = [w4a16.w4a16_plan(xs[M], ta["qweight"], ta["qzeros"], ta["scales"], None, None, 64, 1, tile)
             for M in (1, 16)]
    assert [tuple(p.partials.shape) for p in plans] == [(2, 1, 64), (2, 16, 64)]
    assert {p.partials.data_ptr() for p in plans} == {ws.data_ptr()}


def test_an_operand_moved_off_the_device_after_its_plan_is_refused_by_name():
    """A plan's compiled launches pass bare addresses: an operand that later lies elsewhere must miss the plan."""
    t, _ = layer(act_order=True, bias=True, seed=3)
    x = torch.randn(2, 256).to(DEVICE)
    call(x, t, 64, 1)                                                  # the plan is made
    elsewhere = "meta" if DEVICE == "cpu" else "cpu"
    for k in ("qweight", "qzeros", "scales", "g_idx", "bias"):
        with pytest.raises(ValueError, match="must be on one device"):
            call(x, dict(t, **{k: t[k].to(elsewhere)}), 64, 1)


def test_a_strided_operand_is_refused_by_name_even_after_its_plan():
    """The kernel reads each operand as packed, row after row: a view with other strides and the same shape
    and values would be read wrong, silently."""
    t, _ = layer(act_order=True, bias=True, seed=4)
    x = torch.randn(2, 256).to(DEVICE)
    call(x, t, 64, 1)                                                  # the plan is made
    for k in ("qweight", "qzeros", "scales", "g_idx", "bias"):
        v = t[k]
        strided = v.t().contiguous().t() if v.dim() == 2 else torch.stack([v, v], 1)[:, 0]
        assert torch.equal(strided, v) and not strided.is_contiguous()
        with pytest.raises(ValueError, match=f"{k} must be contiguous") as e:
            call(x, dict(t, **{k: strided}), 64, 1)
    record("kernel", "w4a16_matmul: a strided operand (bias)", str(e.value))


def test_leading_dims_and_a_strided_input():
    t, w = layer(seed=2)
    x = torch.randn(2, 3, 512, generator=torch.Generator().manual_seed(0)).to(DEVICE)[..., ::2]   # [2, 3, 256]
    y = call(x, t, 64, 1)
    assert y.shape == (2, 3, 64)
    assert torch.allclose(y, call(x.contiguous().reshape(6, 256), t, 64, 1).reshape(2, 3, 64))


def test_custom_op_passes_opcheck():
    t, _ = layer(act_order=True, bias=True, seed=4)
    x = torch.randn(3, 256).to(DEVICE)
    args = (x, t["qweight"], t["qzeros"], t["scales"], t["g_idx"], t["bias"], 64, 1)
    torch.library.opcheck(w4a16.w4a16_op, args, test_utils=("test_schema", "test_faketensor",
                                                            "test_aot_dispatch_dynamic"))
    assert torch.equal(torch.ops.quantlab.w4a16_matmul(*args), call(x, t, 64, 1))


def quantlab_layer(t, group=64):
    """The model's swapped-in layer over these GPTQ tensors, as it wraps a loaded GPTQModel layer (v1 zeros)."""
    from utils.quantlab_linear import QuantlabLinear

    src = torch.nn.Module()
    src.bits, src.group_size, src.pack_dtype = 4, group, torch.int32
    for k in ("qweight", "qzeros", "scales", "bias"):
        setattr(src, k, t[k])
    src.qzero_format = lambda: 1
    return QuantlabLinear(src)


def test_compiled_fullgraph_calls_the_op_without_a_break():
    from torch._dynamo.testing import CompileCounterWithBackend

    t, w = layer(bias=True, seed=5)
    mod = quantlab_layer(t)
    x = torch.randn(4, 256).to(DEVICE)
    counter = CompileCounterWithBackend("aot_eager")
    f = torch.compile(lambda v: torch.nn.functional.silu(mod(v)) * 2, backend=counter, fullgraph=True)
    y = f(x)
    assert counter.frame_count == 1
    ops = [n.target for g in counter.graphs for n in g.graph.nodes if n.op == "call_module" or n.op == "call_function"]
    assert any("w4a16" in str(o) for o in ops), ops
    assert torch.equal(y, torch.nn.functional.silu(mod(x)) * 2)


@pytest.mark.parametrize("case,change,needle", [
    ("group_size not a power of two", dict(group_size=48), "group_size"),
    ("zero_format not 1 or 2", dict(zero_format=3), "zero_format"),
    ("scales of another group size", dict(scales=torch.ones(2, 64, dtype=torch.float16)), "scales must be"),
    ("x with the wrong K", dict(x=torch.randn(1, 128)), "input features"),
    ("g_idx int64", dict(g_idx=torch.zeros(256, dtype=torch.int64)), "g_idx must be int32"),
    ("bias of the wrong length", dict(bias=torch.zeros(32, dtype=torch.float16)), "bias must be"),
])
def test_bad_operands_are_named(case, change, needle):
    t, _ = layer()
    args = dict(x=torch.randn(1, 256), qweight=t["qweight"], qzeros=t["qzeros"], scales=t["scales"], g_idx=None,
                bias=None, group_size=64, zero_format=1)
    args.update({k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in change.items()})
    args["x"] = args["x"].to(DEVICE)
    with pytest.raises(ValueError, match=needle) as e:
        w4a16.w4a16_matmul(**args)
    record("kernel", f"w4a16_matmul: {case}", str(e.value))


@pytest.mark.skipif(DEVICE != "cpu", reason="the CPU refusal: a CPU without the interpreter")
def test_cpu_without_the_interpreter_is_refused(monkeypatch):
    t, _ = layer()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1") as e:
        call(torch.randn(1, 256), t, 64, 1)
    record("kernel", "w4a16_matmul on a CPU without Triton's interpreter", str(e.value))


@pytest.mark.parametrize("K,N,split,fragment_split", [(3584, 3584, 14, 14), (3584, 512, 28, 28), (3584, 18944, 4, 3),
                                                      (18944, 3584, 19, 17)])
def test_default_tile_on_an_h100_at_qwen_shapes(monkeypatch, K, N, split, fragment_split):
    # the GPU rule (132 SMs): ~8 programs per SM over whole K steps, a 3-deep pipeline, the same tile for
    # every M (a batch changes no summation order); fp16 scales without act-order unpack in PTX
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    unpack = w4a16.w4a16_default_unpack(torch.float16, act_order=False)
    tiles = {w4a16.w4a16_default_tile(m, K, N, 128, 132, unpack) for m in (1, 5, 16)}
    assert unpack == "ptx" and tiles == {w4a16.W4A16Tile(64, 128, split, 4, 3, "ptx")}
    steps, per = K // 128, -(-K // 128 // split)
    assert (split - 1) * per < steps <= split * per                 # no program without a K step
    # the Gluon kernel: 128 columns, the most programs that fit the GPU at once (one wave), the same at every M
    fragment = w4a16.w4a16_default_tile(1, K, N, 128, 132, "fragment")
    assert fragment == w4a16.W4A16Tile(128, 128, fragment_split, 4, 1, "fragment")
    blocks, places = -(-N // 128), w4a16_fragment.PROGRAMS_PER_SM * 132
    assert blocks * fragment_split <= places or fragment_split == 1
    per = -(-steps // fragment_split)
    assert per == 1 or blocks * -(-steps // (per - 1)) > places      # the next split (a step less each) would not
    # from RING_ROWS rows its weight goes through a ring in shared memory (the same bits), with the same split
    rows = w4a16_fragment.RING_ROWS
    assert {w4a16.w4a16_default_tile(m, K, N, 128, 132, "fragment").num_stages for m in (rows - 1, rows, 16)} \
        == {1, w4a16_fragment.RING_STAGES}
    assert w4a16.w4a16_default_tile(16, K, N, 128, 132, "fragment") == dataclasses.replace(
        fragment, num_stages=w4a16_fragment.RING_STAGES)
    # the gated kernel (two weights' words in flight) takes the ring at one row too: at every M
    ring = {m for m in range(1, 17) if w4a16.w4a16_default_tile(m, K, N, 128, 132, "fragment", gated=True).num_stages
            == w4a16_fragment.RING_STAGES}
    assert ring == set(w4a16_fragment.GATED_RING_ROWS) | set(range(rows, 17)) and 1 in ring
    gated = {w4a16.w4a16_default_tile(m, K, N, 128, 132, "fragment", gated=True) for m in (1, 2, 16)}
    assert len({dataclasses.replace(t, num_stages=0) for t in gated}) == 1      # one split at every M
    g = gated.pop()                                                 # its programs fit one wave too
    assert -(-N // g.block_n) * g.split_k <= w4a16_fragment.GATED_PROGRAMS_PER_SM * 132 or g.split_k == 1


def test_the_fragment_kernel_is_chosen_where_it_serves(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    cap = {"cap": (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap["cap"])
    ok = dict(x_dtype=torch.float16, device="cuda", K=3584, group_size=128, scales_dtype=torch.float16, act_order=False)
    assert w4a16.fragment_refusal(**ok) is None and w4a16.fragment_refusal(**{**ok, "x_dtype": torch.bfloat16}) is None
    assert w4a16.fragment_refusal(**{**ok, "group_size": 32}) is None
    for change, needle in (({"K": 3600}, "multiple of 128"), ({"group_size": 16}, "at least 32"),
                           ({"scales_dtype": torch.bfloat16}, "float16 scales"), ({"act_order": True}, "act-order"),
                           ({"x_dtype": torch.float32}, "bfloat16 x"), ({"device": "cpu"}, "sm_80+")):
        assert needle in w4a16.fragment_refusal(**{**ok, **change}), change
    cap["cap"] = (8, 9)                                          # an RTX 4090 can run it
    assert w4a16.fragment_refusal(**ok) is None
    cap["cap"] = (7, 5)                                          # a T4: no bf16 mma.sync
    assert "sm_80+" in w4a16.fragment_refusal(**ok)
    # the default: where it serves (as on a GPU that runs it), on Hopper only, where it was measured
    x = torch.empty(1, 3584, dtype=torch.float16)
    monkeypatch.setattr(w4a16_launch, "fragment_refusal", lambda *a: None)
    cap["cap"] = (9, 0)
    assert w4a16.w4a16_default_unpack(torch.float16, False, x, 128) == "fragment"
    cap["cap"] = (8, 9)
    assert w4a16.w4a16_default_unpack(torch.float16, False, x, 128) == "ptx"


def test_default_unpack_follows_the_scales_and_act_order(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert w4a16.w4a16_default_unpack(torch.bfloat16, act_order=False) == "join"
    assert w4a16.w4a16_default_unpack(torch.float16, act_order=True) == "reshape"
    monkeypatch.setenv("TRITON_INTERPRET", "1")                # the interpreter runs no PTX
    assert w4a16.w4a16_default_unpack(torch.float16, act_order=False) == "join"


def test_block_k_divides_k_and_the_group():
    assert [w4a16.w4a16_block_k(256, g) for g in (16, 32, 64, 128, 256)] == [16, 32, 64, 128, 128]
    assert w4a16.w4a16_block_k(96, 32) == 32 and w4a16.w4a16_block_k(80, 16) == 16


@pytest.mark.parametrize("act_order", [False, True])
def test_both_unpackings_give_the_same_bits(act_order):
    t, w = layer(K=256, group=64, sym=False, act_order=act_order, bias=True, seed=11)
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    reshaped = call(x, t, 64, 1, tile=w4a16.W4A16Tile(32, 64, 2, 1, 1, unpack="reshape"))
    by_rows = call(x, t, 64, 1, tile=w4a16.W4A16Tile(32, 64, 2, 1, 1, unpack="rows"))
    assert torch.equal(reshaped, by_rows)
    ref = x.cpu().double() @ w.double() + t["bias"].cpu().double()
    assert metrics.relative_l2(by_rows.cpu(), ref) <= metrics.matmul_error_bound(torch.float32, 256)


def ring_matches_registers(M):
    """The Gluon kernel's weight through shared memory (cp.async) instead of registers changes where bytes
    wait, not one product or its order: the same bits at any ring size and split (16 > 8 steps: idle
    programs), with a last column block cut short (N 136, 200), per-block groups (32, 64), x either way."""
    for group, N, block_n, split in ((128, 128, 128, 3), (64, 192, 64, 16), (32, 136, 128, 16), (128, 200, 64, 1)):
        t, w = layer(K=1024, N=N, group=group, sym=False, fmt=1, bias=True, zero_heavy=True, seed=group + M)
        x = torch.randn(M, 1024, generator=torch.Generator().manual_seed(M)).to(DEVICE, torch.float16)
        ref = x.cpu().double() @ w.double() + t["bias"].cpu().double()
        regs = call(x, t, group, 1, tile=w4a16.W4A16Tile(block_n, 128, split, 4, 1, "fragment"))
        bound = gptq.kernel_tolerance("QuantlabLinear", torch.float16, torch.float16, 1024)
        assert metrics.relative_l2(regs.cpu(), ref) <= bound
        for stages in (w4a16_fragment.RING_FROM, w4a16_fragment.MAX_STAGES):
            tile = w4a16.W4A16Tile(block_n, 128, split, 4, stages, "fragment")
            assert torch.equal(call(x, t, group, 1, tile=tile), regs), (group, N, block_n, split, stages)
        # operands not 16-byte aligned (views one element in): cp.async cannot copy them, the register loop does
        odd = {k: (None if v is None else torch.cat([v.new_zeros(1), v.flatten()])[1:].view(v.shape))
               for k, v in t.items()}
        xo = torch.cat([x.new_zeros(1), x.flatten()])[1:].view(x.shape)
        assert odd["scales"].data_ptr() % 16
        assert torch.equal(call(xo, odd, group, 1, tile=tile), regs)


@pytest.mark.parametrize("unpack", ["reshape", "rows", "join"] + ([] if kernels.interpreted() else ["ptx"])
                         + (["fragment"] if FRAGMENT else []))
@pytest.mark.parametrize("M,sym,fmt,bias", [(1, True, 1, False), (16, False, 1, True), (5, False, 2, False)])
def test_every_unpack_agrees_with_the_reference(unpack, M, sym, fmt, bias, monkeypatch):
    t, w = layer(K=512, N=128, group=128, sym=sym, fmt=fmt, bias=bias, zero_heavy=not sym, seed=M)
    x = torch.randn(M, 512, generator=torch.Generator().manual_seed(M)).to(DEVICE, torch.float16)
    tile = w4a16.W4A16Tile(block_n=64, block_k=128, split_k=2, num_warps=4, num_stages=1 if unpack == "fragment" else 2,
                           unpack=unpack)
    y = call(x, t, 128, fmt, tile=tile)
    ref = x.cpu().double() @ w.double() + (0 if t["bias"] is None else t["bias"].cpu().double())
    assert metrics.relative_l2(y.cpu(), ref) <= gptq.kernel_tolerance("QuantlabLinear", torch.float16, torch.float16, 512)
    base = call(x, t, 128, fmt, tile=w4a16.W4A16Tile(64, 128, 2, 4, unpack="reshape"))
    # same dequantized weights, another operand order: at most a rounding of the fp16 output apart
    assert torch.allclose(y.float(), base.float(), rtol=2e-3, atol=1e-3)
    if unpack == "fragment":
        # x read by each warp or once per program into shared memory: the same bits at any M; with more splits
        # than the 4 K steps, the idle programs load in bounds and add zeros
        monkeypatch.setattr(w4a16_fragment, "SHARED_X_FROM", 17 if M >= w4a16_fragment.SHARED_X_FROM else 2)
        assert torch.equal(call(x, t, 128, fmt, tile=tile), y)
        idle = call(x, t, 128, fmt, tile=w4a16.W4A16Tile(64, 128, 8, 4, 1, "fragment"))
        assert torch.allclose(idle.float(), y.float(), rtol=2e-3, atol=1e-3)
        if M in (1, 16):                    # one row is compiled apart; from 2 rows x goes through shared memory
            ring_matches_registers(M)


def test_an_unpack_that_cannot_serve_the_call_is_refused_by_name():
    t, _ = layer(act_order=True, seed=6)
    x = torch.randn(2, 256).to(DEVICE, torch.float16)
    with pytest.raises(ValueError, match="tile.unpack='join' reads one group per tile"):
        call(x, t, 64, 1, tile=w4a16.W4A16Tile(32, 64, 1, 4, unpack="join"))
    with pytest.raises(ValueError, match="tile.unpack must be one of"):
        call(x, t, 64, 1, tile=w4a16.W4A16Tile(32, 64, 1, 4, unpack="nibbles"))
    t, _ = layer(seed=6)
    with pytest.raises(ValueError, match="tile.unpack='fragment'") as e:
        call(x, t, 64, 1, tile=w4a16.W4A16Tile(64, 128, 1, 4, w4a16_fragment.MAX_STAGES + 1, "fragment"))
    record("kernel", "w4a16_matmul: the Gluon kernel's tile where it cannot run", str(e.value))

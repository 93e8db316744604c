"""The Gluon W4A16 kernel's split-K sum in its last program (utils.kernels.w4a16_fragment.last_sum): which calls
take it, and on a GPU that it gives the sum kernel's bits, leaves its counts at zero, and survives torch.compile's
CUDA graphs, whose warm-up would otherwise keep the counts in their memory pool."""
import pytest
import torch

from test_w4a16 import DEVICE, FRAGMENT, call, layer, quantlab_layer
from utils import kernels
from utils.kernels import w4a16, w4a16_fragment, w4a16_launch

QWEN_7B = {"q/o": (3584, 3584), "k/v": (3584, 512), "gate/up": (3584, 18944), "down": (18944, 3584)}


def takes_last_sum(M, K, N, gated=False, sms=132):
    tile = w4a16.w4a16_default_tile(M, K, N, 128, sms, "fragment", gated)
    return w4a16_fragment.last_sum(M, tile.split_k, tile.block_n, gated)


def test_one_row_always_and_sixteen_rows_only_where_few_partials(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")                  # the tile a GPU gets, not the interpreter's
    # one row: each partial is one element a thread, so even k/v's 28 partials are read at once
    assert all(takes_last_sum(1, K, N) for K, N in QWEN_7B.values())
    # 16 rows: a partial is the whole 16-row tile (16 registers a thread); gate/up's 3 fit, q/o's 14 do not
    assert {name for name, (K, N) in QWEN_7B.items() if takes_last_sum(16, K, N)} == {"gate/up"}
    assert takes_last_sum(16, 3584, 18944, gated=True) and takes_last_sum(1, 3584, 18944, gated=True)
    assert not w4a16_fragment.last_sum(16, 1, 128)               # no split, nothing to sum
    monkeypatch.setattr(w4a16_fragment, "LAST_SUM", False)
    assert not any(takes_last_sum(m, K, N) for m in (1, 16) for K, N in QWEN_7B.values())


def test_kept_zeros_are_zeros():
    counts = w4a16_launch.kept_zeros(torch.device(DEVICE), 37, torch.int32)
    assert counts.dtype == torch.int32 and counts.shape == (37,) and not counts.any()


gpu = pytest.mark.skipif(not FRAGMENT, reason="the Gluon kernel runs only compiled on an NVIDIA sm_80+ GPU")


def plan_of(x, t, gated=False):
    return w4a16.w4a16_plan(x, t["qweight"], t["qzeros"], t["scales"], None, t["bias"], 64, 1, gated=gated)


@gpu
@pytest.mark.parametrize("M", [1, 2, 16])
@pytest.mark.parametrize("bias", [False, True])
def test_last_program_gives_the_sum_kernels_bits(M, bias, monkeypatch):
    t, _ = layer(K=1024, N=320, group=64, bias=bias, seed=M)      # 5 column blocks of 64, a ragged last one at 128
    x = torch.randn(M, 1024, generator=torch.Generator().manual_seed(M)).to(DEVICE, torch.float16)
    for block_n, split in ((64, 2), (128, 3), (128, 8)):
        tile = w4a16.W4A16Tile(block_n, 128, split, 4, 3 if M > 1 else 1, "fragment")
        ys = [call(x, t, 64, 1, tile=tile) for _ in range(3)]     # the counts go back to 0 after each call
        plan = w4a16.w4a16_plan(x, t["qweight"], t["qzeros"], t["scales"], None, t["bias"], 64, 1, tile)
        assert (plan.counts is not None) == w4a16_fragment.last_sum(M, split, block_n)
        if plan.counts is not None:
            assert plan.sum is None and not plan.counts.any()
        monkeypatch.setattr(w4a16_fragment, "LAST_SUM", False)
        ref = call(x, t, 64, 1, tile=tile)
        assert w4a16.w4a16_plan(x, t["qweight"], t["qzeros"], t["scales"], None, t["bias"], 64, 1, tile).sum
        monkeypatch.setattr(w4a16_fragment, "LAST_SUM", True)
        assert all(torch.equal(y, ref) for y in ys), (block_n, split)


@gpu
@pytest.mark.parametrize("M", [1, 16])
def test_gated_last_program_gives_the_sum_kernels_bits(M, monkeypatch):
    (tg, _), (tu, _) = layer(K=1024, N=192, group=64, bias=True, seed=3), layer(K=1024, N=192, group=64, bias=True,
                                                                              seed=4, sym=False)
    x = torch.randn(M, 1024).to(DEVICE, torch.float16)
    gate, up = [(t["qweight"], t["qzeros"], t["scales"], t["bias"]) for t in (tg, tu)]
    tile = w4a16.W4A16Tile(64, 128, 2, 4, 3, "fragment")
    y = w4a16.w4a16_gated_silu(x, gate, up, 64, 1, tile)
    assert torch.equal(w4a16.w4a16_gated_silu(x, gate, up, 64, 1, tile), y)
    monkeypatch.setattr(w4a16_fragment, "LAST_SUM", False)
    assert torch.equal(w4a16.w4a16_gated_silu(x, gate, up, 64, 1, tile), y)


@gpu
def test_a_plan_first_made_inside_compiled_cuda_graphs_keeps_its_counts_and_partials_outside_their_pool():
    t, _ = layer(K=1024, N=512, group=64, bias=True, seed=7)
    mod = quantlab_layer(t)
    x = torch.randn(1, 1024).to(DEVICE, torch.float16)
    kernels.cache.reset()                        # the first call of this shape runs inside the graphs' warm-up
    f = torch.compile(mod, mode="reduce-overhead", fullgraph=True)
    ys = [f(x).clone() for _ in range(4)]        # warm-up, recording, then replays
    kernels.cache.reset()
    eager = mod(x)
    plan = w4a16.w4a16_plan(x, t["qweight"], t["qzeros"], t["scales"], None, t["bias"], 64, 1)
    assert plan.counts is not None and plan.sum is None and not plan.counts.any() and plan.partials is not None
    assert all(torch.equal(y, eager) for y in ys)


@gpu
def test_a_plan_first_made_while_capturing_takes_the_sum_kernel_and_allocates_its_partials():
    t, _ = layer(K=1024, N=512, group=64, seed=8)
    x = torch.randn(1, 1024).to(DEVICE, torch.float16)
    kernels.cache.reset()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = call(x, t, 64, 1)
    graph.replay()
    captured = plan_of(x, t)
    assert captured.counts is None and captured.sum is not None and captured.partials is None   # a call allocates them
    kernels.cache.reset()
    assert torch.equal(y, call(x, t, 64, 1)) and plan_of(x, t).counts is not None and plan_of(x, t).partials is not None

"""The Int4 (GPTQ) GEMV, its packing and launch plans, and the read floor it is measured against
(through TRITON_INTERPRET=1 on CPU, compiled on a GPU: scripts/device_bench.sh runs this file there)."""
import pytest
import torch

from utils import gptq, kernels, metrics, roofline

DEVICE = "cpu" if kernels.interpreted() else "cuda"


def test_gptq_pack_dequant_hand_case():
    # one group of 8 rows x 8 columns; column 0 holds 0..7, so its codes are known: s = 2*7/15, zero 8
    w = torch.zeros(8, 8)
    w[:, 0] = torch.arange(8.0)
    w[0, 1:] = -1.0
    qw, qz, s = kernels.pack_gptq_int4(w, group_size=8)
    assert qw.shape == (1, 8) and qz.shape == (1, 1) and s.shape == (1, 8)
    assert s[0, 0].item() == pytest.approx(14 / 15, rel=1e-3)
    q = gptq.unpack_int32(qw, 4, dim=0)
    assert q[:, 0].tolist() == [8, 9, 10, 11, 12, 13, 14, 15]          # round(i * 15/14) + 8
    assert q[0, 1].item() == 0                                          # -1 / (2/15) = -7.5 -> -8 (even)
    assert gptq.unpack_int32(qz, 4, dim=1)[0].tolist() == [7] * 8            # zero 8 stored minus one
    assert gptq.unpack_int32(torch.tensor([[0x76543210]], dtype=torch.int32), 4, dim=0)[:, 0].tolist() == \
        list(range(8))
    wd = kernels.dequant_gptq_int4(qw, qz, s, 8)
    assert wd[:, 0].tolist() == pytest.approx([i * s[0, 0].item() for i in range(8)])
    # +max|w| = 7.5 s clips to code 15 (7 s): half a step, plus 8 steps' share of s's fp16 rounding
    assert (wd - w).abs().max().item() <= s.float().max().item() * (0.5 + 8 * 2**-11)


def fixup_state(x, qw, qz, s, **options):
    """(workspace, counters) of the plan int4_gemv runs for these operands and options."""
    plan = kernels.int4_gemv_plan(x, qw, qz, s, 128, **options)
    return plan.workspace, plan.counters


@pytest.mark.parametrize("split_k", [1, 3, 4])
def test_int4_gemv_matches_dequant_reference(split_k):
    torch.manual_seed(0)
    w = torch.randn(512, 96)
    qw, qz, s = (t.to(DEVICE) for t in kernels.pack_gptq_int4(w, 128))
    x = torch.randn(1, 512).half().to(DEVICE)
    ref = x.double() @ kernels.dequant_gptq_int4(qw, qz, s, 128).double()
    y = kernels.int4_gemv(x, qw, qz, s, 128, block_n=32, split_k=split_k)
    assert y.dtype == torch.float16 and y.shape == (1, 96)
    assert metrics.relative_l2(y, ref) <= metrics.matmul_error_bound(torch.float16, 512)
    strided = qw.t().contiguous().t()                       # same values, column-major storage
    assert torch.equal(kernels.int4_gemv(x, strided, qz, s, 128, block_n=32, split_k=split_k), y)
    # the split-K fix-up sums the partials in a fixed order, so later calls give the same bits (fp32
    # atomics would not promise that); each call leaves its counters' arrivals at 0 and one call more
    for _ in range(3):
        assert torch.equal(kernels.int4_gemv(x, qw, qz, s, 128, block_n=32, split_k=split_k), y)
    if split_k > 1:
        counters = fixup_state(x, qw, qz, s, block_n=32, split_k=split_k)[1]
        assert counters.numel() == 3 and int((counters & 0xFFFF).abs().sum()) == 0
        assert len(set((counters >> 16).tolist())) == 1 and int(counters[0] >> 16) >= 5
    # the other fix-up (a sum kernel, with PDL on sm_90+): right, the same bits every call, and within
    # an fp16 rounding of the in-kernel one (both sum in a fixed order, not the same order)
    by_kernel = [kernels.int4_gemv(x, qw, qz, s, 128, block_n=32, split_k=split_k, fixup="sum kernel")
                 for _ in range(3)]
    assert all(torch.equal(b, by_kernel[0]) for b in by_kernel)
    assert metrics.relative_l2(by_kernel[0], ref) <= metrics.matmul_error_bound(torch.float16, 512)
    assert ((by_kernel[0].float() - y.float()).abs() <= y.float().abs() * 2**-10 + 2**-24).all()
    assert torch.equal(kernels.int4_gemv(x, qw, qz, s, 128, block_n=32, split_k=split_k), y)   # states apart
    with pytest.raises(ValueError, match="fixup must be"):
        kernels.int4_gemv(x, qw, qz, s, 128, block_n=32, split_k=split_k, fixup="atomics")
    with pytest.raises(ValueError, match="batch 1"):
        kernels.int4_gemv(torch.randn(2, 512).half().to(DEVICE), qw, qz, s, 128)
    with pytest.raises(ValueError, match="power of two"):    # tl.arange needs it: a clear error, not Triton's
        kernels.int4_gemv(x, qw, qz, s, 96)
    # the smallest group (one packed row) runs on the exact f32 dequant, wherever it runs
    packed8 = [t.to(DEVICE) for t in kernels.pack_gptq_int4(torch.randn(64, 32), 8)]
    y8 = kernels.int4_gemv(x[:, :64], *packed8, 8, block_n=32, split_k=2, dequant="f32")
    ref8 = x[:, :64].double() @ kernels.dequant_gptq_int4(*packed8, 8).double()
    assert metrics.relative_l2(y8, ref8) <= metrics.matmul_error_bound(torch.float16, 64)
    if DEVICE == "cpu":
        with pytest.raises(ValueError, match="f16x2"):
            kernels.int4_gemv(x, qw, qz, s, 128, dequant="f16x2")   # no inline PTX in the interpreter
    else:
        assert kernels.int4_gemv_dequant(x) == "f16x2"
        with pytest.raises(ValueError, match="group_size >= 16"):        # f16x2 reads two packed rows at once
            kernels.int4_gemv(x[:, :64], *packed8, 8)
        exact = kernels.int4_gemv(x, qw, qz, s, 128, block_n=32, split_k=split_k, dequant="f32")
        assert metrics.relative_l2(exact, ref) <= metrics.matmul_error_bound(torch.float16, 512)


@pytest.mark.parametrize("fixup", kernels.GEMV_FIXUPS)
def test_int4_gemv_stays_right_where_fp16_products_overflow(fixup):
    """|x| ~ 4000 with small weights: y fits fp16, but 8 x 8 x |x| does not, so the f16x2 dequant
    (the GPU default) overflows and must redo the block in fp32, in the GEMV kernel or in the sum
    kernel. On the CPU the f32 dequant runs and this checks the reference path;
    scripts/device_bench.sh runs it on the GPU."""
    torch.manual_seed(1)
    w = torch.randn(256, 64) * 1e-3
    qw, qz, s = (t.to(DEVICE) for t in kernels.pack_gptq_int4(w, 128))
    x = (torch.randn(1, 256) * 4000).half().to(DEVICE)
    ref = x.double() @ kernels.dequant_gptq_int4(qw, qz, s, 128).double()
    assert (8 * 8 * x.float().abs().max()) > 65504         # the premise: |q - z| <= 8 here, fp16 overflows
    y = kernels.int4_gemv(x, qw, qz, s, 128, block_n=32, split_k=2, fixup=fixup)
    assert torch.isfinite(y).all()
    assert metrics.relative_l2(y, ref) <= metrics.matmul_error_bound(torch.float16, 256)


def test_roofline_bytes_and_bounds():
    assert roofline.int4_weight_bytes(256, 8, 128) == 256 * 8 / 2 + 2 * 8 * 2 + 2 * 8 / 2
    bf16 = roofline.gemm_bytes(1, 4096, 4096, 2, 2, 2)
    p = roofline.point("gemv", 2 * 4096 * 4096, bf16, 1e-5)
    assert p["intensity"] == pytest.approx(2 * 4096 * 4096 / bf16)
    assert roofline.bound(p, peak_tflops=700, bandwidth_gbps=3000) == "memory"
    assert roofline.attainable_tflops(1.0, 700, 3000) == pytest.approx(3.0)
    assert roofline.attainable_tflops(1e6, 700, 3000) == pytest.approx(700)
    with pytest.raises(ValueError, match="multiple"):
        roofline.int4_weight_bytes(100, 8, 128)


def test_int4_gemv_autotune_turns_groups_per_program_into_a_split_k_per_shape():
    """The GPU autotuner's candidates: split-K a compile-time constant (so the fix-up is unrolled), never
    above 64 (the measured cliff), one candidate per distinct (tile, warps, split, stages). The one-wave
    candidate on an H200's 132 SMs: 3696 one-warp programs at 72 registers, so split 6 for 592 column
    blocks of 32 (a split the 5-group candidate gives too) and 33 for 112. With PDL (sm_90+) the one-warp
    32-column tiles sum a split of 16 or more in the sum kernel, whose one-warp programs (one per 32
    columns) must fit beside the GEMV's: the one-wave split for 112 column blocks is then 32; other
    tiles keep the in-kernel fix-up."""
    cases = (((3584, 18944, False), {6, 7, 14}, set()), ((18944, 3584, False), {30, 33, 37, 50}, set()),
             ((256, 18944, False), {1, 2}, set()), ((3584, 18944, True), {6, 7, 14}, set()),
             ((18944, 3584, True), {30, 32, 37, 50}, {30, 32}))
    for (K, N, pdl), want, by_sum_kernel in cases:
        pruned = kernels.gemv_candidates(K, N, 128, sms=132, pdl=pdl)
        splits = {c.kwargs["SPLIT_K"] for c in pruned}
        assert splits == want, (K, pdl, splits)
        assert {c.kwargs["SPLIT_K"] for c in pruned if c.kwargs["SUM_KERNEL"]} == by_sum_kernel, (K, pdl)
        assert {c.kwargs["NUM_STAGES"] for c in pruned} == {1, 2}
        keys = [(c.kwargs["BLOCK_N"], c.num_warps, c.kwargs["SPLIT_K"], c.kwargs["NUM_STAGES"], c.kwargs["SUM_KERNEL"])
                for c in pruned]
        assert len(keys) == len(set(keys)) and all("GROUPS_PER_PROGRAM" not in c.kwargs for c in pruned)
        # each candidate's fix-up state is its own slice: the slices follow one another, no overlap
        ws, locks = 0, 0
        for c in pruned:
            assert (c.kwargs["WS_OFF"], c.kwargs["LOCK_OFF"]) == (ws, locks)
            words, counters = kernels.gemv_state_words(c.kwargs["BLOCK_N"], c.kwargs["SPLIT_K"], N)
            ws, locks = ws + words, locks + counters
            assert c.kwargs["POLL_ROWS"] * c.kwargs["BLOCK_N"] <= 32 * 32 * c.num_warps or c.kwargs["POLL_ROWS"] == 1
    assert kernels.gemv_split(10_000, 2) == 64          # 10000 groups: at most 64 programs along K
    assert kernels.gemv_one_wave_split(10_000, 8, 1, 132) == 64      # the same cap for the one-wave split
    assert kernels.gemv_one_wave_split(148, 10_000, 1, 132) == 1     # more column blocks than fit: no split
    assert kernels.gemv_one_wave_split(148, 112, 1, 132, reserve=112) == 32          # room left for 112 more
    assert kernels.resident_programs(72, 1, 132) == 3696 and kernels.resident_programs(64, 1, 132) == 4224


def test_gemv_hopper_tile_is_the_measured_one_wave_tile():
    """Qwen2.5-7B's MLP shapes on 132 SMs: split 6 (592 column blocks of 32, 3696 one-warp programs in a
    wave) with the in-kernel fix-up; split 33 for 112 blocks, 32 with the sum kernel's 112 programs beside
    it when PDL runs (sm_90), 33 with the in-kernel fix-up when it does not."""
    assert kernels.gemv_hopper_tile(28, 18944, 132, True) == {
        "block_n": 32, "num_warps": 1, "num_stages": 1, "split_k": 6, "fixup": "in-kernel"}
    tile = kernels.gemv_hopper_tile(148, 3584, 132, True)
    assert (tile["split_k"], tile["fixup"]) == (32, "sum kernel")
    tile = kernels.gemv_hopper_tile(148, 3584, 132, False)
    assert (tile["split_k"], tile["fixup"]) == (33, "in-kernel")
    assert kernels.gemv_hopper_tile(1, 64, 132, True)["split_k"] == 1       # one group: nothing to split
    # 220 column blocks: one wave is split 16, 15 with the sum kernel's room, so the in-kernel fix-up
    # (below gemv_plan.SUM_MIN_SPLIT), as the autotuner's one-wave candidate has it
    tile = kernels.gemv_hopper_tile(148, 7040, 132, True)
    assert (tile["split_k"], tile["fixup"]) == (15, "in-kernel")


def test_int4_gemv_gives_the_same_bits_for_every_num_stages():
    """Pipelining (NUM_STAGES > 1: codes staged in shared memory by cp.async on a GPU) moves data, not
    arithmetic: the sums run in the same order, so the result is bit-identical to the unpipelined one."""
    torch.manual_seed(4)
    w = torch.randn(1024, 64)
    qw, qz, s = (t.to(DEVICE) for t in kernels.pack_gptq_int4(w, 128))
    x = torch.randn(1, 1024).half().to(DEVICE)
    ys = [kernels.int4_gemv(x, qw, qz, s, 128, block_n=32, split_k=2, num_warps=1, num_stages=st)
          for st in (1, 2, 3)]
    assert torch.equal(ys[0], ys[1]) and torch.equal(ys[0], ys[2])
    ref = x.double() @ kernels.dequant_gptq_int4(qw, qz, s, 128).double()
    assert metrics.relative_l2(ys[0], ref) <= metrics.matmul_error_bound(torch.float16, 1024)
    with pytest.raises(ValueError, match="num_stages"):
        kernels.int4_gemv(x, qw, qz, s, 128, block_n=32, split_k=2, num_stages=0)


@pytest.mark.parametrize("num_warps", [1, 2, 4])
def test_int4_gemv_with_rows_spread_over_warps(num_warps):
    """block_n = 128 puts one warp across the columns; more warps split the rows of each group between
    them (ROW_ACC: one sum per row, reduced across warps once at the end). Both orders of summation must
    give the reference."""
    torch.manual_seed(5)
    w = torch.randn(768, 256) * 0.02
    qw, qz, s = (t.to(DEVICE) for t in kernels.pack_gptq_int4(w, 128))
    x = torch.randn(1, 768).half().to(DEVICE)
    ref = x.double() @ kernels.dequant_gptq_int4(qw, qz, s, 128).double()
    y = kernels.int4_gemv(x, qw, qz, s, 128, block_n=128, split_k=2, num_warps=num_warps)
    assert y.shape == (1, 256) and bool(torch.isfinite(y).all())
    assert metrics.relative_l2(y, ref) <= metrics.matmul_error_bound(torch.float16, 768)


@pytest.mark.parametrize("skip", [1, 4])
def test_int4_gemv_takes_an_x_that_is_not_16_byte_aligned(skip):
    """The f16x2 path reads x 16 bytes at a time; a view 2 or 8 bytes past alignment must still work."""
    torch.manual_seed(2)
    w = torch.randn(256, 32)
    qw, qz, s = (t.to(DEVICE) for t in kernels.pack_gptq_int4(w, 128))
    x = torch.randn(1, 256 + skip).half().to(DEVICE)[:, skip:]     # contiguous, but off alignment
    assert x.is_contiguous() and x.data_ptr() % 16 == 2 * skip
    ref = x.double() @ kernels.dequant_gptq_int4(qw, qz, s, 128).double()
    y = kernels.int4_gemv(x, qw, qz, s, 128, block_n=32, split_k=2)
    assert metrics.relative_l2(y, ref) <= metrics.matmul_error_bound(torch.float16, 256)


def test_int4_gemv_has_a_fix_up_counter_for_every_column_block():
    """N = 33024 at block_n = 32 makes 1032 column blocks, past the 1024 counters made by default."""
    torch.manual_seed(3)
    qw, qz, s = (t.to(DEVICE) for t in kernels.pack_gptq_int4(torch.randn(128, 33024) * 0.02, 128))
    qw, qz, s = qw.repeat(2, 1), qz.repeat(2, 1), s.repeat(2, 1)             # K = 256: two groups
    x = torch.randn(1, 256).half().to(DEVICE)
    ref = x.double() @ kernels.dequant_gptq_int4(qw, qz, s, 128).double()
    y = kernels.int4_gemv(x, qw, qz, s, 128, block_n=32, split_k=2)
    work, counters = fixup_state(x, qw, qz, s, block_n=32, split_k=2)
    assert counters.numel() == 1032 and work.numel() == 2 * 33024
    assert int((counters & 0xFFFF).abs().sum()) == 0
    assert metrics.relative_l2(y, ref) <= metrics.matmul_error_bound(torch.float16, 256)


def test_int4_gemv_whose_fix_up_state_is_broken_still_answers_right():
    """A counter left wrong (as two streams sharing the state could leave it) makes the first program
    that arrives believe it is the last, and wait for the others' partials. On a GPU they arrive while it
    waits. Run one program after another (the interpreter) they come only after it has finished: it
    gives up after a bounded number of reads and computes its column block alone, exactly. Either way
    the answer is right and nothing hangs; made anew, the state serves as before."""
    torch.manual_seed(5)
    qw, qz, s = (t.to(DEVICE) for t in kernels.pack_gptq_int4(torch.randn(512, 32) * 0.02, 128))
    x = torch.randn(1, 512).half().to(DEVICE)
    ref = x.double() @ kernels.dequant_gptq_int4(qw, qz, s, 128).double()
    good = kernels.int4_gemv(x, qw, qz, s, 128, block_n=32, split_k=4, num_warps=1)
    work, counters = fixup_state(x, qw, qz, s, block_n=32, split_k=4, num_warps=1)
    counters += 3                                           # three arrivals that never happened
    for _ in range(2):
        y = kernels.int4_gemv(x, qw, qz, s, 128, block_n=32, split_k=4, num_warps=1)
        assert metrics.relative_l2(y, ref) <= metrics.matmul_error_bound(torch.float16, 512)
    work.fill_(1)                                           # the state made anew (as gemv_plan.gemv_state makes it)
    counters.zero_()
    x2 = torch.randn(1, 512).half().to(DEVICE)
    ref2 = x2.double() @ kernels.dequant_gptq_int4(qw, qz, s, 128).double()
    y2 = kernels.int4_gemv(x2, qw, qz, s, 128, block_n=32, split_k=4, num_warps=1)
    assert metrics.relative_l2(y2, ref2) <= metrics.matmul_error_bound(torch.float16, 512)
    assert torch.equal(kernels.int4_gemv(x, qw, qz, s, 128, block_n=32, split_k=4, num_warps=1), good)
    assert int((counters & 0xFFFF).abs().sum()) == 0


def test_int4_gemv_tiles_that_take_turns_keep_their_own_fix_up_state():
    """Each tile and split has its own workspace and counters: a slot is then at most one call stale,
    which the fix-up's one parity bit needs. Alternating two splits of one shape, each stays right and
    keeps its bits (on a GPU, where programs really overlap, a shared slot two calls stale would be
    taken for this call's)."""
    torch.manual_seed(4)
    qw, qz, s = (t.to(DEVICE) for t in kernels.pack_gptq_int4(torch.randn(1024, 64) * 0.02, 128))
    x = torch.randn(1, 1024).half().to(DEVICE)
    ref = x.double() @ kernels.dequant_gptq_int4(qw, qz, s, 128).double()
    first = {k: kernels.int4_gemv(x, qw, qz, s, 128, block_n=32, split_k=k) for k in (3, 4)}
    for _ in range(3):
        for k in (4, 3, 3):
            y = kernels.int4_gemv(x, qw, qz, s, 128, block_n=32, split_k=k)
            assert torch.equal(y, first[k])
            assert metrics.relative_l2(y, ref) <= metrics.matmul_error_bound(torch.float16, 1024)
    # a new x: no output may be left over from the calls before (y is a fresh torch.empty each call)
    x2 = torch.randn(1, 1024).half().to(DEVICE)
    ref2 = x2.double() @ kernels.dequant_gptq_int4(qw, qz, s, 128).double()
    for k, warps in ((3, 1), (4, 4), (3, 4)):
        y = kernels.int4_gemv(x2, qw, qz, s, 128, block_n=32, split_k=k, num_warps=warps)
        assert metrics.relative_l2(y, ref2) <= metrics.matmul_error_bound(torch.float16, 1024)
    w3 = fixup_state(x, qw, qz, s, block_n=32, split_k=3)[0]
    w4 = fixup_state(x, qw, qz, s, block_n=32, split_k=4)[0]
    assert w3.numel() == 2 * 3 * 32 and w4.numel() == 2 * 4 * 32 and w3.data_ptr() != w4.data_ptr()


def test_stream_read_reads_every_word():
    """The read floor's kernel: its xor per block of words equals numpy's, ragged last block included,
    for int32 codes and for fp16 data (viewed as words); odd byte counts get a clear error."""
    import numpy as np
    torch.manual_seed(6)
    q = torch.randint(-2**31, 2**31 - 1, (10_000,), dtype=torch.int32)      # 2 x 4096 + 1808
    out = kernels.stream_read(q.to(DEVICE), block=4096)
    ref = [int(np.bitwise_xor.reduce(c.numpy())) for c in q.split(4096)]
    assert out.cpu().tolist() == ref
    h = torch.randn(64, 33).half()                                          # 2112 halves = 1056 words
    words = h.reshape(-1).view(torch.int32)
    assert kernels.stream_read(h.to(DEVICE), block=512).cpu().tolist() == [
        int(np.bitwise_xor.reduce(c.numpy())) for c in words.split(512)]
    with pytest.raises(ValueError, match="multiple of 4 bytes"):
        kernels.stream_read(torch.zeros(3, dtype=torch.float16, device=DEVICE))


def test_int4_gemv_plans_once_per_shape_and_a_reset_forgets_the_plans():
    """The first call with a (device, dtypes, shapes, options) plans it; later calls take the plan from
    kernels.cache (no checks redone, no state made, no device queried); another shape or option plans
    anew; kernels.cache.reset() forgets every plan and state, and the next call makes them again."""
    torch.manual_seed(7)
    qw, qz, s = (t.to(DEVICE) for t in kernels.pack_gptq_int4(torch.randn(256, 64) * 0.02, 128))
    x = torch.randn(1, 256).half().to(DEVICE)
    kernels.cache.reset()
    assert kernels.cache.plans_made == 0 and not kernels.cache.gemv_states
    y = kernels.int4_gemv(x, qw, qz, s, 128, block_n=32, split_k=2)
    plan = kernels.int4_gemv_plan(x, qw, qz, s, 128, block_n=32, split_k=2)
    assert kernels.cache.plans_made == 1 and plan.calls == 1 and plan.tile["split_k"] == 2
    states = dict(kernels.cache.gemv_states)
    for _ in range(3):
        assert torch.equal(kernels.int4_gemv(torch.randn(1, 256).half().to(DEVICE) * 0 + x, qw, qz, s, 128,
                                             block_n=32, split_k=2), y)
    assert kernels.cache.plans_made == 1 and plan.calls == 4 and kernels.cache.gemv_states == states
    kernels.int4_gemv(x, qw, qz, s, 128, block_n=32, split_k=1)         # another option: another plan
    assert kernels.cache.plans_made == 2
    kernels.cache.reset()
    assert kernels.cache.plans_made == 0 and not kernels.cache.gemv_plans and not kernels.cache.gemv_states
    assert torch.equal(kernels.int4_gemv(x, qw, qz, s, 128, block_n=32, split_k=2), y)
    again = kernels.int4_gemv_plan(x, qw, qz, s, 128, block_n=32, split_k=2)
    assert again is not plan and kernels.cache.plans_made == 1


def test_int4_gemv_bad_input_is_refused_on_every_call_not_cached():
    """A refused call leaves no plan behind: the same bad input is refused again, with the same message."""
    qw, qz, s = (t.to(DEVICE) for t in kernels.pack_gptq_int4(torch.randn(256, 64) * 0.02, 128))
    kernels.cache.reset()
    for _ in range(2):
        with pytest.raises(ValueError, match="x has K=128 but qweight packs K=256"):
            kernels.int4_gemv(torch.randn(1, 128).half().to(DEVICE), qw, qz, s, 128, block_n=32)
    assert kernels.cache.plans_made == 0 and not kernels.cache.gemv_plans


def test_int4_gemv_plan_hit_costs_microseconds_on_the_host():
    """The host's side of a call with a plan: the lookup that int4_gemv does before launching. Timed on
    the CPU (the launches are the GPU's): well under the 30 us an eager call may cost in all, and far
    below a miss, which checks, plans and allocates the fix-up's state."""
    import time
    qw, qz, s = (t.to(DEVICE) for t in kernels.pack_gptq_int4(torch.randn(1024, 256) * 0.02, 128))
    x = torch.randn(1, 1024).half().to(DEVICE)

    def per_call(fn, n):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n
    kernels.cache.reset()
    kernels.int4_gemv_plan(x, qw, qz, s, 128, block_n=32, split_k=4)
    hit = min(per_call(lambda: kernels.int4_gemv_plan(x, qw, qz, s, 128, block_n=32, split_k=4), 2000)
              for _ in range(3))

    def miss():
        kernels.cache.reset()
        kernels.int4_gemv_plan(x, qw, qz, s, 128, block_n=32, split_k=4)
    cold = min(per_call(miss, 200) for _ in range(3))
    assert hit < 10e-6 and hit * 3 < cold, (hit, cold)


def test_direct_launch_calls_the_launcher_as_tritons_wrapper_does(monkeypatch):
    import inspect
    from types import SimpleNamespace

    import triton
    from triton.backends.nvidia.driver import CudaLauncher

    from utils.kernels.gemv import direct_launch
    calls = []

    class Launcher:                   # the installed Triton's launcher layout, recording its calls
        def __call__(self, gridX, gridY, gridZ, stream, function, kernel_metadata, launch_metadata,
                     launch_enter_hook, launch_exit_hook, *args):
            calls.append((gridX, gridY, gridZ, stream, function, kernel_metadata, launch_metadata,
                          launch_enter_hook, launch_exit_hook, args))

    class Launcher36:                 # Triton 3.6's: the metadata, the hooks and the arguments in *args
        def __call__(self, gridX, gridY, gridZ, stream, function, *args):
            calls.append((gridX, gridY, gridZ, stream, function, args))

    layouts = [list(inspect.signature(k.__call__).parameters) for k in (Launcher, Launcher36)]
    assert list(inspect.signature(CudaLauncher.__call__).parameters) in layouts     # the installed Triton's
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 3, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda d: 100 + d, raising=False)
    compiled = SimpleNamespace(run=Launcher(), function=7, packed_metadata=(1, 2))
    direct_launch(compiled, (5, 2))("x", 1)
    assert calls == [(5, 2, 1, 103, 7, (1, 2), None, None, None, ("x", 1))]   # the current device's stream
    # Triton 3.6's layout is called the same way
    calls.clear()
    direct_launch(SimpleNamespace(run=Launcher36(), function=7, packed_metadata=(1, 2)), (5,))("x")
    assert calls == [(5, 1, 1, 103, 7, ((1, 2), None, None, None, "x"))]
    # a launcher laid out otherwise, or a profiler's launch hook set: None, and Triton's own wrapper serves
    assert direct_launch(SimpleNamespace(run=lambda *a: None, function=7, packed_metadata=(1,)), (1,)) is None
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", lambda *a: None)
    assert direct_launch(compiled, (5, 2)) is None

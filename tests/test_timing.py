"""utils.timing: the course's one timer, on the CPU (the CUDA paths run in scripts/bench_kernels.py)."""
import pytest
import torch

from utils import ceilings, roofline, timing


def test_the_other_modules_time_with_this_one():
    assert roofline.time_kernel is timing.time_kernel and roofline.time_cold is timing.time_cold
    assert roofline.operand_copies is timing.operand_copies and ceilings.time_op is timing.time_op


def test_time_op_warms_up_then_times_each_repeat():
    calls = []
    times = timing.time_op(lambda: calls.append(1), "cpu", warmup=2, repeats=4)
    assert len(times) == 4 and all(t > 0 for t in times) and len(calls) == 2 + 4


def test_operand_copies_reach_the_byte_target_with_separate_storage():
    w, x = torch.arange(1000, dtype=torch.float32), torch.ones(10)
    sets = timing.operand_copies((x, w, 128), at_least_bytes=3 * 4040 + 1)     # 4040 bytes per set
    assert len(sets) == 4 and sets[0][0] is x and all(s[2] == 128 for s in sets)
    assert all(torch.equal(s[1], w) for s in sets)
    assert len({s[1].data_ptr() for s in sets}) == 4                              # four storages, not views
    assert len(timing.operand_copies((x,), 1)) == 2                             # at least one copy to rotate to
    calls = []
    assert timing.time_cold(lambda a, b: calls.append((a, b)), (x, w), "cpu", repeats=3) > 0
    assert len(calls) == 5 and all(c[1] is w for c in calls)                      # CPU: no copies, no L2 to beat


def test_time_kernel_on_cpu_is_a_positive_median():
    calls = []
    t = timing.time_kernel(lambda: calls.append(1), "cpu", repeats=3)
    assert t > 0 and len(calls) == 2 + 3                      # warm-up runs, then the timed repeats


def test_time_eager_is_per_call_over_a_loop_of_calls():
    """A callable that sleeps 2 ms: time_eager reports ~2 ms per call (not per loop), after its warm-up."""
    import time
    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.002)
    t = timing.time_eager(slow, "cpu", calls=5, repeats=3, warmup=2)
    assert len(calls) == 2 + 5 * 3
    assert 0.0019 < t < 0.02
    with pytest.raises(ValueError, match="calls and repeats"):
        timing.time_eager(slow, "cpu", calls=0)


def test_time_interleaved_times_each_callable_in_every_round():
    order, lines = [], []
    got = timing.time_interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, "cpu",
                                  repeats=2, log=lines.append)
    assert set(got) == {"a", "b"} and all(v > 0 for v in got.values())
    assert len(lines) == 2 and lines[0].startswith("  round 0: a ")
    # each time_kernel on a CPU calls its callable 2 + 10 times; rounds alternate a, b, a, b
    assert order == ["a"] * 12 + ["b"] * 12 + ["a"] * 12 + ["b"] * 12


def test_time_repeated_is_the_median_of_the_timer():
    values = iter([3.0, 1.0, 2.0])
    assert timing.time_repeated(lambda: next(values), repeats=3) == 2.0

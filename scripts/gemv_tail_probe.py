"""Int4 GEMV, round 22 (issue 8; a bench, not a test): how much of the shipped GEMV's time is its
split-K fix-up? At 18944 -> 3584 the shipped kernel took 13.3 us with one copy of the weights replayed
(partly in L2) and 13.2 us cold (bench.md of 2026-11-24): it is not waiting on DRAM there. The fix-up
is three dependent L2 round trips at the end of each column block (store the partial and fence, the
arrival counter's atomic, the last program's loads of every partial), on the critical path of the
kernel's last programs. This probe runs the shipped group loop (utils.kernels._gemv_groups) at the
shipped grid and ends it these ways:

    shipped        utils.kernels.int4_gemv at the same fixed tile and split (the fix-up as shipped)
    store          partials stored, nothing else: not a GEMV (timing only), the floor for any fix-up
    store+count    partials stored and the arrival counter taken, no sum: timing only
    red.add        fp32 atomics into y, no counter: a GEMV (checked), but its sums' order, so its bits,
                   change from run to run, and y must be zeroed first (a memset the timing leaves out)
    red.add, drop-in  the same with what a caller of int4_gemv would need around it: y zeroed first
                   (torch.zeros) and cast to fp16 after, each its own kernel
    tagged         deterministic, one round trip at the end instead of three: each program takes its
                   arrival ticket at its START (one lane's relaxed atomic, its latency hidden under the
                   group loop), then publishes its partial with the lowest mantissa bit replaced by the
                   call's parity (gen & 1, from the ticket) and leaves; the program with the last ticket
                   polls all partials until every parity matches (one round trip when they are there),
                   sums them with that bit cleared (so the same bits every call), in a fixed order, and
                   bumps the generation. A partial loses its lowest mantissa bit (<= 1 ulp of fp32).
                   Needs its own workspace and counters per shape and tile (a slot may then only be stale
                   by one call), so the autotuner's shared ones would not do.
    tagged, ticket last  the same, but the ticket is taken after publishing (the call's generation read
                   by a plain load before the loop): the program that sums is the last to ARRIVE, so
                   its partners' partials are, most likely, already there when it reads them.
    shipped fix-up      utils.kernels' own ticket and _splitk_fixup_tagged, fp32 y, nothing after it
    shipped fix-up + fallback  the same with the shipped kernel's ending: the overflow check and the
                   exact fp32 redo of a column block (never taken here), before the store
    shipped fix-up, 64 registers  "shipped fix-up" held to the 64 registers the fallback's kernel took
                   until round 26
    shipped fix-up + unrolled fallback  the ending with the exact redo as it was until round 26 (8 weights
                   of a packed row unrolled per step); "+ fallback" has utils.kernels' own (one weight per step)
    shipped fix-up + flat fallback  the redo as one loop over every weight, each dequantized alone
    shipped fix-up + overflow check only  the check, and an overflow only counted: not a safe GEMV (timing)
    shipped fix-up + fallback, a call  the flat redo as a function of its own (a PTX call, not inlined)
    shipped fix-up + fallback, opaque columns  the flat redo with its column indices passed through an
                   inline-asm mov, so the compiler cannot share their address arithmetic with the group loop

Every ending that computes a GEMV is checked against the fp32 reference, and run 20 times to count the
output bits that change between runs, before anything is timed.

    python scripts/gemv_tail_probe.py      # GPU; table $OUT/gemv_tail_probe.md

Round 25 (gemv_tail_probe_round25.md, H200, the loop with its scales loaded a group ahead): store 10.6 /
10.5 us (split 6 / 33), store+count 11.9 / 11.9, the fenced fix-up then shipped 12.3 / 12.5, tagged 11.4
at split 6 (and 14.1 at split 33, where its [64, 32] read of the partials took 95 registers: a second
wave). Tagged then shipped (utils.kernels._splitk_fixup_tagged, each tile its own state, the partials of
a column block together), so since commit 72423e6 the "shipped" rows here are tagged too.

Then (gemv_tail_probe_ticketlast.md; splits 6 and 28 / 30 / 32, the partials now together here too): at
18944 -> 3584 "tagged, ticket last" took 11.8 us at splits 28 and 32 (70 % of copy, 3.27x), "tagged"
12.0 / 12.1, and the shipped kernel (tagged) 12.3 / 12.4; at 3584 -> 18944 11.6, 11.5 and 11.8. The
ticket taken last, put into utils.kernels the same way, did not carry over: 12.4 / 12.2 us at splits 28 /
32 in the benchmark's sweep (bench_ticketlast.md), so it was not kept. The shipped kernel trails this
probe's own tagged ending by 0.3 us at every split.

Where those 0.3 us are (gemv_tail_probe_regs.md): utils.kernels' own fix-up with nothing after it took
11.4 / 11.8 us (split 6 / 28; 74 % / 71 % of copy), and with the shipped kernel's ending added (the
overflow check and the exact redo of a column block, never taken here) 12.2 / 12.7. Compiled for sm_90 the
first takes 72 registers, the second 64; held to 64 the first took 12.3 / 13.1 us. But the shipped
kernel given 72 (maxnreg) was no faster (bench_maxnreg72.md: 12.1 / 12.5-12.9 us), so the register
count is not the whole cause, and the change was not kept.

Round 26 (gemv_tail_probe_round26*.md, two runs): what made the kernel 64 registers was the redo's
unrolled inner loop. Compiled for sm_90, a redo without it (one weight per step) takes 72 at splits 6, 28
and 32, and the group loop's PTX is the same as with no ending at all. (maxnreg=72 had given the unrolled
kernel 72 registers too, and it was no faster: the unrolled code changed more than the count.)
Measured (split 6 / 28 / 32):
- unrolled redo: 12.1 / 12.6-12.7 / 12.5 us; one weight per step: 11.5-11.6 / 12.1 / 12.1 us.
- the shipped kernel with it: 11.6-11.7 / 12.2 / 12.2 us.
- the fix-up with nothing after it: 11.3 / 11.8 / 11.8-11.9 us.
- the overflow check alone: 11.5 / 11.8 / 12.0 us.
- the flat redo: 11.6 / 12.1 / 14.0 us (80 registers at split 32, a second wave).
- the redo as a call: 11.7 / 12.1 / 12.2 us; with opaque columns: 11.5 / 12.0 / 12.1 us.
One weight per step now ships (utils.kernels._gemv_exact). The redo still costs 0.2-0.3 us: ptxas
schedules the same group loop a little differently when it is there (the SASS differs, the PTX does not).

Then the fix-up moved out of the GEMV kernel (modes "store, sum kernel..."): the GEMV stores its
partials [split, N] and a second kernel (utils.kernels._gemv_sum_kernel; until it shipped, a copy of it
here) sums them in a fixed order and holds the exact redo. Measured (gemv_tail_probe_round26_sumkernel.md,
_pdl.md, _pdl_cols.md; splits 6 / 28 / 32):
- launched plainly after the GEMV: 12.1-12.2 / 12.2 / 12.1 us (the launch gap eats the gain).
- launched with PDL, the GEMV letting it launch at its start (griddepcontrol.launch_dependents), so its
  programs are resident and wait (griddepcontrol.wait) while the GEMV runs: 11.8 / 11.7-11.8 / 11.5 us.
  At 18944 -> 3584 split 32 that is 73-75 % of copy, with the redo. One sum program per 32 columns beat
  64 and 128.
- with PDL but no launch_dependents (the sum kernel launched when the GEMV's programs exit): 12.3-12.4 /
  12.5 / 12.3 us.
(In _sumkernel.md the PDL mode with launch_dependents was wrong and dropped by the check: its mode number
also sent it down the tagged fix-up's path, so the sum kernel read a workspace of another layout. Fixed
for _pdl.md.) utils.kernels ships it for splits of 16 and more on sm_90+ (_GEMV_SUM_MIN_SPLIT).
"""
from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.language.extra.cuda import gdc_launch_dependents  # noqa: E402

from gemv_probe import fixup_locks, gpu_copy_gbps, shape_case, time_ops, write_table  # noqa: E402
from utils import kernels, metrics  # noqa: E402

MODES = {"store": 0, "store+count": 1, "red.add": 2, "tagged": 3, "tagged, ticket last": 4, "shipped fix-up": 5,
         "shipped fix-up + fallback": 6, "shipped fix-up, 64 registers": 5, "shipped fix-up + unrolled fallback": 7,
         "shipped fix-up + flat fallback": 8, "shipped fix-up + overflow check only": 9,
         "shipped fix-up + fallback, a call": 10, "shipped fix-up + fallback, 80 registers": 6,
         "shipped fix-up, 80 registers": 5, "store, sum kernel": 0, "store, sum kernel, PDL": -1,
         "store, sum kernel, PDL untriggered": 0, "store, sum kernel, PDL, 64 columns": -1,
         "store, sum kernel, PDL, 128 columns": -1,
         "shipped fix-up + fallback, opaque columns": 11}
# compiled for sm_90 the unrolled fallback's kernel took 64, the others 72; 80 fits 25 one-warp programs per SM
# (3300 on 132 SMs: one wave at split 28, 3136 programs, not at 32)
MAXNREG = {"shipped fix-up, 64 registers": 64, "shipped fix-up + fallback, 80 registers": 80,
           "shipped fix-up, 80 registers": 80}
# (K, N): the shipped grid's 32-column one-warp tile at the autotuner's split (round 25: at 18944 -> 3584 28 and
# 32, the fastest of the sweep with the tagged fix-up, and 30; 33's [64, 32] read of the partials takes a
# second wave in this probe's tagged modes)
CASES = {(3584, 18944): (6,), (18944, 3584): (28, 32)}
if "--splits" in sys.argv:          # e.g. --splits "5,6;30,32": the splits of each case, in CASES' order
    CASES = {k: tuple(int(v) for v in part.split(",")) for k, part in zip(CASES, sys.argv[sys.argv.index("--splits") + 1].split(";"))}


@triton.jit
def _gemv_exact_unrolled(x_ptr, qw_ptr, qz_ptr, s_ptr, rn, nmask, N, ng, GROUP: tl.constexpr, BLOCK_N: tl.constexpr):
    """utils.kernels._gemv_exact until round 26: one packed row per step, its 8 weights unrolled."""
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for g in range(0, ng):
        zp = tl.load(qz_ptr + g * (N // 8) + rn // 8, mask=nmask, other=0)
        z = (((zp >> ((rn % 8) * 4)) & 0xF) + 1).to(tl.float32)
        part = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for r in range(0, GROUP // 8):
            q = tl.load(qw_ptr + (g * (GROUP // 8) + r) * N + rn, mask=nmask, other=0)
            for j in tl.static_range(8):
                xk = tl.load(x_ptr + g * GROUP + r * 8 + j).to(tl.float32)
                part += (((q >> (4 * j)) & 0xF).to(tl.float32) - z) * xk
        acc += part * tl.load(s_ptr + g * N + rn, mask=nmask, other=0.0).to(tl.float32)
    return acc


@triton.jit
def _gemv_exact_flat(x_ptr, qw_ptr, qz_ptr, s_ptr, rn, nmask, N, K, GROUP: tl.constexpr, BLOCK_N: tl.constexpr):
    """One loop over every weight of the column, each dequantized on its own ((q - z) * s, as
    dequant_gptq_int4 does) before its product with x."""
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k in range(0, K):
        g = k // GROUP
        q = tl.load(qw_ptr + (k // 8) * N + rn, mask=nmask, other=0)
        zp = tl.load(qz_ptr + g * (N // 8) + rn // 8, mask=nmask, other=0)
        s = tl.load(s_ptr + g * N + rn, mask=nmask, other=0.0).to(tl.float32)
        w = (((q >> (4 * (k % 8))) & 0xF) - (((zp >> ((rn % 8) * 4)) & 0xF) + 1)).to(tl.float32) * s
        acc += w * tl.load(x_ptr + k).to(tl.float32)
    return acc


@triton.jit(noinline=True)
def _gemv_exact_call(x_ptr, qw_ptr, qz_ptr, s_ptr, y_ptr, pid_n, N, K, BLOCK_N: tl.constexpr):
    """_gemv_exact_flat as a function of its own (a PTX call, not inlined: scalars in, y stored here)."""
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    y = _gemv_exact_flat(x_ptr, qw_ptr, qz_ptr, s_ptr, rn, nmask, N, K, 128, BLOCK_N)
    tl.store(y_ptr + rn, y, mask=nmask)


@triton.jit
def _tail_probe_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, y_ptr, part_ptr, lock_ptr, K, N,
                       BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, MODE: tl.constexpr,
                       SPLIT_P2: tl.constexpr, POLL_ROWS: tl.constexpr):
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    lane0 = rn == pid_n * BLOCK_N
    if MODE == -1:                               # the sum kernel, launched with PDL, may launch now
        gdc_launch_dependents()
    if MODE == 3:                                # the ticket, before the loop: its round trip overlaps it
        ticket = tl.atomic_add(lock_ptr + pid_n + rn * 0, tl.where(lane0, 1, 0), mask=lane0, sem="relaxed")
    if MODE == 4:                                # only the call's generation, read (a plain load) before the loop
        gen = tl.load(lock_ptr + pid_n + rn * 0, mask=lane0, other=0, volatile=True)
    if MODE >= 5:
        ticket, t0 = kernels._gemv_ticket(lock_ptr + pid_n, 32)
    y = kernels._gemv_groups(x_ptr, qw_ptr, qz_ptr, s_ptr, rn, nmask, N, pid_k, K // 128, SPLIT_K, 128, BLOCK_N,
                             True, 1, True, N)
    if MODE >= 5:
        y, last, late = kernels._splitk_fixup_tagged(y, ticket, t0, part_ptr, lock_ptr + pid_n, pid_n, pid_k, nmask,
                                                     SPLIT_K, POLL_ROWS, 4096)
        if last:
            if MODE == 6:
                late += tl.sum(((y - y) != 0).to(tl.int32), axis=0)
                if late > 0:
                    y = kernels._gemv_exact(x_ptr, qw_ptr, qz_ptr, s_ptr, rn, nmask, N, K // 128, 128, BLOCK_N)
            if MODE == 8:
                late += tl.sum(((y - y) != 0).to(tl.int32), axis=0)
                if late > 0:
                    y = _gemv_exact_flat(x_ptr, qw_ptr, qz_ptr, s_ptr, rn, nmask, N, K, 128, BLOCK_N)
            if MODE == 10:
                late += tl.sum(((y - y) != 0).to(tl.int32), axis=0)
                if late > 0:
                    _gemv_exact_call(x_ptr, qw_ptr, qz_ptr, s_ptr, y_ptr, pid_n, N, K, BLOCK_N)
                else:
                    tl.store(y_ptr + rn, y, mask=nmask)
            if MODE == 11:
                late += tl.sum(((y - y) != 0).to(tl.int32), axis=0)
                if late > 0:
                    rn_o = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [rn], dtype=tl.int32, is_pure=False,
                                                     pack=1)
                    y = _gemv_exact_flat(x_ptr, qw_ptr, qz_ptr, s_ptr, rn_o, rn_o < N, N, K, 128, BLOCK_N)
            if MODE == 9:      # not a safe GEMV: an overflow is only counted (timing only)
                late += tl.sum(((y - y) != 0).to(tl.int32), axis=0)
                if late > 0:
                    tl.atomic_add(lock_ptr + pid_n, 1 << 24, sem="relaxed")
            if MODE == 7:
                late += tl.sum(((y - y) != 0).to(tl.int32), axis=0)
                if late > 0:
                    y = _gemv_exact_unrolled(x_ptr, qw_ptr, qz_ptr, s_ptr, rn, nmask, N, K // 128, 128, BLOCK_N)
            if MODE != 10:
                tl.store(y_ptr + rn, y, mask=nmask)
    elif MODE >= 3:
        if MODE == 3:
            old = tl.sum(tl.where(lane0, ticket, 0), axis=0)      # lane 0's ticket, to every lane (shuffles)
            par = (old >> 16) & 1
        else:
            par = (tl.sum(tl.where(lane0, gen, 0), axis=0) >> 16) & 1
        tagged = (y.to(tl.int32, bitcast=True) & -2) | par
        cols = tl.arange(0, BLOCK_N)             # a column block's partials together, as in utils.kernels
        words = part_ptr.to(tl.pointer_type(tl.int32)) + pid_n * (SPLIT_K * BLOCK_N)
        tl.atomic_xchg(words + pid_k * BLOCK_N + cols, tagged, mask=nmask, sem="relaxed")
        if MODE == 4:                            # the ticket after publishing: the last to arrive sums
            ticket = tl.atomic_add(lock_ptr + pid_n + rn * 0, tl.where(lane0, 1, 0), mask=lane0, sem="relaxed")
            old = tl.sum(tl.where(lane0, ticket, 0), axis=0)
        if (old & 0xFFFF) == SPLIT_K - 1:
            rk = tl.arange(0, SPLIT_P2)
            ptrs = words + rk[:, None] * BLOCK_N + cols[None, :]
            kmask = (rk < SPLIT_K)[:, None] & nmask[None, :]
            v = tl.load(ptrs, mask=kmask, other=0, volatile=True)
            while tl.sum(tl.sum((((v & 1) != par) & kmask).to(tl.int32), axis=1), axis=0) > 0:
                v = tl.load(ptrs, mask=kmask, other=0, volatile=True)
            y = tl.sum(tl.where(kmask, (v & -2).to(tl.float32, bitcast=True), 0.0), axis=0)   # parity bit off
            tl.store(y_ptr + rn, y, mask=nmask)
            tl.atomic_add(lock_ptr + pid_n, (1 << 16) - SPLIT_K, sem="relaxed")   # next generation, count 0
    elif MODE == 2:
        tl.atomic_add(y_ptr + rn, y, mask=nmask, sem="relaxed")
    else:
        tl.store(part_ptr + pid_k * N + rn, y, mask=nmask)
        if MODE == 1:
            tl.debug_barrier()
            arrived = tl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel")
            if arrived == SPLIT_K - 1:
                tl.atomic_xchg(lock_ptr + pid_n, 0)


def tail_probe(x, qw, qz, s, split_k: int, mode: str, y32=None):
    """One launch at 32 columns, one warp; y32 (fp32 [N]) receives red.add's sums when given."""
    K, N = qw.shape[0] * 8, qw.shape[1]
    nb = triton.cdiv(N, 32)
    y = y32 if y32 is not None else torch.empty(N, device=x.device, dtype=torch.float32)
    if mode.startswith(("tagged", "shipped fix-up")):   # each mode its own state, made as int4_gemv makes it
        work, locks = kernels._gemv_state(x.device, ("tail probe", mode, N, split_k),
                                          lambda: kernels._gemv_state_words(32, split_k, N))
        part = work.view(torch.float32)
    else:
        part = torch.empty((split_k, N), device=x.device, dtype=torch.float32)
        locks = fixup_locks(x.device, nb)
    _tail_probe_kernel[(nb, split_k)](x, qw, qz, s, y, part, locks, K, N, BLOCK_N=32, SPLIT_K=split_k,
                                      MODE=MODES[mode], SPLIT_P2=triton.next_power_of_2(split_k),
                                      POLL_ROWS=kernels._gemv_fixup_args(32, 1, split_k, N)["POLL_ROWS"],
                                      num_warps=1, num_stages=1,
                                      **({"maxnreg": MAXNREG[mode]} if mode in MAXNREG else {}))
    if mode.startswith("store, sum kernel"):
        y16 = torch.empty(N, device=x.device, dtype=torch.float16)
        cols = 128 if mode.endswith("128 columns") else 64 if mode.endswith("64 columns") else 32
        kernels._gemv_sum_kernel[(triton.cdiv(N, cols),)](part, y16, x, qw, qz, s, K, N, GROUP=128, SPLIT_K=split_k,
                                                          SPLIT_P2=triton.next_power_of_2(split_k), BLOCK=cols,
                                                          PDL="PDL" in mode, num_warps=cols // 32, num_stages=1,
                                                          launch_pdl="PDL" in mode)
        return y16
    return y


def checked_repeats(call, ref, K: int, runs: int = 20):
    """(relative L2 of call()'s output against ref, how many outputs per run change bits from the first
    run's); stops the probe if the output is wrong, so no wrong kernel is timed."""
    outs = [call().clone().reshape(1, -1) for _ in range(runs)]
    err = metrics.relative_l2(outs[0], ref)
    if not err <= metrics.matmul_error_bound(torch.float16, K):
        raise SystemExit(f"relative L2 {err:.3g} above the bound: not timing a wrong kernel")
    return err, sum(int((o != outs[0]).sum()) for o in outs[1:]) / (runs - 1)


def shipped_gemv(split_k: int) -> tuple:
    """(row name, fn(x, qw, qz, s)): utils.kernels.int4_gemv at the shipped tile (32 columns, one warp, one
    stage) and a fixed split, the row every probe times its variants against in the same run."""
    return (f"shipped (32 columns, 1 warp, split {split_k})",
            lambda *o: kernels.int4_gemv(*o, 128, block_n=32, split_k=split_k, num_warps=1, num_stages=1))


def probe_shapes(cases: dict):
    """For each (K, N) of cases: (K, N, cases[K, N], operands (x, qw, qz, s), the fp32 reference output,
    the bytes a GEMV moves, the bf16 baseline's seconds), made by gemv_probe.shape_case."""
    for (K, N), what in cases.items():
        ops, wd, qbytes, t_bf = shape_case(K, N, "cuda")
        yield K, N, what, ops, ops[0].float() @ wd, qbytes, t_bf


def keep_checked(fns: dict, ops, ref, K: int, N: int, note=lambda name: "") -> dict:
    """The fns (name -> fn(*ops)) whose outputs pass checked_repeats; one that is wrong or does not run is
    reported and dropped, so one failing config does not lose the others' rows. Prints a line per kept
    fn: its error, the outputs changing bits over 20 runs, and note(name)."""
    kept = {}
    for name, f in fns.items():
        try:
            err, changed = checked_repeats(lambda f=f: f(*ops), ref, K)
        except (SystemExit, Exception) as exc:  # noqa: BLE001 - reported, and the probe goes on
            print(f"{K}->{N} {name}: dropped ({type(exc).__name__}: {str(exc)[:300]})", flush=True)
            continue
        print(f"{K}->{N} {name}: relative L2 {err:.2e}, {changed:.0f} outputs change bits per run (20 runs)"
              f"{note(name)}", flush=True)
        kept[name] = f
    return kept


def probe_start(script: str, why: str) -> tuple[Path, float]:
    """(folder for the probe's table, the device's copy GB/s); without a GPU, stops with where to run it."""
    if not torch.cuda.is_available() or kernels.interpreted():
        raise SystemExit(f"{script} times compiled kernels on an NVIDIA GPU ({why}): run it on the device, e.g. "
                         f"run(kind='nvidia-h200', command='python3 scripts/{script}.py')")
    return Path(os.environ.get("OUT", "/tmp")), gpu_copy_gbps()


def timed_rows(fns: dict, ops, K: int, N: int, qbytes: int, t_bf: float, label: str = "") -> list:
    """write_table's rows for fns (name -> fn(*ops)): each timed cold three times, interleaved so that
    drift hits every variant alike; the median is kept, the range printed."""
    times = {k: [] for k in fns}
    for _ in range(3):
        for k, f in fns.items():
            times[k].append(time_ops(f, ops))
    rows = []
    for k, v in times.items():
        rows.append((K, N, f"{label}{k}", statistics.median(v), qbytes, t_bf))
        print(f"{K}->{N} {label}{k}: {rows[-1][3] * 1e6:.1f} us [{min(v) * 1e6:.1f}-{max(v) * 1e6:.1f}]", flush=True)
    return rows


def main():
    """python3 scripts/gemv_tail_probe.py [--only "NAME;NAME..."]: --only times the shipped kernel and the modes
    whose names are given (each checked first if it is a GEMV), not every mode."""
    only = sys.argv[sys.argv.index("--only") + 1].split(";") if "--only" in sys.argv else None
    if only and not set(only) <= set(MODES):
        raise SystemExit(f"--only takes mode names from: {', '.join(MODES)}")
    out, copy = probe_start("gemv_tail_probe", "its modes use PTX atomics and the f16x2 dequant")
    rows = []
    for (K, N), splits in CASES.items():
        ops, wd, qbytes, t_bf = shape_case(K, N, "cuda")
        x = ops[0]
        for sk in splits:
            fns = {"shipped": shipped_gemv(sk)[1]}
            fns.update({m: (lambda *o, sk=sk, m=m: tail_probe(*o, sk, m)) for m in (only or MODES)})   # red.add: y not zeroed
            zeroed = lambda *o, sk=sk: tail_probe(*o, sk, "red.add", y32=torch.zeros(N, device="cuda"))  # noqa: E731
            if not only:
                fns["red.add, drop-in"] = lambda *o, f=zeroed: f(*o).to(torch.float16)
            not_gemvs = ("store", "store+count", "red.add", "shipped fix-up + overflow check only")
            gemvs = {k: f for k, f in fns.items() if k not in not_gemvs}          # the GEMVs
            if not only:
                gemvs["red.add (its fp32 y)"] = zeroed                                      # a GEMV
            kept = keep_checked(gemvs, ops, x.float() @ wd, K, N, lambda k, sk=sk: f" (split {sk} {k})")
            fns = {k: f for k, f in fns.items() if k in kept or k not in gemvs}    # a wrong GEMV is not timed
            rows += timed_rows(fns, ops, K, N, qbytes, t_bf, f"split {sk}: ")
    print("\n".join(write_table(rows, copy, out / "gemv_tail_probe.md")))


if __name__ == "__main__":
    main()

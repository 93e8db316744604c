"""Lab 05's experiments on operators, one call each, returning rows for a table.

The lab reads like the other labs (a parameters cell, short cells calling `utils/`, narrative between);
what each experiment runs, and the references it compares against, lives here: our Triton GEMM against
torch and float64, fixed against derived tolerances, accumulator width as K grows, the grouped GEMM, integer
accumulators and int8 past the int32 range, FP8 scaling, the e4m3 cast, MX against torchao, and the Int8
weight-only round trips side by side. The formats' own definitions are in utils.numerics.
"""
from __future__ import annotations

import torch

from . import ceilings, kernels, metrics, numerics

# (case, dtype, tl.dot input_precision) of the precision GEMMs
GEMM_CASES = (("fp16", torch.float16, None), ("bf16", torch.bfloat16, None), ("fp32 ieee", torch.float32, "ieee"),
              ("fp32 tf32", torch.float32, "tf32"), ("fp32 tf32x3", torch.float32, "tf32x3"))
# inputs of the integer accumulators: (label, the value every input holds, its bits)
INT_INPUTS = (("int8 all 127", 127, 8), ("int8 all -128", -128, 8), ("int4 all 7", 7, 4))
FP8_FORMATS = (torch.float8_e4m3fn, torch.float8_e5m2)
# the ROCm failure of torchao's Int8 weight-only save/load test (pytorch/ao#2460), as reported there
ROCM_REPORTED_MAX_ABS = 5.7e-4


def _skip_reason(dt, prec) -> str | None:
    if kernels.interpreted() and dt == torch.bfloat16:
        return "skipped: the interpreter has no bfloat16"
    if torch.version.hip and prec in ("tf32", "tf32x3"):
        return "skipped: TF32 is an NVIDIA tensor-core mode"
    return None


def gemm_precision(A: torch.Tensor, B: torch.Tensor, dev) -> tuple[list[dict], dict]:
    """Section 1: A @ B in each GEMM_CASES case by our Triton GEMM and by torch.matmul, each against float64
    of the same rounded inputs. Returns the table's rows and {case: (ours, torch, fp64)} of those that ran."""
    rows, outs = [], {}
    for name, dt, prec in GEMM_CASES:
        skip = _skip_reason(dt, prec)
        if skip:
            rows.append({"case": name, "status": skip})
            continue
        a, b = A.to(dev, dt), B.to(dev, dt)
        ref = a.double().cpu() @ b.double().cpu()
        ours = kernels.matmul(a, b, input_precision=prec).cpu()
        with ceilings.fp32_matmul_mode("tf32" if prec == "tf32" else "ieee"):
            theirs = torch.matmul(a, b).cpu()
        outs[name] = (ours, theirs, ref)
        ignored = kernels.interpreted() and prec in ("tf32", "tf32x3")
        e_o, e_t = numerics.error_report(ours, ref), numerics.error_report(theirs, ref)
        rows.append({"case": name, "status": "ran as ieee: the interpreter ignores input_precision" if ignored else "ran",
                     **{f"ours {k}": v for k, v in e_o.items()}, **{f"torch {k}": v for k, v in e_t.items()},
                     "ours == torch bitwise": bool(torch.equal(ours, theirs)),
                     "ULPs ours vs torch (max)": int(numerics.ulp_distance(ours, theirs).max())})
    return rows, outs


def case_bound(case: str, k: int) -> float:
    """The relative-L2 bound of a GEMM_CASES case: tf32 alone has its own (hidden input rounding)."""
    dtype = "tf32" if case.split()[-1] == "tf32" else {"fp16": torch.float16, "bf16": torch.bfloat16}.get(case, torch.float32)
    return metrics.matmul_error_bound(dtype, k)


def plot_ulp_histogram(ours: torch.Tensor, theirs: torch.Tensor, title: str):
    """The ULP distances between two results, 8 and more in one bar; returns (figure, distances)."""
    import matplotlib.pyplot as plt
    import pandas as pd
    ulps = numerics.ulp_distance(ours, theirs).flatten()
    hist = pd.Series(ulps.clamp(max=8).numpy()).value_counts().sort_index()
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.bar([str(i) if i < 8 else ">=8" for i in hist.index], hist.values, color="#4477aa")
    ax.set_xlabel("ULP distance, our fp16 GEMM vs torch.matmul")
    ax.set_ylabel("elements (log scale)")
    ax.set_yscale("log")
    ax.set_title(title)
    return fig, ulps


def _passes(x, y, **tol) -> str:
    try:
        torch.testing.assert_close(x, y, **tol)
        return "pass"
    except AssertionError:
        return "FAIL"


def tolerance_verdicts(x: torch.Tensor, y: torch.Tensor, tol: dict, ref: torch.Tensor, bound: torch.Tensor) -> dict:
    """x against y under a fixed atol=1e-2 and under the derived tolerance `tol`, and x against float64
    `ref` within the elementwise `bound`."""
    return {"max ULPs": int(numerics.ulp_distance(x, y).max()), "atol=1e-2": _passes(x, y, atol=1e-2, rtol=0),
            "derived tolerance": _passes(x, y, **tol), "within bound of fp64": bool(((x.double() - ref).abs() <= bound).all())}


def tolerance_rows(ours: torch.Tensor, theirs: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor, tol: dict) -> dict:
    """{pair: verdicts} for torch against itself, against itself one ULP up, and ours against torch."""
    return {"torch vs itself": tolerance_verdicts(theirs, theirs, tol, ref, bound),
            "torch vs torch + 1 ULP": tolerance_verdicts(numerics.next_up(theirs), theirs, tol, ref, bound),
            "ours vs torch": tolerance_verdicts(ours, theirs, tol, ref, bound)}


def accumulation_sweep(k_sweep, dev, rows: int = 64) -> list[dict]:
    """Relative L2 against float64 of fp16 GEMMs at each K, fp16 and fp32 accumulators, emulated
    (numerics.chunked_matmul) and by our Triton kernel, for rand (all positive) and randn inputs."""
    out = []
    for dist in ("rand", "randn"):
        draw = torch.rand if dist == "rand" else torch.randn
        for k in k_sweep:
            g = torch.Generator().manual_seed(k)
            a, b = draw(rows, k, generator=g).half(), draw(k, rows, generator=g).half()
            ref = a.double() @ b.double()
            row = {"dist": dist, "K": k}
            for acc in (torch.float16, torch.float32):
                name = str(acc)[6:]
                row[f"emulated {name} acc"] = metrics.relative_l2(numerics.chunked_matmul(a, b, acc).half(), ref)
                row[f"Triton {name} acc"] = metrics.relative_l2(kernels.matmul(a.to(dev), b.to(dev), acc_dtype=acc).cpu(), ref)
            out.append(row)
    return out


def plot_accumulation(rows: list[dict]):
    """accumulation_sweep's rows: error against K, one panel per input distribution."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=True)
    for ax, dist in zip(axes, ("rand", "randn")):
        sub = [r for r in rows if r["dist"] == dist]
        for col, style in [("emulated float16 acc", "o-"), ("Triton float16 acc", "x--"),
                           ("emulated float32 acc", "s-"), ("Triton float32 acc", "+--")]:
            ax.plot([r["K"] for r in sub], [r[col] for r in sub], style, label=col)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("K")
        ax.set_title(f"fp16 inputs, {dist}")
    axes[0].set_ylabel("relative L2 error vs fp64")
    axes[1].legend(fontsize=7)
    return fig


def grouped_errors(groups: list[int], dev, gen: torch.Generator, k: int = 256, n: int = 128) -> tuple[dict, str | None]:
    """Every grouped GEMM that runs here (ours, the torch.matmul loop, torch._grouped_mm) against float64,
    on `groups` rows per group; and why torch._grouped_mm did not run, if it did not."""
    gdt, ga, gb, offs, ref = _grouped_inputs(groups, dev, gen, k, n)
    outs = {f"ours ({name})": kernels.grouped_matmul(ga, gb, offs, kernel=name).cpu()
            for name in kernels.grouped_kernels_here(ga, gb)}
    outs["torch.matmul loop"] = kernels.grouped_matmul_loop(ga, gb, groups).cpu()
    why_not = None
    try:
        outs["torch._grouped_mm"] = torch._grouped_mm(ga, gb.transpose(1, 2).contiguous().transpose(1, 2), offs=offs).cpu()
    except Exception as exc:  # noqa: BLE001 - shown in the lab, not hidden
        why_not = f"torch._grouped_mm does not run here: {type(exc).__name__}: {str(exc)[:100]}"
    bound = metrics.matmul_error_bound(gdt, k)
    return {name: {**numerics.error_report(v, ref), "bound (rel_l2)": bound} for name, v in outs.items()}, why_not


def _grouped_inputs(groups: list[int], dev, gen: torch.Generator, k: int, n: int):
    """(dtype, A, B, offsets, float64 reference) of a grouped GEMM with `groups` rows per group."""
    if not sum(groups):
        raise ValueError(f"groups={groups}: every group is empty, so there is no row to check (every error would "
                         "read 0); give at least one group with rows, e.g. groups = [48, 0, 80, 16]")
    gdt = torch.float32 if kernels.interpreted() else torch.bfloat16
    ga = torch.randn(sum(groups), k, generator=gen).to(dev, gdt)
    gb = torch.randn(len(groups), k, n, generator=gen).to(dev, gdt)
    ref = kernels.grouped_matmul_loop(ga.double().cpu(), gb.double().cpu(), groups)
    return gdt, ga, gb, kernels.group_offsets(groups, dev), ref


def int_accumulator_cases(ks=(2, 4, 64, 1024)) -> list[dict]:
    """K-long dot products of constant inputs (INT_INPUTS): exact, and in int16 / int32 accumulators that
    wrap or saturate."""
    rows = []
    for label, val, bits_in in INT_INPUTS:
        for k in ks:
            a, b = torch.full((1, k), val), torch.full((k,), val)
            row = {"inputs": label, "K": k, "exact": int((a.long() @ b.long()).item())}
            for bits in (16, 32):
                for mode in ("wrap", "saturate"):
                    row[f"int{bits} {mode}"] = int(numerics.int_dot(a, b, bits, mode, in_bits=bits_in).item())
            rows.append(row)
    return rows


def int8_overflow(kind: str, fill: int, k: int, dev) -> dict:
    """What an int8 GEMM ("torch._int_mm" or "Triton int8") returns when every input is `fill` and the
    exact sum passes the int32 range: exact, wrapped, saturated, other, or the error it raised."""
    a = torch.full((32, k), fill, dtype=torch.int8, device=dev)
    b = torch.full((k, 32), fill, dtype=torch.int8, device=dev)
    exact = fill * fill * k
    wrap, sat = int(numerics.wrap_int(torch.tensor([exact]), 32)), min(exact, 2**31 - 1)
    try:
        got = torch._int_mm(a, b) if kind == "torch._int_mm" else \
            kernels.int8_matmul(a, b, block_k=1024 if kernels.interpreted() else 128)
        v, uniform = int(got[0, 0]), bool((got == got[0, 0]).all())
        what = "exact" if v == exact else "wrapped" if v == wrap else "saturated" if v == sat else "other"
    except Exception as exc:  # noqa: BLE001 - a kernel that refuses is a result too
        v, uniform, what = None, None, f"error: {type(exc).__name__}: {str(exc)[:80]}"
    return {"kernel": kind, "inputs": fill, "K": k, "exact": exact, "int32 wrap": wrap, "int32 saturate": sat,
            "got": v, "all elements equal": uniform, "behaviour": what}


def fp8_scaling_rows(values=([0.0, 0.0, 0.1, 0.1], [0.0, 0.0, 1e-3, 1e-3], [0.0, 0.0, 0.0, 0.0])) -> list[dict]:
    """Per-tensor FP8 quantization of small fp16 tensors, the naive fp16 scale against the fixed one, and
    whether the fixed scale equals torchao's amax_to_scale bit for bit."""
    from torchao.float8.float8_utils import amax_to_scale
    rows = []
    for vals in values:
        h = torch.tensor(vals, dtype=torch.float16)
        for dt in FP8_FORMATS:
            naive, fixed = numerics.naive_fp8_quantize(h, dt), numerics.fp8_quantize(h, dt)
            rows.append({"x (fp16)": vals, "fp8": str(dt)[6:], "naive scale (amax/fp8_max, fp16)": naive["scale"],
                         "naive 1/scale": naive["inv_scale"], "naive fp8": naive["fp8"].float().tolist(),
                         "NaNs naive": int(torch.isnan(naive["fp8"].float()).sum()),
                         "fixed scale (fp8_max/amax, fp32)": fixed["scale"].item(),
                         "fixed dequant": [round(v, 5) for v in fixed["dequant"].tolist()],
                         "== torchao amax_to_scale": bool(torch.equal(fixed["scale"], amax_to_scale(h.abs().max(), dt)))})
    return rows


def fp8_scale_matches_torchao(amaxes: torch.Tensor) -> bool:
    """numerics.fp8_scale equals torchao's amax_to_scale on every amax, in both FP8 formats."""
    from torchao.float8.float8_utils import amax_to_scale
    return all(torch.equal(numerics.fp8_scale(a, dt), amax_to_scale(a, dt)) for a in amaxes for dt in FP8_FORMATS)


def e4m3_cast(xs: torch.Tensor, dev) -> tuple[dict, str]:
    """Columns of the e4m3fn cast of xs: the reference saturating and non-saturating, and this torch's
    `.to()` on dev; and which of the two this torch's cast is for finite values ("neither" if none)."""
    sat = numerics.round_to_format(xs, numerics.E4M3, True)
    nonsat = numerics.round_to_format(xs, numerics.E4M3, False)
    got = xs.to(dev).to(torch.float8_e4m3fn).float().cpu()
    finite = torch.isfinite(xs)
    same = lambda u, v: bool(((u == v) | (torch.isnan(u) & torch.isnan(v)))[finite].all())  # noqa: E731
    mode = "saturating" if same(got, sat) else "non-saturating" if same(got, nonsat) else "neither"
    return {"x": xs.tolist(), "e4m3fn saturating (ref)": sat.tolist(), "e4m3fn non-saturating (ref)": nonsat.tolist(),
            f"torch {torch.__version__} .to() on {dev}": got.tolist()}, mode


def _with_special(rows: int, gen: torch.Generator, *at) -> torch.Tensor:
    t = torch.randn(rows, 256, generator=gen)
    for first, step, value in at:                  # (first column, step, value)
        t[:, first::step] = value
    return t


def mx_cases(rows: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """The MX test tensors ([rows, 256]): ordinary, wide-range, zero, subnormal, huge blocks, and blocks
    holding NaN, +Inf, -Inf or both."""
    nan, inf = float("nan"), float("inf")
    return {"random": torch.randn(rows, 256, generator=gen),
            "wide range": torch.randn(rows, 256, generator=gen) * torch.logspace(-30, 30, rows)[:, None],
            "zero": torch.zeros(rows, 256),
            "tiny (1e-39, subnormal fp32)": torch.randn(rows, 256, generator=gen) * 1e-39,
            "huge (3.3e38)": torch.randn(rows, 256, generator=gen).clamp(-3, 3) * 1.1e38,
            "a NaN in every block": _with_special(rows, gen, (5, 32, nan)),
            "+Inf in every block": _with_special(rows, gen, (9, 32, inf)),
            "-Inf in every block": _with_special(rows, gen, (9, 32, -inf)),
            "+Inf and NaN in every block": _with_special(rows, gen, (9, 32, inf), (17, 32, nan)),
            "all-NaN and all-Inf blocks": torch.tensor([nan, inf, -inf, 1.0]).repeat_interleave(32).repeat(rows, 2)}


def mx_comparison(cases: dict[str, torch.Tensor]) -> list[dict]:
    """Each case in MXFP8 and MXFP4, fp32 and bf16 inputs, against torchao's to_mx under the spec's rules
    and under torchao's: mismatching scale codes, element codes and decoded values, and the verdict."""
    rows = []
    for name, t in cases.items():
        for elem in ("mxfp8", "mxfp4"):
            r = {rules: [numerics.compare_mx(t.to(dt), elem, rules=rules) for dt in (torch.float32, torch.bfloat16)]
                 for rules in numerics.MX_RULES}
            n = {rules: {k: sum(c[k] for c in cs) for k in ("scale_mismatches", "code_mismatches", "decoded_mismatches")}
                 for rules, cs in r.items()}
            exact = {rules: not any(v.values()) for rules, v in n.items()}
            rows.append({"case": name, "elem": elem, "blocks (x2 dtypes)": 2 * r["spec"][0]["blocks"],
                         "non-finite blocks": sum(c["non_finite_blocks"] for c in r["spec"]),
                         "scale codes differ (spec)": n["spec"]["scale_mismatches"],
                         "element codes differ (spec)": n["spec"]["code_mismatches"],
                         "scale codes differ (torchao rules)": n["torchao"]["scale_mismatches"],
                         "element codes differ (torchao rules)": n["torchao"]["code_mismatches"],
                         "decoded differ (torchao rules)": n["torchao"]["decoded_mismatches"],
                         "bit-exact vs torchao": "under both rules" if exact["spec"] else
                         "under torchao rules" if exact["torchao"] else "NO"})
    return rows


def platform_tolerance_rows(trips: list[dict], bound_db: float) -> list[dict]:
    """The Int8 weight-only round trips (int8wo.round_trip) side by side with the ROCm report: fixed
    tolerance against the derived bound."""
    rows = [{"pair": f"{r['quantized_on']} -> {r['run_on']} ({r['format']})", "max abs diff": r["max_abs_diff"],
             "atol 1e-5 / rtol 1.3e-6": r["assert_close_default"][:6], "relative L2": r["relative_l2"],
             "derived bound (rel L2)": r["derived_bound"], "SQNR floor dB": bound_db,
             "derived check": "pass" if r["derived_bound_passes"] else "FAIL"} for r in trips]
    return rows + [{"pair": "CUDA -> ROCm (pytorch/ao#2460, reported, not measured here)",
                    "max abs diff": ROCM_REPORTED_MAX_ABS, "atol 1e-5 / rtol 1.3e-6": "FAILED", "relative L2": None,
                    "derived bound (rel L2)": trips[0]["derived_bound"], "SQNR floor dB": bound_db,
                    "derived check": "needs the outputs"}]


# ------------------------------------------------------------------- verdicts that name the place
def where_wrong(out: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor, tile: tuple[int, int] | None = None,
                safety: float = 4.0, systematic: bool = True) -> dict:
    """Elements of `out` [M, N] off float64 `ref` by more than their own error bound (numerics.elementwise_bound),
    or not finite, and two systematic errors no single element shows: an offset (mean error) and a scale (mean
    error along sign(ref)). Rounding to nearest is unbiased, so each mean must stay within safety * rms(bound) /
    sqrt(n); a one-ULP bias on every element, or a scale of a few ULPs, passes every element's bound but not
    this. A global relative L2 averages one wrong row, tile or element away; these name it. systematic=False
    where a rounding is not to nearest: tensor cores truncate inside their fp32 accumulation (Fasi et al. 2021,
    "Numerical behavior of NVIDIA tensor cores"): a bias toward zero that grows with K while the limit shrinks
    with the number of elements, so at a GPU profile's 2048x4096x2048 the hardware's own rounding could fail it.

    Returns {"ok", "bad", "n", "first", "rows", "cols", "tiles", "offset", "scale", "detail"}."""
    o, r, b = out.detach().cpu().double(), ref.detach().cpu().double(), bound.detach().cpu().double()
    err = o - r
    bad = ~(err.abs() <= b)                                # NaN and Inf are never within a bound
    n = err.numel()
    idx = bad.nonzero().tolist()
    finite = torch.isfinite(err)
    limit = safety * b[finite].pow(2).mean().sqrt().item() / max(finite.sum().item(), 1) ** 0.5 if finite.any() else 0.0
    offset = err[finite].mean().item() if finite.any() else 0.0
    scale = (err * torch.sign(r))[finite].mean().item() if finite.any() else 0.0
    out_d = {"n": n, "bad": len(idx), "first": tuple(idx[0]) if idx else None,
             "rows": sorted({i for i, _ in idx}), "cols": sorted({j for _, j in idx}),
             "tiles": sorted({(i // tile[0], j // tile[1]) for i, j in idx}) if tile else None,
             "offset": offset, "scale": scale, "bias_limit": limit}
    parts = []
    if idx:
        i, j = idx[0]
        what = "not finite" if not torch.isfinite(o[i, j]) else f"off by {err[i, j].abs().item():.3g} > bound {b[i, j].item():.3g}"
        parts.append(f"{len(idx)} of {n} elements outside their bound, first [{i}, {j}] ({what}); "
                     f"rows {_span(out_d['rows'])}, columns {_span(out_d['cols'])}"
                     + (f", tiles (row, col) of {tile[0]}x{tile[1]}: {_span(out_d['tiles'])}" if tile else ""))
    if systematic and abs(offset) > limit:
        parts.append(f"a systematic offset: mean error {offset:.3g}, above {limit:.3g} that unbiased rounding allows")
    if systematic and abs(scale) > limit:
        parts.append(f"a systematic scale: mean error along sign(ref) {scale:.3g}, above {limit:.3g} that unbiased "
                     "rounding allows")
    out_d["ok"] = not parts
    out_d["detail"] = "; ".join(parts) or f"all {n} elements within their bound" + (
        ", no systematic offset or scale" if systematic else "")
    return out_d


def _span(items: list, shown: int = 6) -> str:
    return ", ".join(map(str, items[:shown])) + (f", ... ({len(items)} in all)" if len(items) > shown else "")


def gemm_tile() -> tuple[int, int] | None:
    """The tile of the last matmul: the interpreter's fixed one, else the autotuner's choice (None before one)."""
    from .kernels.common import small_config
    cfg = small_config() if kernels.interpreted() else getattr(kernels.matmul_tuned_config(), "kwargs", None)
    return (cfg["BLOCK_M"], cfg["BLOCK_N"]) if cfg else None


def rounds_to_nearest(prec: str | None) -> bool:
    """Whether our GEMM rounds every addition to nearest here: the interpreter (numpy) and fp32 "ieee" (FMA on
    the GPU's vector units) do; a tensor core (fp16, bf16, TF32, TF32x3 on a GPU) does not."""
    return kernels.interpreted() or prec == "ieee"


def gemm_verdict(A: torch.Tensor, B: torch.Tensor, outs: dict) -> dict:
    """The lab's verdict on our GEMM: every case that ran (gemm_precision's outs) against float64 of its rounded
    inputs, by two rules: the whole result's relative L2 within case_bound (errors spread over every element),
    and each element within its own bound (where_wrong: one element, row or tile); fail names the case, the
    elements, rows, columns and tiles."""
    failed, tile = [], gemm_tile()
    for name, dt, prec in GEMM_CASES:
        if name not in outs:
            continue
        ours, _, ref = outs[name]
        a, b = A.to(dt), B.to(dt)
        tf32 = name.split()[-1] == "tf32"
        found = where_wrong(ours, ref, numerics.elementwise_bound(a, b, "tf32" if tf32 else dt), tile,
                            systematic=rounds_to_nearest(prec))
        rel, bound = metrics.relative_l2(ours, ref), case_bound(name, A.shape[1])
        spread = [] if rel <= bound else [f"relative L2 {rel:.3g} above its bound {bound:.3g}"]
        if spread or not found["ok"]:
            failed.append(f"{name}: " + "; ".join(spread + ([] if found["ok"] else [found["detail"]])))
    return {"check": "Triton GEMM vs fp64", "verdict": "fail" if failed else "ok",
            "detail": "; ".join(failed) if failed else
            f"{len(outs)} cases within metrics.matmul_error_bound, on the whole and element by element"
            + ("" if kernels.interpreted() else "; the mean-error test only where additions round to nearest")}


def grouped_verdict(groups: list[int], dev, gen: torch.Generator, k: int = 256, n: int = 128) -> dict:
    """Every grouped GEMM of ours element by element against float64 of the same inputs, with the group of
    each wrong row named (an empty group included: a kernel that writes into its neighbour's rows fails)."""
    gdt, ga, gb, offs, ref = _grouped_inputs(groups, dev, gen, k, n)
    a64, b64 = ga.double().cpu(), gb.double().cpu()
    starts = torch.tensor([0] + list(groups)).cumsum(0).tolist()
    bound = torch.cat([numerics.elementwise_bound(a64[s:e], b64[g], gdt) for g, (s, e)
                       in enumerate(zip(starts[:-1], starts[1:])) if e > s])   # _grouped_inputs refused no rows
    failed = []
    for name in kernels.grouped_kernels_here(ga, gb):
        found = where_wrong(kernels.grouped_matmul(ga, gb, offs, kernel=name).cpu(), ref, bound,
                            systematic=rounds_to_nearest(None))
        if not found["ok"]:
            rows = found["rows"]
            group_of = sorted({next(g for g in range(len(groups)) if starts[g] <= i < starts[g + 1]) for i in rows})
            failed.append(f"ours ({name}): {found['detail']}" + (f"; groups {_span(group_of)}" if rows else ""))
    return {"check": "Triton grouped GEMM vs fp64", "verdict": "fail" if failed else "ok",
            "detail": "; ".join(failed) if failed else f"groups {groups}: every element within its bound"}

"""Roofline (屋顶模型): where a kernel sits between the memory line and the compute ceiling.

attainable = min(peak FLOP/s, intensity x bandwidth), with intensity = FLOP per byte moved. Both
ceilings come from Lab 01's measurements, not a datasheet. A batch-1 decode GEMV does ~2 FLOP per
weight element, so its intensity is ~1 FLOP/byte in bf16 and ~4 in Int4: far left of any GPU's
ridge, memory-bound either way, and its speed-up from Int4 is bounded by the ratio of bytes moved.
"""
from __future__ import annotations

import numpy as np

from .timing import operand_copies, time_cold, time_kernel  # noqa: F401  (Lab 05 calls them here)


def gemm_bytes(m: int, n: int, k: int, a_bytes: float, b_bytes: float, c_bytes: float) -> float:
    """Bytes a GEMM must move at least once: A [m, k], B [k, n] read, C [m, n] written."""
    return m * k * a_bytes + k * n * b_bytes + m * n * c_bytes


def int4_weight_bytes(k: int, n: int, group_size: int = 128) -> float:
    """GPTQ Int4 weights of a k x n layer: 4-bit codes, an fp16 scale and a 4-bit zero per group and column."""
    if k % group_size:
        raise ValueError(f"k={k} must be a multiple of group_size={group_size}")
    groups = k // group_size
    return k * n / 2 + groups * n * 2 + groups * n / 2


def point(name: str, flops: float, nbytes: float, seconds: float) -> dict:
    """A measured kernel as a roofline point: intensity (FLOP/byte) and achieved TFLOP/s and GB/s."""
    if seconds <= 0 or nbytes <= 0:
        raise ValueError(f"{name}: seconds and bytes must be > 0, got {seconds}, {nbytes}")
    return {"kernel": name, "flops": flops, "bytes": nbytes, "seconds": seconds,
            "intensity": flops / nbytes, "tflops": flops / seconds / 1e12, "gbps": nbytes / seconds / 1e9}


def attainable_tflops(intensity, peak_tflops: float, bandwidth_gbps: float):
    """The roof: min(peak, intensity x bandwidth), in TFLOP/s."""
    return np.minimum(peak_tflops, np.asarray(intensity, dtype=float) * bandwidth_gbps / 1e3)


def bound(p: dict, peak_tflops: float, bandwidth_gbps: float) -> str:
    """'memory' left of the ridge (peak / bandwidth FLOP per byte), 'compute' right of it."""
    return "memory" if p["intensity"] < peak_tflops * 1e3 / bandwidth_gbps else "compute"


def plot_roofline(points: list[dict], peak_tflops: dict, bandwidth_gbps: float, title: str = "",
                  notes: dict[str, str] | None = None):
    """Log-log roofline: the memory line, one ceiling per dtype, the measured points. notes: {kernel: why its
    point needs a caveat}; such a point is hollow, its label starred, the note written under the axes."""
    import matplotlib.pyplot as plt

    notes = notes or {}
    fig, ax = plt.subplots(figsize=(7, 4.2))
    lo = min([p["intensity"] for p in points] + [0.1]) / 2
    hi = max([p["intensity"] for p in points] + [peak_tflops and max(peak_tflops.values()) * 1e3 / bandwidth_gbps]) * 4
    xs = np.logspace(np.log10(lo), np.log10(hi), 200)
    for dt, peak in sorted(peak_tflops.items(), key=lambda kv: -kv[1]):
        ax.plot(xs, attainable_tflops(xs, peak, bandwidth_gbps), lw=1, label=f"roof {dt} ({peak:.3g} TFLOP/s)")
    mid = np.sqrt(lo * hi)                       # labels of points right of the middle go to their left,
    labels = []                                  # so that none runs off the figure
    for p in points:
        star = " *" if p["kernel"] in notes else ""
        ax.scatter(p["intensity"], p["tflops"], zorder=3, color="black", marker="D", s=18,
                   facecolors="white" if star else "black")
        right = p["intensity"] > mid
        labels.append(ax.annotate(p["kernel"] + star, (p["intensity"], p["tflops"]), fontsize=7,
                                  xytext=(-4 if right else 4, 4), textcoords="offset points",
                                  ha="right" if right else "left"))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("TFLOP/s (int8: TOP/s)")
    ax.set_title(title or f"roofline, {bandwidth_gbps:.0f} GB/s")
    ax.legend(fontsize=7, loc="upper left")      # the memory line rises from the lower left
    if notes:
        ax.text(0.0, -0.2, "\n".join(f"* {k}: {v}" for k, v in notes.items()), transform=ax.transAxes,
                fontsize=7, va="top", wrap=True)
    fig.tight_layout()
    _unstack(fig, sorted(labels, key=lambda a: -a.xy[1]))
    return fig


def _unstack(fig, labels: list) -> None:
    """Move each label down, a line at a time, until it overlaps none placed before it (points of equal
    intensity, such as the bf16 and int8 GEMMs at n^3 FLOP over 6 n^2 bytes, would print on each other)."""
    renderer = fig.canvas.get_renderer()
    placed = []
    for label in labels:
        for _ in range(len(labels) * 3):
            box = label.get_window_extent(renderer)
            if not any(box.overlaps(b) for b in placed):
                break
            label.set_position((label.xyann[0], label.xyann[1] - 0.8 * label.get_fontsize()))
        placed.append(label.get_window_extent(renderer))

"""Figures the labs share: each function draws one plot and saves it where the lab asks."""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt


def save(fig, path: str | Path) -> str:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return str(path)


def plot_ceilings(ceilings: dict, title: str = ""):
    """Bar chart of measured matmul TFLOP/s per dtype (skipped dtypes shown as empty, labelled)."""
    rows = ceilings["matmul"]
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    names = [r["dtype"] for r in rows]
    vals = [r.get("tflops", 0.0) if r["status"] == "measured" else 0.0 for r in rows]
    bars = ax.bar(names, vals, color=["#4477aa" if r["status"] == "measured" else "#cccccc" for r in rows])
    for bar, r in zip(bars, rows):
        label = f"{r['tflops']:.3g}" if r["status"] == "measured" else "skipped"
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                    fontsize=8)
    ax.set_ylabel("TFLOP/s (int8: TOP/s)")
    ax.set_title(title or f"matmul ceilings, n={rows[0]['n']}, copy {ceilings['bandwidth_gbps']:.0f} GB/s")
    fig.tight_layout()
    return fig


def plot_monitor(samples: list[dict], title: str = "GPU monitor"):
    """Utilisation and memory over time, one line per GPU; None when there is nothing to plot."""
    if not samples:
        return None
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(6.5, 4), sharex=True)
    for gpu in sorted({s["gpu"] for s in samples}):
        pts = [s for s in samples if s["gpu"] == gpu]
        ax1.plot([p["t"] for p in pts], [p["util_pct"] for p in pts], label=f"GPU {gpu}")
        ax2.plot([p["t"] for p in pts], [p["mem_used_mib"] for p in pts], label=f"GPU {gpu}")
    ax1.set_ylabel("utilisation %")
    ax2.set_ylabel("memory used MiB")
    ax2.set_xlabel("seconds")
    ax1.set_title(title)
    ax1.legend(fontsize=7)
    fig.tight_layout()
    return fig

"""Interactive views for the labs: move a control, see the measurement change.

Each view is a pure function (what a widget shows for given settings: rows, a figure) and a thin
builder that wires ipywidgets controls to it. The builders render into HTML and Image widgets (no
Output capture, no waiting; each update computes first, then sets table and figure together), so a cell that builds one returns at once under papermill and nbgrader,
and the lab saves the same view at its default settings as a figure for the report.

- Lab 02 `quant_explorer`: round-to-nearest quantization of a real layer at b bits, group size G
  (GPTQ's symmetric grid): error and bytes, beside what GPTQ itself stored for that layer.
- Lab 04 `layer_picker`: one module of the per-layer comparison, propagated and isolated.
- Lab 05 `tolerance_explorer`: a fixed atol / rtol against the derived tolerance, on GEMM outputs.
"""
from __future__ import annotations

import html
import io
import json
import math

from .localize import module_verdict
from pathlib import Path

import torch

from . import metrics

PER_ROW = 0          # group size 0: one group per output row (per-channel)


# ---------------------------------------------------------------- shared rendering
def png_bytes(fig) -> bytes:
    """The figure as PNG bytes; the figure is closed (a builder's figure must not also print inline)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def save_static(fig, path: str | Path) -> str:
    """A view at its default settings saved where the lab keeps figures (for the report), then closed:
    the live widget beside it shows the same view, so the notebook does not print it twice."""
    import matplotlib.pyplot as plt

    from .plots import save

    saved = save(fig, path)
    plt.close(fig)
    return saved


def html_table(rows: list[dict]) -> str:
    """rows as an HTML table, every cell's text whole; floats to 4 significant digits."""
    if not rows:
        return "<p><i>nothing to show</i></p>"
    cols = list(rows[0])
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    head = "".join(f"<th style='padding:2px 8px'>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td style='padding:2px 8px'>{html.escape(fmt(r.get(c, '')))}</td>" for c in cols)
                   + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# ---------------------------------------------------------------- Lab 02: bits and group size
def read_weight(model_dir: str | Path, name: str) -> torch.Tensor:
    """`name`.weight of a safetensors checkpoint folder (sharded or not), as float32 [out, in]."""
    from safetensors import safe_open

    model_dir, key = Path(model_dir), f"{name}.weight"
    index = model_dir / "model.safetensors.index.json"
    shard = (json.loads(index.read_text(encoding="utf-8"))["weight_map"].get(key) if index.is_file()
             else "model.safetensors")
    if shard is None or not (model_dir / shard).is_file():
        raise KeyError(f"{key} is not in the checkpoint at {model_dir}: give a float model's linear layer name")
    with safe_open(str(model_dir / shard), framework="pt") as f:
        if key not in f.keys():
            raise KeyError(f"{key} is not in {model_dir / shard}: give a float model's linear layer name")
        return f.get_tensor(key).float()


def _groups(in_features: int, group_size: int) -> int:
    if group_size == PER_ROW:
        return 1
    if group_size < 1 or in_features % group_size:
        raise ValueError(f"group_size={group_size} must divide in_features={in_features} (or be 0: one group per row)")
    return in_features // group_size


def rtn_quantize(w: torch.Tensor, bits: int, group_size: int) -> torch.Tensor:
    """Round-to-nearest on GPTQ's symmetric grid, dequantized: per group of `group_size` inputs of each
    output row, scale = 2 max|w| / (2^bits - 1), zero = 2^(bits-1), q = clamp(round(w / scale) + zero)."""
    if not 2 <= bits <= 8:
        raise ValueError(f"bits={bits}: choose 2 to 8")
    out_f, in_f = w.shape
    g = _groups(in_f, group_size)
    x = w.double().reshape(out_f, g, in_f // g)
    maxq = 2**bits - 1
    scale = (2 * x.abs().amax(-1, keepdim=True) / maxq).clamp_min(1e-30)   # an all-zero group stays zero
    zero = 2 ** (bits - 1)
    q = (torch.round(x / scale) + zero).clamp(0, maxq)
    return ((q - zero) * scale).reshape(out_f, in_f).to(w.dtype)


def layer_bytes(out_features: int, in_features: int, bits: int, group_size: int) -> float:
    """Bytes of a GPTQ-style layer: b-bit codes, an fp16 scale and a b-bit zero per group and output."""
    g = _groups(in_features, group_size)
    return out_features * in_features * bits / 8 + g * out_features * (2 + bits / 8)


def error_point(w: torch.Tensor, approx: torch.Tensor, bits: int, group_size: int, method: str = "RTN") -> dict:
    """What one setting costs and gives: bytes per weight, SQNR, normalized L2 and max abs error."""
    nbytes = layer_bytes(*w.shape, bits, group_size)
    return {"method": method, "bits": bits, "group size": "per row" if group_size == PER_ROW else group_size,
            "bytes/weight": nbytes / w.numel(), "KiB": nbytes / 1024, "SQNR dB": metrics.sqnr_db(approx, w),
            "rel L2": metrics.relative_l2(approx, w), "max abs": metrics.max_abs_error(approx, w)}


def quant_point(w: torch.Tensor, bits: int, group_size: int) -> dict:
    return error_point(w, rtn_quantize(w, bits, group_size), bits, group_size)


def group_choices(in_features: int, sizes=(32, 64, 128, 256)) -> list[int]:
    """The group sizes that divide in_features (and are smaller: a whole row is PER_ROW), then PER_ROW."""
    return [g for g in sizes if g < in_features and in_features % g == 0] + [PER_ROW]


def quant_sweep(w: torch.Tensor, bits=(2, 3, 4, 8), group_sizes=None) -> list[dict]:
    return [quant_point(w, b, g) for g in (group_sizes or group_choices(w.shape[1])) for b in bits]


def plot_quant_sweep(rows: list[dict], pick: dict | None = None, gptq: dict | None = None, title: str = ""):
    """SQNR against bytes per weight, one line per group size; the picked setting and GPTQ's own marked."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for gs in dict.fromkeys(r["group size"] for r in rows):
        pts = sorted((r for r in rows if r["group size"] == gs), key=lambda r: r["bits"])
        ax.plot([r["bytes/weight"] for r in pts], [r["SQNR dB"] for r in pts], "o-", ms=4, label=f"RTN, group {gs}")
    for b in sorted({r["bits"] for r in rows}):            # one label per bit width, beside its leftmost point
        r = min((r for r in rows if r["bits"] == b), key=lambda r: r["bytes/weight"])
        ax.annotate(f"{b} bits", (r["bytes/weight"], r["SQNR dB"]), xytext=(-6, 4), textcoords="offset points",
                    fontsize=7, ha="right")
    if pick:
        ax.scatter([pick["bytes/weight"]], [pick["SQNR dB"]], s=140, facecolors="none", edgecolors="red", lw=2,
                   zorder=4, label=f"picked: {pick['bits']} bits, group {pick['group size']}")
    if gptq:
        ax.scatter([gptq["bytes/weight"]], [gptq["SQNR dB"]], marker="*", s=160, color="black", zorder=5,
                   label=f"GPTQ checkpoint ({gptq['bits']} bits, group {gptq['group size']})")
    ax.margins(x=0.12)                                     # room for the leftmost label
    ax.set_xlabel("bytes per weight (codes + fp16 scale + zero per group)")
    ax.set_ylabel("SQNR dB (higher is better)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def quant_explorer(w: torch.Tensor, name: str, gptq: dict | None = None, bits: int = 4, group_size: int = 128):
    """Sliders for bits and group size over layer `name`'s weight: its error and bytes, live."""
    import ipywidgets as W

    groups = group_choices(w.shape[1])
    b_in = W.IntSlider(value=bits, min=2, max=8, description="bits")
    g_in = W.Dropdown(options=[("per row" if g == PER_ROW else str(g), g) for g in groups],
                      value=group_size if group_size in groups else groups[-1], description="group size")
    table, image = W.HTML(), W.Image(format="png")
    sweep = quant_sweep(w)

    def show(_=None):
        p = quant_point(w, b_in.value, g_in.value)
        png = png_bytes(plot_quant_sweep(sweep, p, gptq, f"{name} {tuple(w.shape)}"))
        table.value, image.value = html_table([p] + ([gptq] if gptq else [])), png

    b_in.observe(show, "value")
    g_in.observe(show, "value")
    show()
    return W.VBox([W.HBox([b_in, g_in]), table, image])


# ---------------------------------------------------------------- Lab 04: one module of the per-layer rows
def module_choices(rows: list[dict]) -> tuple[list[int], list[str]]:
    """The decoder layers and the module parts present in the rows (modules outside the decoder layers,
    the embedding, the final norm and the logits, have no layer and are left out)."""
    inside = [r for r in rows if r["layer"] is not None]
    layers = sorted({r["layer"] for r in inside})
    parts = list(dict.fromkeys(r["part"] for r in inside))
    return layers, parts


def module_view(rows: list[dict], layer: int, part: str, threshold: float = 0.99) -> list[dict]:
    """The picked module's metrics in each mode, with the lab's verdict at `threshold` (cosine and L2)."""
    picked = [r for r in rows if r["layer"] == layer and r["part"] == part]
    if not picked:
        layers, parts = module_choices(rows)
        raise ValueError(f"no rows for layer={layer}, part={part!r}: layers {layers}, parts {parts}")
    return [{"mode": r.get("mode", ""), "module": r["module"], "cosine": r["cosine"], "rel L2": r["rel_l2"],
             "SQNR dB": r["sqnr_db"], "max abs": r["max_abs"],
             "verdict": module_verdict(r, healthy=threshold)} for r in picked]


def default_module(rows: list[dict]) -> tuple[int, str]:
    """Where to open the picker: the whole layer with the largest local (isolated) error, else any mode's."""
    layer_rows = [r for r in rows if r["part"] == "layer"]
    pool = [r for r in layer_rows if r.get("mode") == "isolated"] or layer_rows
    if not pool:
        raise ValueError("no whole-layer rows (part 'layer') to pick from")
    worst = min(pool, key=lambda r: -math.inf if math.isnan(r["sqnr_db"]) else r["sqnr_db"])
    return worst["layer"], "layer"


METRICS = {"sqnr_db": "SQNR dB", "cosine": "cosine similarity", "rel_l2": "normalized L2", "max_abs": "max abs error"}


def plot_module(rows: list[dict], layer: int, part: str, metric: str = "sqnr_db"):
    """`metric` over depth for one part, one line per mode, the picked layer marked."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    for mode in dict.fromkeys(r.get("mode", "") for r in rows):
        pts = sorted(((r["layer"], r[metric]) for r in rows if r["part"] == part and r.get("mode", "") == mode),
                     key=lambda p: p[0])
        ys = [math.nan if math.isinf(y) else y for _, y in pts]      # a bit-identical point has no finite SQNR
        ax.plot([x for x, _ in pts], ys, "o-", ms=4, label=mode or part)
        here = [y for x, y in zip([x for x, _ in pts], ys) if x == layer]
        if here and not math.isnan(here[0]):
            ax.scatter([layer], here, s=150, facecolors="none", edgecolors="red", lw=2, zorder=4)
    ax.axvline(layer, color="red", lw=0.8, ls=":")
    ax.xaxis.get_major_locator().set_params(integer=True)
    if metric in ("rel_l2", "max_abs") and any(r[metric] > 0 for r in rows if r["part"] == part):
        ax.set_yscale("log")
    ax.set_xlabel("decoder layer")
    ax.set_ylabel(METRICS[metric])
    ax.set_title(f"{part}: {METRICS[metric]} over depth; picked layer {layer}", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def layer_picker(rows: list[dict], threshold: float = 0.99):
    """Dropdowns for layer, module part and metric over the per-layer comparison rows."""
    import ipywidgets as W

    layers, parts = module_choices(rows)
    layer, part = default_module(rows)
    l_in = W.Dropdown(options=layers, value=layer, description="layer")
    p_in = W.Dropdown(options=parts, value=part, description="module")
    m_in = W.Dropdown(options=[(v, k) for k, v in METRICS.items()], value="sqnr_db", description="metric")
    table, image = W.HTML(), W.Image(format="png")

    def show(_=None):
        png = png_bytes(plot_module(rows, l_in.value, p_in.value, m_in.value))
        table.value, image.value = html_table(module_view(rows, l_in.value, p_in.value, threshold)), png

    for c in (l_in, p_in, m_in):
        c.observe(show, "value")
    show()
    return W.VBox([W.HBox([l_in, p_in, m_in]), table, image])


# ---------------------------------------------------------------- Lab 05: fixed tolerance against derived
def tolerance_rows(pairs: dict, atol: float, rtol: float, derived: dict) -> list[dict]:
    """For each (result, reference) pair: how many elements fail |x - y| <= atol + rtol |y| (assert_close's
    rule) at the fixed setting and at the derived one."""
    rows = []
    for label, (x, y) in pairs.items():
        err = (x.double() - y.double()).abs()
        mag = y.double().abs()
        fixed = int((err > atol + rtol * mag).sum())
        der = int((err > derived["atol"] + derived["rtol"] * mag).sum())
        rows.append({"pair": label, "elements": err.numel(), "max |x - y|": float(err.max()),
                     f"fail atol={atol:.0e} rtol={rtol:.0e}": fixed, "fail derived": der,
                     "fixed says": "pass" if fixed == 0 else "FAIL", "derived says": "pass" if der == 0 else "FAIL"})
    return rows


def plot_tolerance(pairs: dict, atol: float, rtol: float, derived: dict, title: str = ""):
    """Each element's |x - y| against |y|, the fixed tolerance and the derived one as lines."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    top = max(float(y.double().abs().max()) for _, y in pairs.values()) * 1.05
    floor = None
    for i, (label, (x, y)) in enumerate(pairs.items()):
        err = (x.double() - y.double()).abs().flatten()
        mag = y.double().abs().flatten()
        nz = err > 0
        floor = min(floor or math.inf, float(err[nz].min()) if nz.any() else math.inf)
        ax.scatter(mag[nz][:4000], err[nz][:4000], s=6, alpha=0.6, zorder=3 + len(pairs) - i,   # first on top
                   label=f"{label}: {int(nz.sum())} of {err.numel()} differ")
    grid = torch.linspace(0, top, 100)
    ax.plot(grid, atol + rtol * grid, color="red", lw=1.5, label=f"fixed: atol {atol:.0e} + rtol {rtol:.0e} |y|")
    ax.plot(grid, derived["atol"] + derived["rtol"] * grid, color="green", lw=1.5, ls="--",
            label=f"derived: atol {derived['atol']:.2g} + rtol {derived['rtol']:.2g} |y|")
    ax.set_yscale("log")
    lo = min(floor if floor and floor < math.inf else atol, atol, derived["atol"]) / 3
    ax.set_ylim(lo, max(atol + rtol * top, derived["atol"] + derived["rtol"] * top) * 3)
    ax.set_xlabel("|y| (reference output)")
    ax.set_ylabel("|x - y| (elements that differ)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


ATOLS = [1e-5, 1e-4, 1e-3, 1e-2, 3e-2, 1e-1, 1.0]
RTOLS = [0.0, 1e-5, 1e-4, 1e-3, 1e-2]


def tolerance_explorer(pairs: dict, derived: dict, atol: float = 1e-2, rtol: float = 0.0, title: str = ""):
    """Sliders for a fixed atol and rtol; which pairs they pass, against the derived tolerance."""
    import ipywidgets as W

    a_in = W.SelectionSlider(options=[(f"{a:.0e}", a) for a in ATOLS], value=atol, description="atol")
    r_in = W.SelectionSlider(options=[(f"{r:.0e}" if r else "0", r) for r in RTOLS], value=rtol, description="rtol")
    table, image = W.HTML(), W.Image(format="png")

    def show(_=None):
        png = png_bytes(plot_tolerance(pairs, a_in.value, r_in.value, derived, title))
        table.value, image.value = html_table(tolerance_rows(pairs, a_in.value, r_in.value, derived)), png

    a_in.observe(show, "value")
    r_in.observe(show, "value")
    show()
    return W.VBox([W.HBox([a_in, r_in]), table, image])

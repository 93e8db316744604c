"""Figures as a student sees them: labels readable, nothing drawn empty."""
import math

import matplotlib

matplotlib.use("Agg")

from utils import localize, roofline  # noqa: E402


def _label_boxes(fig):
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    ax = fig.axes[0]
    return [t.get_window_extent(r) for t in ax.texts if t.get_text().startswith(("bf16", "int8", "Int4"))]


def test_roofline_labels_do_not_overlap_and_the_note_is_on_the_plot():
    # the CPU run's case: bf16 and int8 GEMMs share one intensity (6 n^2 bytes both), GEMVs close together
    pts = [roofline.point("bf16 GEMM n=256", 2 * 256**3, 6 * 256**2, 1e-3),
           roofline.point("int8 GEMM n=256", 2 * 256**3, 6 * 256**2, 0.9e-3),
           roofline.point("bf16 GEMV 1024->1024", 2 * 1024**2, 2 * 1024**2 + 4096, 1e-4),
           roofline.point("Int4 GEMV 1024->1024 (Triton)", 2 * 1024**2, roofline.int4_weight_bytes(1024, 1024) + 4096,
                          1.1e-4)]
    fig = roofline.plot_roofline(pts, {"bf16": 0.5, "int8": 0.6, "fp32": 0.3}, 20.0,
                                 notes={pts[3]["kernel"]: "timed under the Triton interpreter"})
    boxes = _label_boxes(fig)
    assert len(boxes) == 4
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    assert any("Triton interpreter" in t.get_text() for t in fig.texts + fig.axes[0].texts)


def _rows(err):
    return [{"module": f"model.layers.{i}", "layer": i, "part": "layer", "cosine": 1.0 if not err else 0.999,
             "rel_l2": err, "sqnr_db": math.inf if not err else 60.0, "max_abs": err} for i in range(3)] + [
        {"module": "logits", "layer": None, "part": "logits", "cosine": 1.0, "rel_l2": err,
         "sqnr_db": math.inf if not err else 60.0, "max_abs": err}]


def test_plot_layers_says_bit_identical_in_one_line_instead_of_empty_panels():
    fig = localize.plot_layers(_rows(0.0), "golden capture: cpu vs cpu")
    assert len(fig.axes) <= 1 and not any(ax.lines for ax in fig.axes)
    text = " ".join(t.get_text() for t in fig.texts + [t for ax in fig.axes for t in ax.texts])
    assert "bit-identical" in text and "4 modules" in text
    assert len(localize.plot_layers(_rows(1e-3)).axes) == 4          # a real difference is still drawn


def test_every_lab_shows_table_text_whole():
    """pandas cuts cell text at 50 characters by default; the report shows it whole, so must the labs."""
    from pathlib import Path

    import nbformat

    labs = sorted(Path(__file__).resolve().parents[1].glob("labs/*/*.ipynb"))
    assert labs
    for path in labs:
        nb = nbformat.read(path, as_version=4)
        code = [c.source for c in nb.cells if c.cell_type == "code"]
        setup = next(s for s in code if "import pandas as pd" in s)
        assert 'pd.set_option("display.max_colwidth", None' in setup, path.name

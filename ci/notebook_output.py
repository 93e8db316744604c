"""Executed notebooks as the chain keeps them: progress bars out (live in JupyterLab, dead weight once saved),
every other output in."""
from __future__ import annotations

import re
from pathlib import Path

from utils.results import atomic_write_text

_WIDGET = "application/vnd.jupyter.widget-view+json"
# tqdm's "43%|####  | 3/7 [00:01<00:02, 2.1it/s]", and without a total "0 examples [00:00, ? examples/s]"
_BAR = re.compile(r"^[^\n]*(\d+%\|[^|]*\|\s*\d+/\d+ \[[^\]]*\]|\d+ \w+ \[\d+:\d+(:\d+)?, [^\]]*/s\])\s*$")


def _is_progress(output) -> bool:
    """A tqdm bar as a saved notebook holds it: a widget with no state (its first frame, "0/74", shown
    as text or as "model not found" in JupyterLab) or stderr lines that are only bar updates."""
    if output.get("output_type") == "display_data":
        data = output.get("data", {})
        return _WIDGET in data and set(data) <= {_WIDGET, "text/plain"} and bool(_BAR.match(data.get("text/plain", "")))
    if output.get("output_type") == "stream" and output.get("name") == "stderr":
        lines = [ln for ln in re.split(r"[\r\n]", output.get("text", "")) if ln.strip()]
        return all(_BAR.match(ln) for ln in lines)            # also drops the blank lines tqdm leaves
    return False


def strip_progress_bars(notebook: Path) -> int:
    """Remove progress bars from an executed notebook (live in JupyterLab, dead weight once saved);
    every other output stays. Returns how many outputs went; the file is replaced atomically."""
    import nbformat

    nb = nbformat.read(str(notebook), as_version=4)
    dropped = 0
    for cell in nb.cells:
        if cell.get("cell_type") == "code":
            kept = [o for o in cell.get("outputs", []) if not _is_progress(o)]
            dropped += len(cell.outputs) - len(kept)
            cell.outputs = kept
    if dropped:
        text = nbformat.writes(nb)
        atomic_write_text(notebook, text if text.endswith("\n") else text + "\n")   # as nbformat.write
    return dropped

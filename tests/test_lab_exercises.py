"""The labs' exercise cells as a student meets them: blank, they say "not done yet" and never "passed"."""
import contextlib
import io
import re

import nbformat
import pytest
import torch

from tests.conftest import ROOT

HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", re.S)


def released(source: str) -> str:
    """A test cell as the student release has it: the hidden-test region removed."""
    return HIDDEN.sub("", source)


def test_lab02_unpacker_not_done_says_not_done_yet():
    from utils import gptq
    nb = nbformat.read(ROOT / "labs/02_models/02_models.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    setup = [c.source for c in code if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "setup_02"]
    graded = [c.source for c in code if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "student_dequantize_tests"]
    check = graded[0] if graded else next(c.source for c in code if "student_dequantize(" in c.source
                                          and "def student_dequantize" not in c.source)
    after = [c.source for c in code if c.get("id") == "ex02-apply"]   # the check on the real layer
    path = ROOT / "fixtures/tiny-qwen2-gsm/gptq-int4"
    layer = next(n for n in gptq.layer_names(path) if n.endswith("q_proj"))
    ns = {"torch": torch, "gptq": gptq, "t": gptq.read_layer(path, layer), "layer": layer}

    def student_dequantize(qweight, qzeros, scales, g_idx, bits=4):
        raise NotImplementedError

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for src in setup:
            exec(src, ns)
        ns["student_dequantize"] = student_dequantize
        exec(released(check), ns)
        for src in after:
            exec(src, ns)
    text = out.getvalue()
    assert "not done yet" in text, text
    assert "passed" not in text, text

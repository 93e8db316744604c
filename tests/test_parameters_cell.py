"""A lab opened alone checks its own parameters cell: a student's bad edit is named before the lab uses it."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bad_input_table import record
from ci.parameters_cell import check_lab_parameters
from ci.profile_schema import lab_params

ROOT = Path(__file__).resolve().parents[1]
LABS = ["01_env", "02_models", "03_eval", "04_divergence", "05_kernels"]


@pytest.mark.parametrize("lab", LABS)
def test_every_lab_checks_its_parameters_and_its_defaults_pass(lab):
    nb = json.loads((ROOT / "labs" / lab / f"{lab}.ipynb").read_text())
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    assert f'check_lab_parameters("{lab}", globals())' in code[1]       # the cell right after the parameters
    defaults = {n: i["default"] for n, i in lab_params(ROOT / "labs" / lab / f"{lab}.ipynb").items()}
    check_lab_parameters(lab, defaults)


@pytest.mark.parametrize("lab, values, named", [
    ("05_kernels", {"gemm_m": -5}, "gemm_m: got -5; expected int at least 1; its default: gemm_m = 256"),
    ("05_kernels", {"k_sweep": []}, "k_sweep: got a list []"),
    ("05_kernels", {"gemm_k": 1024.0}, "write 1024"),
    ("04_divergence", {"capture_dtypes": ["float64"]}, "capture_dtypes[0]: got 'float64' (text)"),
    ("04_divergence", {"cos_threshold": float("nan")}, "cos_threshold: got nan (not a finite number)"),
    ("03_eval", {"batch_size": "big"}, "batch_size: got 'big' (text)"),
    ("01_env", {"repeats": 0}, "repeats: got 0"),
])
def test_a_bad_value_in_the_cell_is_named_with_its_default(lab, values, named):
    with pytest.raises(ValueError) as err:
        check_lab_parameters(lab, values)
    msg = record("lab parameters cell", f"{lab}: {', '.join(f'{k} = {v!r}' for k, v in values.items())} in its "
                 "parameters cell", str(err.value))
    assert msg.startswith(f"{lab}'s parameters cell:") and named in msg and "run the lab again" in msg, msg


def test_a_lab_run_alone_stops_at_the_bad_value_and_writes_nothing(tmp_path):
    """Lab 05 run as a student would, with gemm_m = 0 in its cell: the second cell stops it, no results."""
    out_nb, run_dir = tmp_path / "out.ipynb", tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "papermill", str(ROOT / "labs/05_kernels/05_kernels.ipynb"),
                           str(out_nb), "-p", "gemm_m", "0", "-p", "run_dir", str(run_dir), "--cwd",
                           str(ROOT / "labs/05_kernels")], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TRITON_INTERPRET": "1"})
    assert proc.returncode != 0
    cells = json.loads(out_nb.read_text())["cells"]
    errors = [o for c in cells if c["cell_type"] == "code" for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert errors and errors[0]["ename"] == "ValueError" and "gemm_m: got 0" in errors[0]["evalue"], errors
    assert not list(run_dir.rglob("results.json"))

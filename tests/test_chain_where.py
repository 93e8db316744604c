"""Chain errors name where: the lab, the cell (its number as JupyterLab shows it, and its first line), the
executed notebook that really exists, the parameter or file; a setting this machine cannot honour says what
to set instead."""
import json
import re

import papermill
import pytest
import yaml

from bad_input_table import record
from ci import run as chain
from test_chain import GOOD, make_lab
from test_run_state import stable
from utils import platform as plat


def _profile(tmp_path, **extra):
    return {"name": "test", "params": {"size": 7}, "labs": {}, "_path": str(tmp_path / "test.yaml"), **extra}


def _fail(tmp_path, body, case, **extra):
    labs = tmp_path / "labs"
    make_lab(labs, "01_a", GOOD.format(name="01_a"))
    make_lab(labs, "02_b", body)
    with pytest.raises(chain.ChainError) as err:
        chain.run_chain(_profile(tmp_path, **extra), labs=chain.discover_labs(labs), runs_dir=tmp_path / "runs")
    msg = str(err.value)
    record("chain failure", case, stable(msg))
    (run_dir,) = (tmp_path / "runs").iterdir()
    kept = re.search(r"executed notebook kept at (\S+)", msg)
    assert kept and (tmp_path / kept.group(1)).exists(), msg        # the path it names exists
    assert "cell ?" not in msg and "lab 02_b" in msg
    return msg, json.loads((run_dir / "run.json").read_text())


def test_a_cell_that_raises_is_named_by_number_and_first_line(tmp_path):
    msg, manifest = _fail(tmp_path, "size_squared = size * size\nraise ValueError('planted')", "a cell raises")
    assert re.search(r"cell \[\d+\]", msg) and "size_squared = size * size" in msg
    assert manifest["failure"]["cell"] != "?"


def test_a_cell_past_the_timeout_is_named(tmp_path):
    msg, manifest = _fail(tmp_path, "import time\ntime.sleep(30)", "a cell runs past cell_timeout_s",
                          cell_timeout_s=3)
    assert re.search(r"cell \[\d+\]", msg) and "time.sleep(30)" in msg, msg
    assert "cell_timeout_s" in msg and manifest["status"] == "failed"


def test_a_kernel_that_dies_names_the_cell(tmp_path):
    msg, manifest = _fail(tmp_path, "import os\nos._exit(3)", "the kernel dies in a cell")
    assert re.search(r"cell \[\d+\]", msg) and "os._exit(3)" in msg, msg
    assert manifest["failure"]["cell"] != "?"


def test_a_notebook_without_results_says_after_its_last_cell(tmp_path):
    msg, _ = _fail(tmp_path, "x = 1", "a notebook writes no results.json")
    assert "no results.json" in msg and "after its last cell" in msg


# settings this machine cannot honour ------------------------------------------------------------

CPU = plat.PlatformRecord(backend="cpu", vendor="", device_name="a CPU", device="cpu")


@pytest.fixture
def cpu_box(monkeypatch):
    monkeypatch.setattr(plat, "detect_platform", lambda *a, **k: CPU)

    def ran(*a, **k):
        raise AssertionError("a notebook was executed for a setting this machine cannot honour")
    monkeypatch.setattr(papermill, "execute_notebook", ran)


def _refused(tmp_path, capsys, edit, case):
    prof = yaml.safe_load((chain.PROFILES_DIR / "cpu-tiny.yaml").read_text())
    edit(prof)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(prof))
    rc = chain.main(["--profile", str(path), "--runs-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    record("machine", case, err)
    assert rc == 1 and "Traceback" not in err and str(path) in err, err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    return err


def test_device_cuda_on_a_cpu_box_says_what_to_set(tmp_path, capsys, cpu_box):
    err = _refused(tmp_path, capsys, lambda p: p["params"].update(device="cuda"), "device: cuda on a CPU-only machine")
    assert "params.device" in err and "cpu" in err and ("device: auto" in err or "device: cpu" in err)


def test_device_in_a_lab_section_on_a_cpu_box(tmp_path, capsys, cpu_box):
    err = _refused(tmp_path, capsys, lambda p: p["labs"]["01_env"].update(device="mps"),
                   "device: mps in a lab section on a CPU-only machine")
    assert "labs.01_env.device" in err and "device: auto" in err


def test_triton_compiled_without_a_gpu_says_set_triton_interpret(tmp_path, capsys, cpu_box):
    err = _refused(tmp_path, capsys, lambda p: p["env"].update(TRITON_INTERPRET="0"),
                   "TRITON_INTERPRET: 0 on a machine without a GPU")
    assert "env.TRITON_INTERPRET" in err and 'TRITON_INTERPRET: "1"' in err


def test_a_kernel_that_is_not_installed(tmp_path, capsys, cpu_box):
    err = _refused(tmp_path, capsys, lambda p: p.update(kernel="python9"), "kernel: a Jupyter kernel not installed")
    assert "kernel" in err and "python3" in err


@pytest.mark.parametrize("name, value, case", [
    ("QUANTLAB_GPU_MEMORY_GIB", "24GB", "env QUANTLAB_GPU_MEMORY_GIB: 24GB (not a number)"),
    ("QUANTLAB_GPU_MEMORY_GIB", "nan", "env QUANTLAB_GPU_MEMORY_GIB: nan"),
    ("QUANTLAB_GPTQ_BACKEND", "marlin", "env QUANTLAB_GPTQ_BACKEND: marlin (not a kernel name)"),
    ("QUANTLAB_PEAKS_DIR", "FILE", "env QUANTLAB_PEAKS_DIR: a file, not a folder"),
])
def test_a_bad_quantlab_variable_is_refused_before_any_lab(tmp_path, capsys, cpu_box, name, value, case):
    """A lab kernel reads these late, or (the cap, in sitecustomize) drops an error and runs uncapped."""
    if value == "FILE":
        (tmp_path / "afile").write_text("")
        value = str(tmp_path / "afile")
    err = _refused(tmp_path, capsys, lambda p: p["env"].update({name: value}), case)
    assert f"env.{name}" in err, err


def test_a_bad_quantlab_variable_in_the_shell_is_named_as_such(monkeypatch):
    from ci.machine import env_problems
    assert env_problems({"env": {}}, {"QUANTLAB_GPU_MEMORY_GIB": "-3"}) == [
        "$QUANTLAB_GPU_MEMORY_GIB (this shell's environment): QUANTLAB_GPU_MEMORY_GIB='-3' must be a finite number "
        "of GiB > 0, e.g. 24; unset it for no cap"]
    assert env_problems({"env": {"QUANTLAB_GPU_MEMORY_GIB": 24}}, {"QUANTLAB_GPTQ_BACKEND": "Gptq_Torch"}) == []

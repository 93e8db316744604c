"""The GPU memory cap of a rehearsal: applied in every kernel the chain starts, a no-op without a GPU,
and each kernel's peaks written where the profile says."""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from ci import run as chain
from utils import gpu_cap

from test_chain import GOOD, make_lab


class FakeCuda:
    """torch.cuda of an 80 GiB GPU: records the fraction asked for."""

    def __init__(self, total_gib=80, count=2):
        self.total, self.count, self.calls = total_gib * gpu_cap.GIB, count, []

    def is_available(self):
        return True

    def device_count(self):
        return self.count

    def get_device_properties(self, i):
        return SimpleNamespace(total_memory=self.total)

    def set_per_process_memory_fraction(self, fraction, device):
        self.calls.append((round(fraction, 6), device))


def test_cap_sets_the_fraction_on_every_gpu_and_is_a_no_op_without_one(monkeypatch):
    cuda = FakeCuda()
    done = gpu_cap.apply_cap("24", torch_module=SimpleNamespace(cuda=cuda))
    assert done["applied"] and done["fraction"] == pytest.approx(0.3)
    assert cuda.calls == [(0.3, 0), (0.3, 1)]
    small = FakeCuda(total_gib=16)
    assert not gpu_cap.apply_cap(24, torch_module=SimpleNamespace(cuda=small))["applied"] and small.calls == []
    import torch
    if not torch.cuda.is_available():
        off = gpu_cap.apply_cap(24)
        assert not off["applied"] and "no CUDA/ROCm GPU" in off["reason"]
    monkeypatch.delenv(gpu_cap.CAP_ENV, raising=False)
    assert not gpu_cap.apply_cap()["applied"]
    for bad in ("24GB", "-1", "nan", "inf"):   # NaN passed `<= 0` and reached the memory fraction
        cuda = FakeCuda()
        with pytest.raises(ValueError, match=gpu_cap.CAP_ENV):
            gpu_cap.apply_cap(bad, torch_module=SimpleNamespace(cuda=cuda))
        assert cuda.calls == []
    monkeypatch.setenv(gpu_cap.CAP_ENV, "24 GiB")   # the sharded path reads the same variable, the same way
    with pytest.raises(ValueError, match=gpu_cap.CAP_ENV):
        gpu_cap.shard_memory()


def test_every_kernel_the_chain_starts_runs_the_hook(tmp_path):
    """The profile's env reaches each lab kernel, whose start-up hook (ci/kernel_hooks/sitecustomize.py)
    applies the cap and, at its exit, writes the lab's peaks; the lab itself sees the cap record."""
    labs = tmp_path / "labs"
    body = GOOD.format(name="{name}") + ('\nimport sys\nassert "utils.gpu_cap" in sys.modules, '
                                         '"the kernel hook did not run"')
    make_lab(labs, "01_a", body.replace("{name}", "01_a"))
    make_lab(labs, "02_b", body.replace("{name}", "02_b"))
    peaks = tmp_path / "peaks"
    prof = {"name": "capped", "params": {"size": 7}, "labs": {}, "_path": str(tmp_path / "p.yaml"),
            "env": {gpu_cap.CAP_ENV: "24", gpu_cap.PEAKS_ENV: str(peaks)}}
    chain.run_chain(prof, labs=chain.discover_labs(labs), runs_dir=tmp_path / "runs")
    for lab in ("01_a", "02_b"):
        rec = json.loads((peaks / f"{lab}.json").read_text())
        assert rec["label"] == lab and rec["cap"]["cap_gib"] == 24.0
        assert rec["host_peak_rss_gib"] > 0.01 and rec["kernel_seconds"] >= 0
        import torch
        if not torch.cuda.is_available():
            assert rec["cap"]["applied"] is False and rec["gpu_peak_allocated_gib"] is None


def test_a_kernel_killed_at_shutdown_still_leaves_its_record(tmp_path):
    """A kernel the notebook runner kills (no atexit) keeps the record written while it ran."""
    import os
    import subprocess
    import sys

    lab = tmp_path / "03_x"
    lab.mkdir()
    code = ("import os, time\nfrom utils.gpu_cap import kernel_hook\nkernel_hook(interval_s=0.2)\n"
            "time.sleep(1.2)\nos._exit(0)\n")                       # os._exit: no atexit, as a SIGKILL
    env = {**os.environ, gpu_cap.CAP_ENV: "24", gpu_cap.PEAKS_ENV: str(tmp_path / "peaks"),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    subprocess.run([sys.executable, "-c", code], cwd=lab, env=env, check=True, timeout=60)
    rec = json.loads((tmp_path / "peaks" / "03_x.json").read_text())
    assert rec["label"] == "03_x" and rec["cap"]["cap_gib"] == 24.0
    assert rec["kernel_seconds"] >= 0.6                            # refreshed while it ran, not only at start


def test_final_peaks_are_written_by_a_process_that_skips_its_teardown(tmp_path):
    """A data-parallel worker leaves through os._exit (no atexit): write_final_peaks gives the peaks file its
    last state first, so the run's memory record covers the whole process."""
    import os
    import subprocess
    import sys

    lab = tmp_path / "03_x"
    lab.mkdir()
    code = ("import os, time\nfrom utils import gpu_cap\ngpu_cap.kernel_hook(interval_s=600)\n"
            "time.sleep(1.0)\ngpu_cap.write_final_peaks()\nos._exit(0)\n")
    env = {**os.environ, gpu_cap.CAP_ENV: "24", gpu_cap.PEAKS_ENV: str(tmp_path / "peaks"),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    subprocess.run([sys.executable, "-c", code], cwd=lab, env=env, check=True, timeout=60)
    rec = json.loads((tmp_path / "peaks" / "03_x.json").read_text())
    assert rec["kernel_seconds"] >= 0.9                            # the final write, not the one at start
    gpu_cap.write_final_peaks()                                     # this process never hooked: nothing to write

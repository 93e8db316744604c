import json
import time

from utils import monitor

NVIDIA_SMI = """0, 97, 40213, 81559, 612.33, 63
1, [N/A], 5, 81559, [N/A], 40
"""
ROCM_SMI = json.dumps({"card0": {"GPU use (%)": "88", "VRAM Total Memory (B)": "206141652992",
                                 "VRAM Total Used Memory (B)": "1073741824",
                                 "Average Graphics Package Power (W)": "550.0",
                                 "Temperature (Sensor edge) (C)": "51.0"},
                       "system": {"Driver version": "6.8"}})


def test_parse_nvidia_smi_keeps_unknowns_as_none():
    rows = monitor.parse_nvidia_smi(NVIDIA_SMI)
    assert rows[0] == {"gpu": 0, "util_pct": 97.0, "mem_used_mib": 40213.0, "mem_total_mib": 81559.0,
                       "power_w": 612.33, "temp_c": 63.0}
    assert rows[1]["util_pct"] is None and rows[1]["power_w"] is None


def test_parse_rocm_smi():
    (row,) = monitor.parse_rocm_smi(ROCM_SMI)
    assert row["gpu"] == 0 and row["util_pct"] == 88.0
    assert row["mem_used_mib"] == 1024.0 and row["mem_total_mib"] == 196592.0
    assert row["power_w"] == 550.0 and row["temp_c"] == 51.0
    assert monitor.parse_rocm_smi("not json") == []


def test_no_tool_means_unavailable_not_failure(monkeypatch):
    monkeypatch.setattr(monitor.shutil, "which", lambda name: None)
    mon = monitor.GPUMonitor()
    assert not mon.available and "none of nvidia-smi" in mon.reason
    with mon:
        time.sleep(0.05)
    assert mon.samples == [] and mon.summary()["n_samples"] == 0


def test_background_sampling_builds_a_time_series():
    mon = monitor.GPUMonitor(interval=0.01, tool="nvidia-smi", query=lambda: NVIDIA_SMI)
    with mon:
        time.sleep(0.2)
    assert len(mon.samples) >= 4  # two GPUs per sample, several samples
    ts = [s["t"] for s in mon.samples if s["gpu"] == 0]
    assert ts == sorted(ts) and ts[-1] > ts[0]
    summary = mon.summary()
    assert summary["util_pct_max"] == 97.0 and summary["mem_used_mib_max"] == 40213.0


def test_unparseable_output_is_recorded_as_error():
    mon = monitor.GPUMonitor(tool="musa-smi", query=lambda: "garbage")
    assert mon.sample_once() == []
    assert "could not parse musa-smi" in mon.errors[0]

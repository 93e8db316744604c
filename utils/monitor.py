"""A background GPU monitor: samples nvidia-smi, rocm-smi or musa-smi while a lab works.

Utilisation and memory over time tell a student whether a benchmark really kept the GPU busy
and how close a model came to the card's memory. On a machine with none of those tools the
monitor says so (`available` is False, `reason` says why) and records nothing; it never fails.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from typing import Callable

FIELDS = ("t", "gpu", "util_pct", "mem_used_mib", "mem_total_mib", "power_w", "temp_c")
_NV_QUERY = "index,utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu"
TOOLS = ("nvidia-smi", "rocm-smi", "musa-smi")


def _num(text) -> float | None:
    try:
        return float(str(text).strip().split()[0])
    except (ValueError, IndexError):
        return None  # "[N/A]", "", ... : unknown, not zero


def parse_nvidia_smi(text: str) -> list[dict]:
    """Parse `nvidia-smi --query-gpu=<_NV_QUERY> --format=csv,noheader,nounits` (musa-smi mirrors it)."""
    rows = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 6:
            continue
        idx = _num(parts[0])
        if idx is None:
            continue
        rows.append({"gpu": int(idx), "util_pct": _num(parts[1]), "mem_used_mib": _num(parts[2]),
                     "mem_total_mib": _num(parts[3]), "power_w": _num(parts[4]), "temp_c": _num(parts[5])})
    return rows


def parse_rocm_smi(text: str) -> list[dict]:
    """Parse `rocm-smi --showuse --showmeminfo vram --showpower --showtemp --json`."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return []
    rows = []
    for card, fields in sorted(data.items()):
        if not card.startswith("card") or not isinstance(fields, dict):
            continue

        def pick(*needles):
            for key, val in fields.items():
                if all(n.lower() in key.lower() for n in needles):
                    return _num(val)
            return None

        used, total = pick("vram", "used", "(b)"), pick("vram", "total memory", "(b)")
        rows.append({"gpu": int(card[4:] or 0), "util_pct": pick("gpu use"),
                     "mem_used_mib": used / 2**20 if used is not None else None,
                     "mem_total_mib": total / 2**20 if total is not None else None,
                     "power_w": pick("power"), "temp_c": pick("temperature")})
    return rows


def _command(tool: str) -> list[str]:
    if tool == "rocm-smi":
        return [tool, "--showuse", "--showmeminfo", "vram", "--showpower", "--showtemp", "--json"]
    return [tool, f"--query-gpu={_NV_QUERY}", "--format=csv,noheader,nounits"]


def _parser(tool: str) -> Callable[[str], list[dict]]:
    return parse_rocm_smi if tool == "rocm-smi" else parse_nvidia_smi


def find_tool() -> str | None:
    return next((t for t in TOOLS if shutil.which(t)), None)


class GPUMonitor:
    """Sample the GPU every `interval` s in a thread. Use as a context manager or start()/stop().

    `query` (for tests) replaces running the tool: a callable returning the tool's text output.
    """

    def __init__(self, interval: float = 0.5, tool: str | None = None,
                 query: Callable[[], str] | None = None):
        self.interval = interval
        self.tool = tool or find_tool()
        self.samples: list[dict] = []
        self.errors: list[str] = []
        self._query = query
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    @property
    def available(self) -> bool:
        return self.tool is not None

    @property
    def reason(self) -> str:
        if self.available:
            return f"sampling {self.tool} every {self.interval} s"
        return "no GPU monitor: none of " + ", ".join(TOOLS) + " is on PATH (a CPU-only machine?)"

    def sample_once(self) -> list[dict]:
        if not self.available:
            return []
        try:
            if self._query is not None:
                text = self._query()
            else:
                text = subprocess.run(_command(self.tool), capture_output=True, text=True,
                                      timeout=max(5.0, 4 * self.interval), check=True).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
            return []
        rows = _parser(self.tool)(text)
        if not rows:
            self.errors.append(f"could not parse {self.tool} output: {text[:200]!r}")
        t = time.monotonic() - self._t0
        for row in rows:
            row["t"] = round(t, 3)
        self.samples.extend(rows)
        return rows

    def _loop(self):
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval)

    def start(self) -> "GPUMonitor":
        self._t0 = time.monotonic()
        if self.available and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="gpu-monitor", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> list[dict]:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=10)
            self._thread = None
        return self.samples

    def __enter__(self) -> "GPUMonitor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def summary(self) -> dict:
        """Peak and mean of each field, for results.json."""
        out = {"tool": self.tool, "available": self.available, "reason": self.reason,
               "n_samples": len(self.samples), "errors": self.errors[:5]}
        for key in ("util_pct", "mem_used_mib", "power_w", "temp_c"):
            vals = [s[key] for s in self.samples if s.get(key) is not None]
            if vals:
                out[f"{key}_max"] = max(vals)
                out[f"{key}_mean"] = sum(vals) / len(vals)
        return out


def watch(seconds: float = 30.0, interval: float = 1.0) -> list[dict]:
    """Live view for JupyterLab: redraw utilisation/memory every `interval` s for `seconds` s.

    Run it in one notebook cell while a training or evaluation runs in another process (or a
    terminal); returns the samples. On a machine without a GPU tool it says so and returns [].
    """
    from IPython.display import clear_output, display

    from .plots import plot_monitor

    mon = GPUMonitor(interval=interval)
    if not mon.available:
        print(mon.reason)
        return []
    import matplotlib.pyplot as plt

    mon.start()
    try:
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            time.sleep(interval)
            fig = plot_monitor(list(mon.samples), title=f"live: {mon.tool}")
            clear_output(wait=True)
            if fig is not None:
                display(fig)
                plt.close(fig)
    finally:
        mon.stop()
    return mon.samples

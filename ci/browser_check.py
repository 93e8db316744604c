"""A real browser on a lab: JupyterLab served on 127.0.0.1, Lab 02 opened in headless Chromium, the
bits slider of its quantization explorer moved, and the explorer's output seen to change.

    python -m ci.browser_check                       # screenshots under runs/browser/<timestamp>-check/
    python -m ci.browser_check --out DIR --chromium /usr/bin/chromium

Needs Debian's Chromium and a CJK font (`apt-get install -y chromium fonts-noto-cjk`) and the
playwright package (its own browser download is not used). The lab is a copy of
labs/02_models/02_models.ipynb in the output folder, so the repository's notebook is never saved over;
its interactive run folder goes there too. Only the cells the explorer needs are run (no model is
loaded). Writes check.json (what was seen) and PNG screenshots; exits non-zero if the check fails.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from utils.runs import REPO_ROOT, new_run_dir, runs_root

LAB = "02_models"
# the cells the explorer needs, each found by a line of its code (not by position: cells move)
CELLS = ['golden_model = "fixture"', "quiet_libraries()", "fetch.resolve_model(golden_model",
         "gptq.read_layer(picked", "widgets.quant_explorer("]
CJK_CELL = "静默数据损坏"          # a markdown cell with the report's Chinese terms
SETTINGS = {  # no news popup over the page, every cell in the DOM, never saved back
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                         "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
}


class CheckError(RuntimeError):
    pass


def find_chromium(explicit: str | None = None) -> str | None:
    """The Chromium to drive: --chromium (that one or none), else $CHROMIUM, else chromium on PATH (Debian:
    /usr/bin/chromium)."""
    cands = [explicit] if explicit else [os.environ.get("CHROMIUM"), shutil.which("chromium"), shutil.which("chromium-browser")]
    for cand in cands:
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def missing() -> str | None:
    """Why the check cannot run here (None when it can)."""
    if find_chromium() is None:
        return "no Chromium: apt-get install -y chromium fonts-noto-cjk (or set CHROMIUM to its path)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "no playwright: pip install -r requirements-course.txt"
    return None


def cjk_fonts() -> list[str]:
    """The fonts fontconfig (which Chromium uses) has for Chinese; without one the terms render as boxes."""
    try:
        found = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return sorted({line.split(",")[0].strip() for line in found.splitlines() if line.strip()})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_lab(root: Path, port: int, log: Path) -> subprocess.Popen:
    """JupyterLab on 127.0.0.1:port, token off, serving `root`; its kernels import this checkout's utils."""
    settings = root / ".jupyter-settings"
    for name, value in SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(json.dumps(value))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
               QUANTLAB_RUNS=str(root / "runs"), JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(root / ".jupyter-workspaces"))
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
           "--ServerApp.port_retries=0", "--IdentityProvider.token=", "--ServerApp.password=",
           "--ServerApp.disable_check_xsrf=True", "--ServerApp.allow_root=True", f"--ServerApp.root_dir={root}"]
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=root)


def wait_http(url: str, server: subprocess.Popen, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if server.poll() is not None:
            raise CheckError(f"JupyterLab exited with {server.returncode} before serving {url}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise CheckError(f"JupyterLab did not answer at {url} within {timeout:.0f} s")


def stop_lab(server: subprocess.Popen, base: str) -> None:
    """Ask the server to shut down (its kernels with it), then make sure it is gone."""
    try:
        urllib.request.urlopen(urllib.request.Request(f"{base}/api/shutdown", method="POST"), timeout=10)
        server.wait(timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


# ---------------------------------------------------------------- in the page
CELL_INDEX = """needle => Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell'))
    .findIndex(c => (c.querySelector('.jp-InputArea')?.textContent || '').includes(needle))"""


def cell(page, needle: str):
    i = page.evaluate(CELL_INDEX, needle)
    if i < 0:
        raise CheckError(f"no cell containing {needle!r} in the opened lab")
    return page.locator(".jp-Notebook .jp-Cell").nth(i)


def run_cell(page, needle: str, timeout_s: float) -> str:
    """Select the cell, Shift+Enter, wait for its execution count; return its output text (fails on an error)."""
    c = cell(page, needle)
    c.scroll_into_view_if_needed()
    c.locator(".jp-InputPrompt").first.click()
    page.keyboard.press("Shift+Enter")
    prompt = c.locator(".jp-InputPrompt").first
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        text = prompt.inner_text().strip()
        if text[1:-2].strip().isdigit():            # "[7]:" done; "[*]:" running; "[ ]:" not yet
            break
        page.wait_for_timeout(250)
    else:
        raise CheckError(f"cell {needle!r} did not finish within {timeout_s:.0f} s")
    out = c.locator(".jp-OutputArea").first.inner_text() if c.locator(".jp-OutputArea").count() else ""
    if c.locator("[data-mime-type='application/vnd.jupyter.stderr']").count() and "Traceback" in out:
        raise CheckError(f"cell {needle!r} raised:\n{out[-1500:]}")
    return out


def explorer(page):
    """The explorer widget itself (its cell also holds the static table, taller than the window)."""
    return cell(page, CELLS[-1]).locator(".widget-vbox").last


def explorer_state(page) -> dict:
    c = cell(page, CELLS[-1])
    table = c.locator(".widget-html-content").last
    img = c.locator(".widget-image").last
    return {"table": table.inner_text(), "image_src": img.get_attribute("src") or "",
            "bits": c.locator(".widget-readout").first.inner_text()}


def settled(before: dict, after: dict) -> bool:
    """The slider reads 2 bits and both the table (its RTN row) and the figure show 2 bits, not 4."""
    return (after["bits"].strip() == "2" and "RTN\t2\t" in after["table"] and after["table"] != before["table"]
            and after["image_src"] != before["image_src"])


def move_bits(page, steps: int) -> None:
    """Move the bits slider by keyboard (its handle takes arrow keys), as a student with a keyboard would."""
    c = cell(page, CELLS[-1])
    handle = c.locator(".widget-slider .noUi-handle").first
    handle.focus()
    for _ in range(abs(steps)):
        page.keyboard.press("ArrowRight" if steps > 0 else "ArrowLeft")
        page.wait_for_timeout(150)


def run_check(out: Path, chromium: str, timeout_s: float = 240.0) -> dict:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO_ROOT / "labs" / LAB / f"{LAB}.ipynb", out / f"{LAB}.ipynb")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_lab(out, port, out / "jupyterlab.log")
    seen: dict = {"lab": f"labs/{LAB}/{LAB}.ipynb", "url": f"{base}/lab/tree/{LAB}.ipynb", "chromium": chromium}
    t0 = time.monotonic()
    try:
        wait_http(f"{base}/api/status", server, 90)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000}, locale="en-US")
            page.set_default_timeout(60_000)
            page.goto(seen["url"])
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
            page.wait_for_function("document.querySelector('#jp-main-statusbar')?.innerText.includes('Idle')",
                                   timeout=90_000)
            page.screenshot(path=str(out / "01_opened.png"))
            cjk = cell(page, CJK_CELL)
            cjk.scroll_into_view_if_needed()
            cjk.screenshot(path=str(out / "02_chinese_terms.png"))
            seen["cjk_fonts"] = cjk_fonts()
            seen["cells"] = {n: run_cell(page, n, timeout_s)[-300:] for n in CELLS}
            page.wait_for_selector(".widget-slider .noUi-handle", timeout=30_000)
            page.wait_for_timeout(500)
            before = explorer_state(page)
            explorer(page).screenshot(path=str(out / "03_explorer_4_bits.png"))
            move_bits(page, -2)
            deadline = time.monotonic() + 30           # the kernel recomputes each step: wait for the last
            after = explorer_state(page)
            while not settled(before, after) and time.monotonic() < deadline:
                page.wait_for_timeout(250)
                after = explorer_state(page)
            page.wait_for_timeout(1000)                 # nothing still on its way
            after = explorer_state(page) | {"stable": explorer_state(page) == after}
            explorer(page).screenshot(path=str(out / "04_explorer_2_bits.png"))
            browser.close()
        seen.update(before={k: v for k, v in before.items() if k != "image_src"},
                    after={k: v for k, v in after.items() if k != "image_src"},
                    image_changed=before["image_src"] != after["image_src"], seconds=round(time.monotonic() - t0, 1))
        moved = before["bits"].strip() == "4" and settled(before, after) and after["stable"]
        seen["passed"] = moved and bool(seen["cjk_fonts"])
        if not moved:
            seen["failure"] = "moving the bits slider from 4 to 2 did not change the explorer's table and figure"
        elif not seen["cjk_fonts"]:
            seen["failure"] = "no CJK font: the Chinese terms render as boxes (apt-get install -y fonts-noto-cjk)"
    except Exception as exc:  # noqa: BLE001 - recorded in check.json, then raised
        seen.update(passed=False, failure=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        stop_lab(server, base)
        (out / "check.json").write_text(json.dumps(seen, indent=1, ensure_ascii=False))
    return seen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="where screenshots go (default runs/browser/<timestamp>)")
    ap.add_argument("--chromium", help="path of the Chromium binary (default: chromium on PATH)")
    args = ap.parse_args(argv)
    chromium = find_chromium(args.chromium)
    why = missing() if chromium else f"no Chromium at {args.chromium or 'PATH'}: apt-get install -y chromium fonts-noto-cjk"
    if why:
        print(f"browser check cannot run: {why}", file=sys.stderr)
        return 2
    if args.out and args.out.exists() and any(args.out.iterdir()):
        print(f"--out {args.out} is not empty: give a new folder (earlier screenshots are kept)", file=sys.stderr)
        return 2
    out = args.out or new_run_dir("check", root=runs_root() / "browser")
    try:
        seen = run_check(out, chromium)
    except CheckError as exc:
        print(f"browser check FAILED: {exc}\nscreenshots and check.json in {out}", file=sys.stderr)
        return 1
    print(json.dumps({k: seen.get(k) for k in ("passed", "failure", "before", "after", "cjk_fonts", "seconds")},
                     indent=1, ensure_ascii=False))
    print(f"screenshots and check.json in {out}")
    return 0 if seen["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

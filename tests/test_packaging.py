"""The project installs no top-level package: `utils` and `ci` are generic names that would shadow (or be
shadowed by) another project's in site-packages. The course runs from the repository root instead."""
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_of_the_project_installs_no_module(tmp_path):
    """A wheel built from pyproject.toml beside the real utils/ and ci/ holds metadata only."""
    for name in ("pyproject.toml", "utils", "ci"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q",
                           "-w", "dist"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    names = zipfile.ZipFile(next((tmp_path / "dist").glob("*.whl"))).namelist()
    installed = [n for n in names if ".dist-info/" not in n]
    assert installed == [], f"the wheel would install {installed[:5]} into site-packages"

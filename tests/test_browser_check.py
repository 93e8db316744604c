"""The browser check: Lab 02 in JupyterLab, driven by headless Chromium (python -m ci.browser_check).

It runs wherever Chromium is installed (apt-get install -y chromium fonts-noto-cjk) and is skipped only
where it is not; playwright is in requirements-course.txt, so its absence is a failure, not a skip.
Screenshots are kept with the run artefacts, in a new folder runs/browser/<timestamp>-pytest/ (under
$QUANTLAB_RUNS when set), named in the output (pytest -rA shows it) and in a failure's message.
"""
import pytest

from ci import browser_check


def test_main_names_what_is_missing(tmp_path, capsys):
    assert browser_check.main(["--chromium", str(tmp_path / "no-such-chromium"), "--out", str(tmp_path / "b")]) == 2
    assert "apt-get install -y chromium" in capsys.readouterr().err
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "old.png").write_bytes(b"x")
    if browser_check.find_chromium():
        assert browser_check.main(["--out", str(tmp_path / "b")]) == 2       # earlier screenshots are kept
        assert "not empty" in capsys.readouterr().err


@pytest.mark.skipif(browser_check.find_chromium() is None,
                    reason="no Chromium here: apt-get install -y chromium fonts-noto-cjk")
def test_lab02_explorer_changes_when_its_slider_moves():
    import playwright  # noqa: F401  - pinned in requirements-course.txt: missing is an error, not a skip

    from utils.runs import new_run_dir, runs_root

    out = new_run_dir("pytest", root=runs_root() / "browser")
    seen = browser_check.run_check(out, browser_check.find_chromium())
    print(f"\nbrowser check screenshots: {out}")
    assert seen["passed"], f"{seen.get('failure')} (screenshots in {out})"
    assert seen["before"]["bits"] == "4" and seen["after"]["bits"] == "2"
    assert "RTN\t2\t" in seen["after"]["table"] and "RTN\t4\t" in seen["before"]["table"]
    for shot in ("01_opened.png", "02_chinese_terms.png", "03_explorer_4_bits.png", "04_explorer_2_bits.png"):
        assert (out / shot).stat().st_size > 5_000, shot

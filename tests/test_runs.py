from datetime import datetime

import pytest

from utils import results, runs


def test_new_run_dir_never_reuses(tmp_path):
    now = datetime(2026, 1, 2, 3, 4, 5)
    a = runs.new_run_dir("cpu-tiny", tmp_path, now=now)
    b = runs.new_run_dir("cpu-tiny", tmp_path, now=now)
    assert a.name == "20260102-030405-cpu-tiny"
    assert b.name == "20260102-030405-cpu-tiny-2"
    assert a.is_dir() and b.is_dir()


def test_bad_profile_name(tmp_path):
    with pytest.raises(ValueError, match="profile name"):
        runs.new_run_dir("../evil", tmp_path)


def test_lab_dir_refuses_to_overwrite_results(tmp_path):
    out = runs.lab_dir(tmp_path, "01_env")
    assert (out / "figures").is_dir()
    results.write_results(out, "01_env")
    with pytest.raises(FileExistsError, match="kept"):
        runs.lab_dir(tmp_path, "01_env")


def test_lab_dir_without_run_dir_starts_interactive_run(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTLAB_RUNS", str(tmp_path))
    out = runs.lab_dir("", "01_env")
    assert out.parent.parent == tmp_path
    assert out.parent.name.endswith("-interactive")


def test_find_lab_results_takes_newest_complete(tmp_path):
    old = runs.new_run_dir("p", tmp_path, now=datetime(2026, 1, 1))
    new = runs.new_run_dir("p", tmp_path, now=datetime(2026, 1, 2))
    broken = runs.new_run_dir("p", tmp_path, now=datetime(2026, 1, 3))
    results.write_results(old / "02_models", "02_models", headline={"which": "old"})
    results.write_results(new / "02_models", "02_models", headline={"which": "new"})
    (broken / "02_models").mkdir()
    (broken / "02_models" / "results.json").write_text("{")  # a killed, half-written file
    assert runs.find_lab_results("02_models", root=tmp_path)["headline"]["which"] == "new"
    assert runs.find_lab_results("02_models", run_dir=old)["headline"]["which"] == "old"
    with pytest.raises(results.ResultsError, match="run labs/03_eval first"):
        runs.find_lab_results("03_eval", root=tmp_path)

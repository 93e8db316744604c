import json

import pytest
import torch

from utils import results


def test_write_then_read_roundtrip(tmp_path):
    results.write_results(tmp_path, "01_env", headline={"x": 1.5}, data={"t": torch.tensor(2.0)},
                          verdicts=[{"check": "c", "verdict": "ok", "detail": "d"}])
    back = results.read_results(tmp_path)
    assert back["schema_version"] == results.SCHEMA_VERSION
    assert back["status"] == "complete"
    assert back["headline"] == {"x": 1.5}
    assert back["data"]["t"] == 2.0


def test_nan_is_kept_visible_not_silently_null(tmp_path):
    results.write_results(tmp_path, "lab", headline={"bad": float("nan"), "big": float("inf")})
    text = (tmp_path / "results.json").read_text()
    assert "NaN" not in text  # no bare NaN token: strict JSON readers would choke
    back = results.read_results(tmp_path)
    assert back["headline"] == {"bad": "nan", "big": "inf"}


def test_unknown_verdict_rejected(tmp_path):
    with pytest.raises(results.ResultsError, match="ok/warn/fail/info"):
        results.write_results(tmp_path, "lab", verdicts=[{"check": "c", "verdict": "great"}])
    assert not (tmp_path / "results.json").exists()


def test_failed_write_leaves_old_file_and_no_temp(tmp_path):
    results.write_results(tmp_path, "lab", headline={"v": 1})

    class Unserializable:
        pass

    with pytest.raises(TypeError):
        results.write_results(tmp_path, "lab", headline={"v": Unserializable()})
    assert results.read_results(tmp_path)["headline"] == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


@pytest.mark.parametrize("mutate, message", [
    (lambda p: p.update(schema_version=99), "schema_version 99"),
    (lambda p: p.update(schema="other"), "not a quant-lab results file"),
    (lambda p: p.update(status="running"), "not marked complete"),
])
def test_read_rejects_foreign_or_incomplete(tmp_path, mutate, message):
    results.write_results(tmp_path, "lab")
    payload = json.loads((tmp_path / "results.json").read_text())
    mutate(payload)
    (tmp_path / "results.json").write_text(json.dumps(payload))
    with pytest.raises(results.ResultsError, match=message):
        results.read_results(tmp_path)


def test_read_missing_says_what_to_do(tmp_path):
    with pytest.raises(results.ResultsError, match="run that lab first"):
        results.read_results(tmp_path / "02_models")


def test_read_truncated_json(tmp_path):
    (tmp_path / "results.json").write_text('{"schema": "quant-lab/res')
    with pytest.raises(results.ResultsError, match="not valid JSON"):
        results.read_results(tmp_path)


def test_jsonl_round_trip_keeps_only_the_asked_keys(tmp_path):
    recs = [{"question": "q1", "answer": "a #### 1", "extra": 1}, {"question": "Ünï", "answer": "#### 2"}]
    path = results.write_jsonl(recs, tmp_path / "d.jsonl", keys=("question", "answer"))
    assert results.read_jsonl(path) == [{"question": r["question"], "answer": r["answer"]} for r in recs]
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically, no temporary left


def test_read_jsonl_names_the_file_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2\n')
    with pytest.raises(ValueError, match=r"d.jsonl line 3 is not JSON"):
        results.read_jsonl(path)
    path.write_text('{"a": 1}\n[1]\n')
    with pytest.raises(ValueError, match=r"d.jsonl line 2 is not a JSON object"):
        results.read_jsonl(path)
    with pytest.raises(ValueError, match=r"d.jsonl line 1 has no b"):
        results.read_jsonl(path, check=lambda r: None if "b" in r else "has no b")


def test_jsonl_data_errors_name_the_file_and_line(tmp_path):
    """Bad bytes, bad JSON, a record that fails its check: each names the file and the line."""
    from bad_input_table import record

    p = tmp_path / "test.jsonl"
    cases = [(b'{"q": 1}\n{"q": 2}\n{"q": "caf\xe9"}\n', "line 3", "a jsonl line that is not UTF-8"),
             (b'{"q": 1}\n{"q": \n', "line 2", "a jsonl line cut short"),
             (b'{"q": 1}\n[1, 2]\n', "line 2", "a jsonl line that is not an object")]
    for raw, where, case in cases:
        p.write_bytes(raw)
        with pytest.raises(ValueError) as err:
            results.read_jsonl(p)
        record("data file", case, str(err.value))
        assert str(p) in str(err.value) and where in str(err.value), str(err.value)


def test_a_truncated_results_file_names_its_line_and_what_to_do(tmp_path):
    from bad_input_table import record

    results.write_results(tmp_path, "01_env", headline={"x": 1})
    p = tmp_path / "results.json"
    p.write_text(p.read_text()[:80])
    with pytest.raises(results.ResultsError) as err:
        results.read_results(tmp_path)
    record("results file", "a truncated results.json", str(err.value))
    assert str(p) in str(err.value) and "line" in str(err.value) and "rerun" in str(err.value)

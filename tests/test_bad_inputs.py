"""Bad inputs end in a message naming the parameter or file and what to do, never in a run marked complete."""
import json
import shutil

import pytest
import yaml

from ci import run as chain
from utils import evaluation, fetch, models, reporting, results, runs
from utils.fixture import fixture_paths

GOLDEN = fixture_paths()["golden"]


def _runs(root):
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


# --resume of a run folder that is not there -------------------------------------------------------

@pytest.mark.parametrize("extra", [[], ["--from", "03_eval"], ["--profile", "cpu-tiny", "--from", "03_eval"]])
def test_resume_of_a_missing_run_folder_says_so_and_runs_nothing(tmp_path, capsys, extra):
    missing = tmp_path / "runs" / "20990101-000000-cpu-tiny"
    rc = chain.main(["--resume", str(missing), "--runs-dir", str(tmp_path / "runs"), *extra])
    err = capsys.readouterr().err
    assert rc == 1
    assert f"--resume {missing}: no such run folder" in err and "nothing was run" in err
    assert _runs(tmp_path / "runs") == []  # no run folder was made, so none is marked anything


def test_resume_of_a_folder_without_run_json(tmp_path, capsys):
    (tmp_path / "not-a-run").mkdir()
    assert chain.main(["--resume", str(tmp_path / "not-a-run"), "--from", "03_eval"]) == 1
    assert "no readable run.json" in capsys.readouterr().err


# the printed resume command works when the profile was a YAML path -------------------------------

def test_resume_command_keeps_a_yaml_profile_path(tmp_path, monkeypatch):
    prof = tmp_path / "elsewhere" / "mine.yaml"
    prof.parent.mkdir()
    prof.write_text(yaml.safe_dump({"name": "mine", "params": {}, "labs": {}}))
    loaded = chain.load_profile(str(prof))
    assert loaded["_path"] == str(prof.resolve())
    cmd = chain.resume_command(loaded, tmp_path / "runs" / "r1", "03_eval")
    assert f"--profile {prof.resolve()}" in cmd and "--from 03_eval" in cmd
    # a shipped profile needs no --profile: run.json's name finds it
    assert "--profile" not in chain.resume_command(chain.load_profile("cpu-tiny"), tmp_path, "03_eval")

    # and --resume alone (no --profile) finds the YAML file the earlier run was made with
    earlier = tmp_path / "runs" / "r1"
    earlier.mkdir(parents=True)
    (earlier / "run.json").write_text(json.dumps({"profile": "mine", "profile_file": str(prof.resolve())}))
    seen = {}
    monkeypatch.setattr(chain, "run_chain", lambda profile, **kw: seen.update(profile=profile) or earlier)
    assert chain.main(["--resume", str(earlier), "--from", "03_eval"]) == 0
    assert seen["profile"]["name"] == "mine" and seen["profile"]["_path"] == str(prof.resolve())


def test_failed_lab_prints_a_resume_command_with_the_profile_file(tmp_path):
    from test_chain import make_lab

    labs = tmp_path / "labs"
    make_lab(labs, "01_a", 'raise ValueError("planted")')
    profile = {"name": "mine", "params": {}, "labs": {}, "_path": str(tmp_path / "mine.yaml")}
    (tmp_path / "mine.yaml").write_text("name: mine\nparams: {}\nlabs: {}\n")
    with pytest.raises(chain.ChainError) as err:
        chain.run_chain(profile, labs=chain.discover_labs(labs), runs_dir=tmp_path / "runs")
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert (f"fix it, then: python -m ci.run --profile {tmp_path / 'mine.yaml'} --resume {run_dir} "
            f"--from 01_a --runs-dir {tmp_path / 'runs'}") in str(err.value)


# a runs directory that cannot be written ----------------------------------------------------------

def test_unwritable_runs_dir_names_runs_dir_and_what_to_do(tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert chain.main(["--profile", "cpu-tiny", "--runs-dir", str(blocker / "runs")]) == 1
    err = capsys.readouterr().err
    assert "--runs-dir" in err and "give a writable folder" in err and "Traceback" not in err

    def denied(self, *a, **k):  # a read-only mount (the tests may run as root, where chmod does not bite)
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(runs.Path, "mkdir", denied)
    with pytest.raises(runs.RunsDirError, match="Permission denied.*give a writable folder"):
        runs.new_run_dir("cpu-tiny", tmp_path / "ro")


# golden_model / int4_model that look like paths -------------------------------------------------

@pytest.mark.parametrize("spec", ["./no/such/model", "../models/qwen", "/no/such/folder", "~/no-such-model",
                                  "data/models/Qwen2.5-7B"])
def test_a_path_that_does_not_exist_is_not_taken_for_a_modelscope_id(tmp_path, spec):
    for fallback in (False, True):  # a typo in a path is no reason to fall back silently
        with pytest.raises(fetch.FetchError, match=r"golden_model: the folder .* does not exist"):
            fetch.resolve_model(spec, "golden", offline=True, cache_dir=tmp_path, fixture_fallback=fallback)
    assert fetch.looks_like_path(spec)
    assert not fetch.looks_like_path("Qwen/Qwen2.5-7B-Instruct")


def test_a_file_given_as_model_folder(tmp_path):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"x")
    with pytest.raises(fetch.FetchError, match="int4_model: the folder .* is a file, not a folder"):
        fetch.resolve_model(str(f), "int4", offline=True, cache_dir=tmp_path)


# a truncated model.safetensors --------------------------------------------------------------------

@pytest.fixture
def truncated(tmp_path):
    folder = tmp_path / "bf16"
    shutil.copytree(GOLDEN, folder)
    weights = folder / "model.safetensors"
    with open(weights, "r+b") as fh:
        fh.truncate(weights.stat().st_size // 2)
    return folder


def test_truncated_weights_name_file_parameter_and_what_to_do(truncated, tmp_path):
    msg = r"golden_model: .*model.safetensors is truncated: \d+ bytes, its header needs \d+.*delete the folder"
    with pytest.raises(fetch.FetchError, match=msg):
        fetch.resolve_model(str(truncated), "golden", offline=True, cache_dir=tmp_path)
    with pytest.raises(fetch.FetchError, match=msg):
        models.load_model(truncated, param="golden_model")
    with pytest.raises(evaluation.EvalInputError, match=r"golden_model \(Lab 02\): .*is truncated"):
        evaluation.model_args(str(truncated), param="golden_model (Lab 02)")
    assert fetch.weight_file_problems(GOLDEN) == []


def test_manifest_compares_sizes_even_without_hashes(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(GOLDEN, folder)
    fetch.write_manifest(folder)
    assert fetch.verify_manifest(folder, fetch.manifest(folder, hashes=False))["ok"]  # unchanged: no false alarm
    with open(folder / "model.safetensors", "r+b") as fh:
        fh.truncate(1000)
    check = fetch.verify_manifest(folder, fetch.manifest(folder, hashes=False))
    assert not check["ok"] and check["changed"] == ["model.safetensors"]


# fixture_fallback is loud ---------------------------------------------------------------------------

def _fallback_pair(tmp_path):
    common = dict(offline=True, cache_dir=tmp_path / "cache", fixture_fallback=True)
    return {"golden": fetch.resolve_model("Qwen/Qwen2.5-7B-Instruct", "golden", **common),
            "int4": fetch.resolve_model("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4", "int4", **common)}


def test_fallback_is_recorded_and_named(tmp_path):
    picked = _fallback_pair(tmp_path)
    assert fetch.fallbacks(picked) == ["golden", "int4"]
    line = fetch.models_summary(picked)
    assert "golden: FIXTURE tiny-qwen2-gsm/bf16 instead of Qwen/Qwen2.5-7B-Instruct" in line
    assert "int4: FIXTURE tiny-qwen2-gsm/gptq-int4 instead of Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4" in line
    honest = {"golden": fetch.resolve_model("fixture", "golden", offline=True)}
    assert fetch.fallbacks(honest) == [] and fetch.models_summary(honest) == "golden: fixture tiny-qwen2-gsm/bf16"
    assert fetch.fallback_warning({"data": {"models": picked}}).endswith(line)
    assert fetch.fallback_warning({"data": {"models": honest}}) == fetch.fallback_warning(None) == ""


def test_fallback_is_printed_by_the_chain_and_heads_the_report(tmp_path):
    from test_chain import make_lab

    picked = _fallback_pair(tmp_path)
    labs = tmp_path / "labs"
    make_lab(labs, "02_models", "from utils import results, runs\n"
             f"results.write_results(runs.lab_dir(run_dir, '02_models'), '02_models', data={{'models': {picked!r}}})")
    printed = []
    run_dir = chain.run_chain({"name": "t", "params": {}, "labs": {}, "_path": "t.yaml"},
                              labs=chain.discover_labs(labs), runs_dir=tmp_path / "runs", log=printed.append)
    assert any(line.startswith("[02_models] WARNING: models fell back") for line in printed)
    assert printed[-1].startswith("WARNING: 02_models: models fell back")  # again at the very end
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["status"] == "complete" and "Qwen/Qwen2.5-7B-Instruct" in manifest["warnings"][0]
    head = (run_dir / "report.md").read_text().splitlines()[:8]
    assert any("WARNING: 02_models: models fell back" in line and "instead of Qwen/Qwen2.5-7B-Instruct" in line
               for line in head), head
    assert "WARNING" in (run_dir / "report.html").read_text()
    # a run without a fallback says nothing of the kind
    results.write_results(tmp_path / "x" / "02_models", "02_models",
                          data={"models": {"golden": fetch.resolve_model("fixture", "golden", offline=True)}})
    reporting.build_report(tmp_path / "x")
    assert "WARNING" not in (tmp_path / "x" / "report.md").read_text()


# Lab 02's gsm8k_dir gets Lab 03's line-by-line check ---------------------------------------------

def test_lab02_names_gsm8k_dir_file_and_line_of_a_malformed_jsonl(tmp_path):
    import papermill

    from utils.runs import REPO_ROOT

    data = tmp_path / "gsm8k"
    data.mkdir()
    shutil.copy(fixture_paths()["train"], data / "train.jsonl")
    (data / "test.jsonl").write_text('{"question": "q?", "answer": "#### 1"}\n{"question": "no answer"}\n')
    nb = REPO_ROOT / "labs" / "02_models" / "02_models.ipynb"
    with pytest.raises(papermill.PapermillExecutionError) as err:
        papermill.execute_notebook(str(nb), str(tmp_path / "out.ipynb"), cwd=str(nb.parent), progress_bar=False,
                                   kernel_name="python3",
                                   parameters={"run_dir": str(tmp_path / "run"), "device": "cpu", "gsm8k_dir": str(data),
                                               "hash_files": False, "check_layers": 1, "n_problems": 1})
    assert err.value.ename == "EvalInputError"
    assert f"gsm8k_dir: {data / 'test.jsonl'} line 2 is not a GSM8K record" in err.value.evalue
    assert not (tmp_path / "run" / "02_models" / "results.json").exists()

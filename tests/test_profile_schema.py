"""A profile is validated before anything runs: every error names the file, the key, what was expected and an
example, and no run folder is made. The lab sections' schemas come from the labs' parameters cells."""
import papermill
import pytest
import yaml

from bad_input_table import record
from ci import run as chain

CPU_TINY = yaml.safe_load((chain.PROFILES_DIR / "cpu-tiny.yaml").read_text())


@pytest.fixture
def nothing_runs(monkeypatch):
    """A profile error must stop the chain before papermill runs anything."""
    def ran(*a, **k):
        raise AssertionError("a notebook was executed for a profile that should have been refused")
    monkeypatch.setattr(papermill, "execute_notebook", ran)


def refused(tmp_path, capsys, text, case, *expected):
    """Run the chain with profile `text`; return the message after checking the common promises."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    runs = tmp_path / "runs"
    rc = chain.main(["--profile", str(path), "--runs-dir", str(runs)])
    err = capsys.readouterr().err
    record("profile", case, err)
    assert rc == 1, err
    assert "Traceback" not in err
    assert str(path) in err, err                      # names the file
    for part in expected:
        assert part in err, f"{part!r} not in: {err}"
    assert not runs.exists() or not any(runs.iterdir()), "a run folder was left behind"
    return err


def variant(edit):
    """cpu-tiny with one edit, as YAML text."""
    prof = yaml.safe_load(yaml.safe_dump(CPU_TINY))
    edit(prof)
    return yaml.safe_dump(prof, sort_keys=False)


@pytest.mark.parametrize("text, case, expected", [
    ("name: x\nparams: [1, 2\nlabs: {}\n", "not valid YAML (an unclosed list)", ["not valid YAML", "line"]),
    ("- name: x\n- params: {}\n", "a YAML list instead of a mapping", ["a mapping", "e.g.", "name:"]),
    ("just some words\n", "a YAML string instead of a mapping", ["a mapping", "e.g."]),
    ("", "an empty file", ["name", "e.g."]),
])
def test_a_profile_that_is_not_a_mapping(tmp_path, capsys, nothing_runs, text, case, expected):
    refused(tmp_path, capsys, text, case, *expected)


@pytest.mark.parametrize("edit, case, expected", [
    (lambda p: p.update(labs=[{"01_env": {}}]), "labs: as a list", ["labs", "expected", "e.g."]),
    (lambda p: p.update(env=["TRITON_INTERPRET=1"]), "env: as a list", ["env", "expected", "e.g."]),
    (lambda p: p.update(params="device=cpu"), "params: as a string", ["params", "expected", "e.g."]),
    (lambda p: p["labs"].update({"01_env": [512]}), "a lab section that is a list",
     ["labs.01_env", "expected", "e.g."]),
    (lambda p: p["env"].update(TRITON_INTERPRET=True), "an env value that YAML reads as a boolean",
     ["env.TRITON_INTERPRET", "expected", "e.g."]),
    (lambda p: p["env"].update(PATHS={"a": 1}), "an env value that is a mapping", ["env.PATHS", "expected"]),
    (lambda p: p.update(name="my/profile"), "a name with a slash", ["name", "expected", "e.g."]),
    (lambda p: p.pop("name"), "no name", ["name", "e.g."]),
    (lambda p: p.update(cell_timeout_s=-5), "a negative cell_timeout_s", ["cell_timeout_s", "expected", "e.g."]),
    (lambda p: p.update(skip="01_env"), "skip: as a string", ["skip", "expected", "e.g."]),
])
def test_a_section_of_the_wrong_shape_is_named(tmp_path, capsys, nothing_runs, edit, case, expected):
    refused(tmp_path, capsys, variant(edit), case, *expected)


def test_a_misspelt_top_level_key_is_an_error_with_a_suggestion(tmp_path, capsys, nothing_runs):
    err = refused(tmp_path, capsys, variant(lambda p: p.update(cell_timeout=600)),
                  "a misspelt top-level key (cell_timeout)", "cell_timeout", "did you mean 'cell_timeout_s'")
    assert "e.g." in err


def test_a_misspelt_lab_key_and_lab_name(tmp_path, capsys, nothing_runs):
    refused(tmp_path, capsys, variant(lambda p: p["labs"]["03_eval"].update(max_gen_tok=64)),
            "a misspelt lab parameter (max_gen_tok)", "labs.03_eval.max_gen_tok", "did you mean 'max_gen_toks'")
    refused(tmp_path, capsys, variant(lambda p: p["labs"].update({"03_evals": {}})),
            "a misspelt lab name (03_evals)", "03_evals", "did you mean '03_eval'")
    refused(tmp_path, capsys, variant(lambda p: p["params"].update(batchsize=8)),
            "a misspelt common parameter (batchsize)", "params.batchsize", "did you mean 'batch_size'")


@pytest.mark.parametrize("where, key, value, case", [
    ("params", "gsm8k_limit", "1e3", "params gsm8k_limit: 1e3 (YAML reads it as text)"),
    ("01_env", "matmul_n", "1e3", "a lab's matmul_n: 1e3 (YAML reads it as text)"),
    ("04_divergence", "cos_threshold", "5e-1", "cos_threshold: 5e-1 (YAML reads it as text)"),
])
def test_yaml_exponent_text_is_named_with_the_number_to_write(tmp_path, capsys, nothing_runs, where, key,
                                                               value, case):
    def put(p):
        (p["params"] if where == "params" else p["labs"][where])[key] = value
    text = variant(put).replace(f"'{value}'", value)                  # unquoted, as a user types it
    loaded = yaml.safe_load(text)
    assert (loaded["params"] if where == "params" else loaded["labs"][where])[key] == value  # text to YAML
    err = refused(tmp_path, capsys, text, case, key, value, "expected", "e.g.")
    assert "YAML" in err and "torch" not in err


@pytest.mark.parametrize("edit, case, key", [
    (lambda p: p["params"].update(batch_size=-4), "a negative batch_size in params", "params.batch_size"),
    (lambda p: p["params"].update(batch_size=0), "batch_size 0 in params", "params.batch_size"),
    (lambda p: p["labs"]["03_eval"].update(batch_size="big"), "batch_size 'big' in a lab",
     "labs.03_eval.batch_size"),
    (lambda p: p["labs"]["03_eval"].update(batch_size=2.5), "batch_size 2.5 in a lab", "labs.03_eval.batch_size"),
    (lambda p: p["labs"]["01_env"].update(repeats=0), "repeats 0", "labs.01_env.repeats"),
    (lambda p: p["labs"]["01_env"].update(matmul_n="512"), "matmul_n as quoted text", "labs.01_env.matmul_n"),
    (lambda p: p["labs"]["05_kernels"].update(k_sweep=[64, "x"]), "a k_sweep entry that is text",
     "labs.05_kernels.k_sweep"),
    (lambda p: p["labs"]["03_eval"].update(decode="fast"), "decode: fast (not a decode mode)",
     "labs.03_eval.decode"),
    (lambda p: p["params"].update(offline="no"), "offline as text", "params.offline"),
    (lambda p: p["labs"]["04_divergence"].update(cos_threshold=1.5), "cos_threshold above 1",
     "labs.04_divergence.cos_threshold"),
    (lambda p: p["labs"]["02_models"].update(n_problems=None), "n_problems: null", "labs.02_models.n_problems"),
    (lambda p: p["labs"]["04_divergence"].update(cos_threshold=float("nan")), "cos_threshold: .nan",
     "labs.04_divergence.cos_threshold"),
    (lambda p: p["labs"]["01_env"].update(watch_seconds=float("inf")), "watch_seconds: .inf",
     "labs.01_env.watch_seconds"),
    (lambda p: p["labs"]["03_eval"].update(card_bandwidth_gbps=float("nan")), "card_bandwidth_gbps: .nan",
     "labs.03_eval.card_bandwidth_gbps"),
    (lambda p: p.update(cell_timeout_s=float("inf")), "cell_timeout_s: .inf", "cell_timeout_s"),
    (lambda p: p.update(kernel=""), "kernel: '' (empty)", "kernel"),
    (lambda p: p["labs"]["01_env"].update(matmul_n=512.0), "matmul_n: 512.0 (a float)", "labs.01_env.matmul_n"),
    (lambda p: p["labs"]["03_eval"].update(gpus=2.0), "gpus: 2.0 (a float)", "labs.03_eval.gpus"),
    (lambda p: p["labs"]["05_kernels"].update(k_sweep=[64.0, 256]), "a k_sweep entry 64.0 (a float)",
     "labs.05_kernels.k_sweep"),
    (lambda p: p["labs"]["05_kernels"].update(k_sweep=[]), "k_sweep: [] (an empty list)", "labs.05_kernels.k_sweep"),
    (lambda p: p["labs"]["04_divergence"].update(capture_dtypes=["float64"]), "capture_dtypes: [float64]",
     "labs.04_divergence.capture_dtypes"),
])
def test_a_bad_value_is_blamed_on_its_key(tmp_path, capsys, nothing_runs, edit, case, key):
    err = refused(tmp_path, capsys, variant(edit), case, key, "expected", "e.g.")
    assert "model" not in err.split(key)[0], err       # the key is named first, not a model


def test_run_dir_and_profile_are_set_by_the_runner(tmp_path, capsys, nothing_runs):
    refused(tmp_path, capsys, variant(lambda p: p["labs"]["01_env"].update(run_dir="/tmp/x")),
            "run_dir set in a profile", "labs.01_env.run_dir", "set by ci.run")


def test_errors_are_listed_together_with_their_lines(tmp_path, capsys, nothing_runs):
    def two(p):
        p["params"]["batch_size"] = -1
        p["labs"]["01_env"]["repeats"] = "many"
    err = refused(tmp_path, capsys, variant(two), "two bad values at once", "params.batch_size",
                  "labs.01_env.repeats")
    assert "line" in err


def test_the_shipped_profiles_and_lab_defaults_validate(tmp_path):
    """The schema derived from the notebooks accepts every shipped profile and every notebook's own defaults."""
    from ci import profile_schema

    labs = chain.discover_labs()
    for p in sorted(chain.PROFILES_DIR.glob("*.yaml")):
        profile_schema.validate_profile(chain.load_profile(str(p)), labs)
    for lab, nb in labs.items():
        params = profile_schema.lab_params(nb)
        defaults = {k: v["default"] for k, v in params.items() if k not in ("run_dir", "profile")}
        profile_schema.validate_profile({"name": "defaults", "params": {}, "labs": {lab: defaults},
                                         "_path": str(tmp_path / "d.yaml")}, labs)
    # and the schema has ranges where a type alone is not enough
    spec = profile_schema.lab_params(labs["03_eval"])["batch_size"]["spec"]
    assert "int at least 1" in spec and '"auto"' in spec

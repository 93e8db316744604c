"""The papermill chain: order, parameters, the failure path, never overwriting, resume."""
import glob
import json
import os
import tempfile

import nbformat
import pytest

from ci import run as chain
from utils import results

PARAMS = 'run_dir = ""\nprofile = ""\nsize = 1\n'


def make_lab(labs_dir, name, body):
    folder = labs_dir / name
    folder.mkdir(parents=True)
    cells = [nbformat.v4.new_markdown_cell(f"# {name}"),
             nbformat.v4.new_code_cell(PARAMS), nbformat.v4.new_code_cell(body)]
    cells[1].metadata["tags"] = ["parameters"]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / f"{name}.ipynb")


GOOD = ('from utils import results, runs\n'
        'out = runs.lab_dir(run_dir, "{name}")\n'
        'results.write_results(out, "{name}", headline={{"size": size, "profile": profile}})')


@pytest.fixture
def labs(tmp_path):
    labs_dir = tmp_path / "labs"
    make_lab(labs_dir, "01_a", GOOD.format(name="01_a"))
    make_lab(labs_dir, "02_b", GOOD.format(name="02_b") + '\nfrom utils import runs as r\n'
             'assert r.find_lab_results("01_a", run_dir)["headline"]["size"] == 7')
    return labs_dir


def profile(tmp_path, **labs):
    return {"name": "test", "params": {"size": 7}, "labs": labs or {"01_a": {}},
            "_path": str(tmp_path / "test.yaml")}


def test_chain_runs_in_order_and_writes_report(tmp_path, labs):
    run_dir = chain.run_chain(profile(tmp_path), labs=chain.discover_labs(labs), runs_dir=tmp_path / "runs")
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["status"] == "complete"
    assert [e["lab"] for e in manifest["labs"]] == ["01_a", "02_b"]
    assert results.read_results(run_dir / "02_b")["headline"] == {"size": 7, "profile": "test"}
    assert (run_dir / "01_a" / "01_a.ipynb").is_file()  # the executed notebook is kept
    assert "02_b" in (run_dir / "report.md").read_text()
    assert (run_dir / "report.html").is_file()
    # a second run is a new folder: the first is untouched
    again = chain.run_chain(profile(tmp_path), labs=chain.discover_labs(labs), runs_dir=tmp_path / "runs")
    assert again != run_dir and json.loads((run_dir / "run.json").read_text()) == manifest


@pytest.mark.skipif(os.name != "posix", reason="IPC sockets are Unix-only; elsewhere the chain keeps TCP")
def test_chain_kernels_talk_over_ipc_and_leave_no_sockets(tmp_path, labs, capfd, monkeypatch):
    """ipykernel 7 warns on every TCP start that the traffic is unencrypted: the chain's kernels use IPC,
    and their socket files go when the kernel does."""
    private = tempfile.mkdtemp()        # the sockets go here, apart from other runs' kernels in /tmp
    monkeypatch.setattr(tempfile, "tempdir", private)
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "quant-lab-kernel-*")))
    assert before == set()
    run_dir = chain.run_chain(profile(tmp_path), labs=chain.discover_labs(labs), runs_dir=tmp_path / "runs")
    assert json.loads((run_dir / "run.json").read_text())["status"] == "complete"
    err = capfd.readouterr().err
    assert "without encryption" not in err, err
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "quant-lab-kernel-*"))) == before
    assert chain.kernel_manager_class()().transport == "ipc"
    monkeypatch.undo()
    os.rmdir(private)


def test_failing_notebook_stops_chain_naming_notebook_and_cell(tmp_path, labs):
    (labs / "02_b" / "02_b.ipynb").unlink()
    (labs / "02_b").rmdir()
    make_lab(labs, "02_b", 'raise ValueError("planted failure")')
    make_lab(labs, "03_c", GOOD.format(name="03_c"))
    with pytest.raises(chain.ChainError) as err:
        chain.run_chain(profile(tmp_path), labs=chain.discover_labs(labs), runs_dir=tmp_path / "runs")
    msg = str(err.value)
    assert "02_b.ipynb" in msg and "cell" in msg and "ValueError: planted failure" in msg
    (run_dir,) = (tmp_path / "runs").iterdir()
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["status"] == "failed"
    assert manifest["failure"]["lab"] == "02_b" and manifest["failure"]["ename"] == "ValueError"
    assert manifest["failure"]["cell"] not in ("?", "-")
    assert [(e["lab"], e["status"]) for e in manifest["labs"]] == [("01_a", "complete"), ("02_b", "failed")]
    kept = nbformat.read(run_dir / "02_b" / "02_b.ipynb", as_version=4)
    assert any(o.get("ename") == "ValueError" for c in kept.cells for o in c.get("outputs", []))
    assert not (run_dir / "03_c").exists()  # the chain stopped
    assert "FAILED" in (run_dir / "report.md").read_text()

    # fix the lab, resume from it: a new run reuses 01_a's results, runs 02_b and 03_c
    (labs / "02_b" / "02_b.ipynb").unlink()
    (labs / "02_b").rmdir()
    make_lab(labs, "02_b", GOOD.format(name="02_b"))
    resumed = chain.run_chain(profile(tmp_path), labs=chain.discover_labs(labs), start_from="02_b",
                              resume_from=run_dir, runs_dir=tmp_path / "runs")
    m2 = json.loads((resumed / "run.json").read_text())
    assert m2["status"] == "complete" and m2["resumed_from"] == str(run_dir)
    assert [(e["lab"], e["status"]) for e in m2["labs"]] == [("01_a", "reused"), ("02_b", "complete"),
                                                             ("03_c", "complete")]
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"  # the old run is kept


def test_notebook_without_results_fails_the_chain(tmp_path, labs):
    make_lab(labs, "03_c", "x = 1  # forgets to write results")
    with pytest.raises(chain.ChainError, match="03_c.*no results.json"):
        chain.run_chain(profile(tmp_path), labs=chain.discover_labs(labs), runs_dir=tmp_path / "runs")


def test_profile_errors_are_caught_before_damage(tmp_path, labs):
    with pytest.raises(chain.ChainError, match="does not declare"):
        chain.run_chain(profile(tmp_path, **{"01_a": {"typo_param": 1}}), labs=chain.discover_labs(labs),
                        runs_dir=tmp_path / "runs")
    with pytest.raises(chain.ChainError, match="no notebook"):
        chain.run_chain(profile(tmp_path, **{"09_x": {}}), labs=chain.discover_labs(labs),
                        runs_dir=tmp_path / "runs")
    with pytest.raises(chain.ChainError, match="not a lab"):
        chain.run_chain(profile(tmp_path), labs=chain.discover_labs(labs), start_from="07_z",
                        runs_dir=tmp_path / "runs")
    with pytest.raises(chain.ChainError, match="not found"):
        chain.load_profile("no-such-profile")


def test_a_common_param_no_lab_declares_is_an_error_naming_it(tmp_path, labs):
    """A profile's params key that no notebook reads would be dropped without a word: refuse it, before
    any run folder is made. A key that only some labs declare goes to those labs only."""
    prof = profile(tmp_path)
    prof["params"]["rocm_safe_kernelz"] = True
    with pytest.raises(chain.ChainError, match=r"params.rocm_safe_kernelz: not a parameter any lab of the chain"):
        chain.run_chain(prof, labs=chain.discover_labs(labs), runs_dir=tmp_path / "runs")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    make_lab(labs, "03_c", GOOD.format(name="03_c").replace('profile}', 'profile, "only_here": only_here}'))
    nb = labs / "03_c" / "03_c.ipynb"
    book = nbformat.read(nb, as_version=4)
    book.cells[1].source += "only_here = 0\n"
    nbformat.write(book, nb)
    prof = profile(tmp_path)
    prof["params"]["only_here"] = 5
    run_dir = chain.run_chain(prof, labs=chain.discover_labs(labs), runs_dir=tmp_path / "runs")
    assert results.read_results(run_dir / "03_c")["headline"]["only_here"] == 5
    assert chain.lab_parameters(prof, "01_a", labs / "01_a" / "01_a.ipynb", run_dir).get("only_here") is None


def test_shipped_profiles_match_the_shipped_notebooks(tmp_path):
    labs = chain.discover_labs()
    assert "01_env" in labs
    for name in ("cpu-tiny", "rtx4090", "rocm", "h200", "rehearsal-7b"):
        prof = chain.load_profile(name)
        chain.check_profile(prof, labs)                 # the whole profile against the labs' parameters cells
        for lab in prof["labs"]:
            assert lab in labs, f"{name} names {lab}"
            chain.lab_parameters(prof, lab, labs[lab], tmp_path)  # raises on undeclared parameters


def test_cli_list(capsys):
    assert chain.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "01_env" in out and "cpu-tiny" in out


def test_embedded_default_chain_end_to_end(tmp_path):
    """The README's main job: the cpu-tiny chain over the real labs, offline, on CPU."""
    assert chain.main(["--profile", "cpu-tiny", "--runs-dir", str(tmp_path)]) == 0
    (run_dir,) = tmp_path.iterdir()
    env = results.read_results(run_dir / "01_env")
    assert env["platform"]["backend"] in ("cpu", "cuda", "rocm", "musa", "xpu", "mps")
    assert env["data"]["ceilings"]["bandwidth_gbps"] > 0
    assert all(c["status"] != "FAIL" for c in env["data"]["correctness"])
    report = (run_dir / "report.md").read_text()
    assert "copy GB/s" in report and "matmul fp32" in report


def test_strip_progress_bars_keeps_every_other_output(tmp_path):
    """Saved tqdm bars (a stateless widget, stderr updates) go; text, tables and warnings stay."""
    out = nbformat.v4.new_output
    widget = {"application/vnd.jupyter.widget-view+json": {"model_id": "x", "version_major": 2, "version_minor": 0}}
    outputs = [
        out("display_data", data={**widget, "text/plain": "Loading weights:   0%|          | 0/74 [00:00<?, ?it/s]"}),
        out("stream", name="stderr",
            text="\rRunning generate_until requests:  18%|█▊        | 9/50 [00:02<00:10,  3.94it/s]"),
        out("stream", name="stderr", text="\n"),
        out("display_data", data={**widget,
                                  "text/plain": "Generating train split: 0 examples [00:00, ? examples/s]"}),
        out("stream", name="stderr", text="UserWarning: fp16 overflowed\n"),            # a real warning: kept
        out("stream", name="stderr",                                                       # mixed: kept
            text="\r 50%|█████     | 1/2 [00:01<00:01]\nTraceback: boom\n"),
        out("display_data", data={**widget, "text/plain": "HBox(children=(Button(),))"}),  # not a bar: kept
        out("stream", name="stdout", text="accuracy 0.94\n"),
        out("execute_result", data={"text/plain": "   case  status\n0  fp16     ran"}, execution_count=1),
    ]
    cell = nbformat.v4.new_code_cell("x = 1")
    cell.outputs = outputs
    path = tmp_path / "lab.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# lab"), cell]), path)
    assert chain.strip_progress_bars(path) == 4
    kept = nbformat.read(path, as_version=4).cells[1].outputs
    assert [o.get("text") or o["data"]["text/plain"] for o in kept] == [
        "UserWarning: fp16 overflowed\n", "\r 50%|█████     | 1/2 [00:01<00:01]\nTraceback: boom\n",
        "HBox(children=(Button(),))", "accuracy 0.94\n", "   case  status\n0  fp16     ran"]
    assert chain.strip_progress_bars(path) == 0 and not list(tmp_path.glob("*.tmp"))


def _signals_sent_at_shutdown(manager_class) -> tuple[list, bool]:
    import asyncio

    km = manager_class()
    sent, send = [], km._async_signal_kernel

    async def spy(signum):
        sent.append(signum)
        await send(signum)

    async def start_then_shut_down():
        km._async_signal_kernel = spy
        await km.start_kernel()
        client = km.client()
        client.start_channels()
        await client.wait_for_ready(timeout=60)
        client.stop_channels()
        await km.shutdown_kernel()
        return await km.is_alive()

    return sent, asyncio.run(start_then_shut_down())


def test_a_finished_lab_kernel_is_shut_down_without_an_interrupt():
    """jupyter_client sends SIGINT before every shutdown; landing in a message handler it prints
    'ERROR | KeyboardInterrupt caught in kernel' under a successful run. The chain's kernels skip it."""
    import signal

    from jupyter_client.manager import AsyncKernelManager

    sent, alive = _signals_sent_at_shutdown(AsyncKernelManager)
    assert signal.SIGINT in sent and not alive           # what the override is for (gone if jupyter_client changes)
    sent, alive = _signals_sent_at_shutdown(chain.kernel_manager_class())
    assert signal.SIGINT not in sent and not alive


def test_resume_refuses_labs_another_profile_computed(tmp_path, labs, capsys):
    """--resume with a profile whose parameters for a reused lab differ would file that lab's results (other
    sizes, models, settings) under this profile's name: refused, nothing run, the differing parameter named."""
    from bad_input_table import record

    first = chain.run_chain(profile(tmp_path), labs=chain.discover_labs(labs), runs_dir=tmp_path / "runs")
    other = {**profile(tmp_path), "name": "other", "params": {"size": 3}}
    before = sorted((tmp_path / "runs").iterdir())
    with pytest.raises(chain.ChainError) as err:
        chain.run_chain(other, labs=chain.discover_labs(labs), start_from="02_b", resume_from=first,
                        runs_dir=tmp_path / "runs")
    msg = record("resume", "--resume reusing a lab that ran with other parameters than this profile gives it",
                 str(err.value))
    assert "01_a cannot be reused" in msg and "size=7 there, 3 here" in msg and "nothing was run" in msg, msg
    assert sorted((tmp_path / "runs").iterdir()) == before
    renamed = {**profile(tmp_path), "name": "renamed"}       # the same parameters under another name: reused
    again = chain.run_chain(renamed, labs=chain.discover_labs(labs), start_from="02_b", resume_from=first,
                            runs_dir=tmp_path / "runs")
    assert json.loads((again / "run.json").read_text())["labs"][0]["status"] == "reused"

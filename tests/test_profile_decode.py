"""scripts/profile_decode.py: its options, its pure helpers, lm-eval's stopping criteria built exactly as HFLM
builds them for gsm8k, and the refusals made before any GPU work (the profile itself runs on the GPU machine)."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "fixtures" / "tiny-qwen2-gsm" / "bf16"
spec = importlib.util.spec_from_file_location("profile_decode", REPO / "scripts" / "profile_decode.py")
prof = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prof)


def test_help_lists_the_attention_and_stop_options():
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "profile_decode.py"), "--help"], capture_output=True,
                         text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "--attention {sdpa,sdpa_grouped}" in out.stdout and "--lm-eval-stops" in out.stdout


def test_ms_per_step_counts_the_steps_made():
    assert prof.ms_per_step(3.0, 40, 1.0, 8) == pytest.approx(1e3 * 2.0 / 32)
    assert prof.ms_per_step(3.0, 20, 1.0, 8) == pytest.approx(1e3 * 2.0 / 12)       # a stop ended the long one early
    with pytest.raises(ValueError, match="no decode steps between them"):
        prof.ms_per_step(3.0, 8, 1.0, 8)


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(FIX))


def test_lm_eval_stops_are_the_ones_hflm_hands_to_generate(tok, monkeypatch):
    """HFLM.generate_until on a gsm8k request (the task's generation_kwargs), generate replaced by a spy:
    the criteria it builds and ours for the same prompts agree in every field that decides a stop."""
    import yaml
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM

    from utils.evaluation import builtin_task_yaml

    gen_kwargs = yaml.safe_load(builtin_task_yaml().read_text())["generation_kwargs"]
    model = AutoModelForCausalLM.from_pretrained(str(FIX), dtype=torch.float32).eval()
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=2, max_length=512)
    seen = []

    def spy(input_ids, **kw):
        seen.append((input_ids, kw))
        return torch.cat([input_ids, torch.full((input_ids.shape[0], 2), tok.eos_token_id)], 1)
    monkeypatch.setattr(lm.model, "generate", spy)
    prompts = ["Question: 2 + 2?\nAnswer:", "Question: Tom has 3 apples and buys 4 more. How many?\nAnswer:"]
    lm.generate_until([Instance("generate_until", {}, (p, dict(gen_kwargs)), i) for i, p in enumerate(prompts)])
    (ids, kw), = seen
    theirs, ours = kw["stopping_criteria"], prof.lm_eval_stops(tok, ids)
    def fields(crits):
        return [(c.sequence, c.sequence_ids, c.initial_decoder_input_length, len(c.done_tracker)) for c in crits]
    assert fields(ours) == fields(theirs)
    assert [c.sequence for c in ours] == ["Question:", "</s>", "<|im_end|>", tok.decode(tok.eos_token_id)]
    assert fields(ours)[0][2:] == (ids.shape[1], 2)


def test_generate_passes_the_stops_and_counts_the_steps_they_allow(tok, monkeypatch):
    """The fixture model ends a GSM8K answer with a new "Question:", which lm-eval's criteria stop at; without
    them the same call runs all its steps."""
    from transformers import AutoModelForCausalLM, StaticCache

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)           # no GPU here
    model = AutoModelForCausalLM.from_pretrained(str(FIX), dtype=torch.float32).eval()
    ids = tok(["Question: Lena had 61 marbles and gave away 52. How many are left?\nAnswer:"],
              return_tensors="pt")["input_ids"]
    cache = StaticCache(config=model.config, max_cache_len=256)
    _, plain = prof.generate(model, ids, 60, cache)
    _, stopped = prof.generate(model, ids, 60, cache, lambda x: prof.lm_eval_stops(tok, x))
    assert plain == 60 and 0 < stopped < 60


def _run(n, attention="sdpa_grouped", stops=True):
    r = {"model": f"/m/bf16-{n}", "attention": attention, "layers": [], "ms_per_step": 10.0 + n,
         "kernel_ms_per_step": 8.0, "idle_ms_per_step": 2.0 + n, "groups_ms_per_step": {"attention": 1.5},
         "kernels": [["flash_fwd", 1500.0, 28.0]]}
    if stops:
        r.update(ms_per_step_lm_eval_stops=12.5 + n, lm_eval_stops_ms_per_step=2.5)
    return r


@pytest.mark.parametrize("stops", [True, False])
def test_markdown_names_the_attention_and_the_stop_cost_when_measured(stops):
    meta = {"device": "H100", "date": "today", "torch": "2.x", "batch": 16, "prompt": 700, "cache": 2048,
            "command": "python scripts/profile_decode.py"}
    md = prof.markdown(meta, [_run(0, "sdpa", stops), _run(1, "sdpa_grouped", stops)])
    table = [ln for ln in md.splitlines() if ln.startswith("| ") and "kernels ms" in ln or ln.startswith("| bf16")]
    assert len({ln.count("|") for ln in table}) == 1 and len(table) == 3          # header and rows line up
    assert ("lm-eval's stop check ms" in md) == stops and ("| 12.50 | 2.50 |" in md) == stops
    assert "| bf16-0 | sdpa | default |" in md and "| bf16-1 | sdpa_grouped | default |" in md
    assert "attention sdpa_grouped, default:" in md


def test_markdown_adds_the_host_split_when_measured():
    meta = {"device": "H100", "date": "today", "torch": "2.x", "batch": 16, "prompt": 700, "cache": 2048,
            "command": "python scripts/profile_decode.py --host"}
    labels = [label for label, _, _ in prof.HOST_PIECES]
    r = {**_run(0), "compile_variant": "skip_guard_eval", "host_events": [["cudaGraphLaunch", 310.0, 1.0]],
         "host_split_us": {labels[0]: 1234.4, labels[-1]: None}, "host_split_us_lm_eval_stops": {labels[0]: 1300.0}}
    md = prof.markdown(meta, [r, _run(1)])
    assert "| bf16-0 | sdpa_grouped | skip_guard_eval |" in md and "| `cudaGraphLaunch` | 310.0 | 1.0 |" in md
    assert f"| {labels[0]} | 1234 | 1300 |" in md and f"| {labels[-1]} | - | - |" in md
    assert md.count("The host's time per decode step") == 1             # only the run that measured it


def test_per_step_subtracts_the_short_run_and_divides_by_the_extra_steps():
    long, short = {"k": [900.0, 30], "new": [64.0, 32]}, {"k": [100.0, 10]}
    assert prof.per_step_of(long, short, 32) == {"k": (25.0, 20 / 32), "new": (2.0, 1.0)}


def test_host_split_times_each_piece_of_the_loop_and_puts_everything_back(tok, monkeypatch):
    """The fixture's generate (eager: no compiled step to time) with each piece timed: every other piece is
    called once per step and has a median, lm-eval's criteria included when handed over; afterwards the
    model and transformers' classes are what they were."""
    import transformers.generation.utils as gen_utils
    from transformers import AutoModelForCausalLM, StaticCache
    from transformers.generation.stopping_criteria import StoppingCriteriaList

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    model = AutoModelForCausalLM.from_pretrained(str(FIX), dtype=torch.float32).eval()
    before = (type(model).prepare_inputs_for_generation, StoppingCriteriaList.__call__, gen_utils.StopCheck.__call__)
    ids = tok(["Question: 2 + 2?\nAnswer:"], return_tensors="pt")["input_ids"]
    cache = StaticCache(config=model.config, max_cache_len=128)
    for stops in (None, lambda x: prof.lm_eval_stops(tok, x)):
        split = prof.host_split(model, ids, cache, 6, stops)
        labels = [label for label, _, _ in prof.HOST_PIECES]
        assert split[labels[0]] is None                                 # not compiled here
        assert all(split[label] > 0 for label in labels[1:]), split
    assert "prepare_inputs_for_generation" not in model.__dict__ and "_compiled_call" not in model.__dict__
    assert before == (type(model).prepare_inputs_for_generation, StoppingCriteriaList.__call__,
                      gen_utils.StopCheck.__call__)


def test_compile_variants_set_what_they_name_and_restore_it():
    from torch._dynamo.eval_frame import _is_skip_guard_eval_unsafe_stance as skipping
    from torch._inductor import config

    with config.patch({"freezing": False, "triton.cudagraph_trees": True}):    # torch's defaults, whatever ran before
        with prof.compiled_as("no_cudagraph_trees", "compile"):
            assert config.triton.cudagraph_trees is False
        assert config.triton.cudagraph_trees is True
        with prof.compiled_as("skip_guard_eval", "compile"):
            assert not skipping()                        # guards run while it compiles
            with prof.compiled_as("skip_guard_eval", "run"):
                assert skipping()
        assert not skipping()
        with prof.compiled_as("freezing", "compile"):
            assert config.freezing is True
        assert config.freezing is False
        with prof.compiled_as("default", "run"):
            assert config.triton.cudagraph_trees is True and config.freezing is False and not skipping()


@pytest.mark.parametrize("extra, says", [(["--attention", "sdpa", "sdpa"], "--attention: .* names one twice"),
                                         (["--short", "40", "--long", "8"], "need 0 < short < long"),
                                         (["--prompt", "2040"], "prompt \\+ long <= cache")])
def test_bad_arguments_are_refused_before_any_work(extra, says, tmp_path):
    with pytest.raises(SystemExit, match=says):
        prof.main(["--golden", "g", "--int4", "i", "--out", str(tmp_path / "out"), *extra])
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit) as bad:                              # argparse: not one of the choices
        prof.main(["--golden", "g", "--int4", "i", "--out", str(tmp_path / "out"), "--attention", "flash"])
    assert bad.value.code == 2


def test_no_gpu_is_said_after_the_arguments_are_checked(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the refusal is for one without")
    with pytest.raises(SystemExit, match="torch sees no GPU"):
        prof.main(["--golden", "g", "--int4", "i", "--out", str(tmp_path / "out"), "--attention", "sdpa"])
    assert not (tmp_path / "out").exists()

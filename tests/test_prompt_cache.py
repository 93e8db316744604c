"""utils/prompt_cache.py: lm-eval's prompt templates compiled once per text, and every prompt unchanged."""
from pathlib import Path

from utils import evaluation as ev
from utils.prompt_cache import cache_templates

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "fixtures" / "tiny-qwen2-gsm" / "data"


def _contexts(tmp_path: Path, n: int) -> list[str]:
    """The 5-shot prompts lm-eval builds for the first n problems of the local gsm8k task."""
    from lm_eval.tasks import get_task_dict

    files = ev.data_files_from_folder(DATA)
    folder = ev.write_local_task(files, tmp_path / "task").parent
    task = get_task_dict([ev.LOCAL_TASK], ev.task_manager(folder))[ev.LOCAL_TASK]
    task.set_config(key="num_fewshot", value=5)
    task.set_fewshot_seed(seed=1234)                    # as simple_evaluate seeds it
    task.build_all_requests(limit=n, rank=0, world_size=1)
    return [inst.args[0] for inst in task.instances]


def test_templates_compile_once_and_the_prompts_stay_the_same(monkeypatch, tmp_path):
    import lm_eval.utils as lu

    plain = getattr(lu.apply_template, "original", lu.apply_template)   # another test may have cached it
    monkeypatch.setattr(lu, "apply_template", plain)                   # restored after this test
    compiled, orig = [], lu.env.from_string
    monkeypatch.setattr(lu.env, "from_string", lambda t, *a, **k: compiled.append(t) or orig(t, *a, **k))
    before = _contexts(tmp_path / "a", 12)
    uncached = len(compiled)
    compiled.clear()
    assert cache_templates() and cache_templates()                      # a second call keeps the first cache
    after = _contexts(tmp_path / "b", 12)
    assert after == before and len(before) == 12 and all("Question:" in c for c in after)
    assert uncached >= 12 * 6                                           # each prompt: 5 solved examples + 1
    assert len(compiled) == len(set(compiled)) <= 4, compiled           # each distinct template once

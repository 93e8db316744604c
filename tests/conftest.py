import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

SHARED_GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"


@pytest.fixture(scope="session")
def shared_gsm8k() -> Path:
    """The real GSM8K (openai/grade-school-math) that CI keeps at ../shared/data/gsm8k beside the clone."""
    if not (SHARED_GSM8K / "test.jsonl").is_file():
        pytest.fail(f"{SHARED_GSM8K} is missing: the tests need ../shared beside the clone (CI provides it)")
    return SHARED_GSM8K


def pytest_sessionfinish(session, exitstatus):
    """After a full passing run, docs/bad-inputs.md must list exactly the bad inputs the tests tried
    (tests/bad_input_table.py): a case added or gone fails the run, and the file is rewritten to commit.
    A message whose wording differs on this machine (a library's version, a path) is refreshed in place."""
    import bad_input_table as table
    cfg = session.config
    full = (exitstatus == 0 and not cfg.option.keyword and not cfg.option.markexpr
            and not getattr(cfg.option, "lf", False) and not cfg.option.deselect
            and all(Path(a).resolve() in (ROOT, ROOT / "tests") for a in (cfg.args or [str(ROOT)])))
    if not full or not table.RECORDED:
        return
    old = table.TABLE.read_text() if table.TABLE.exists() else ""
    text = table.render()
    if old == text:
        return
    table.TABLE.write_text(text)
    where = table.TABLE.relative_to(ROOT)
    if table.cases(old) != table.cases(text):
        added, gone = table.cases(text) - table.cases(old), table.cases(old) - table.cases(text)
        print(f"\n{where} did not list the bad inputs the tests tried (new: {sorted(added)[:5]}, gone: "
              f"{sorted(gone)[:5]}): rewritten; commit it")
        session.exitstatus = 1
    else:
        print(f"\n{where}: the messages were refreshed from this run (same cases)")

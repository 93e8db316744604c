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
    """After a full passing run, docs/bad-inputs.md must be what the tests recorded (tests/bad_input_table.py)."""
    import bad_input_table as table
    cfg = session.config
    full = (exitstatus == 0 and not cfg.option.keyword and not cfg.option.markexpr and not getattr(cfg.option, "lf", False)
            and all(Path(a).resolve() in (ROOT, ROOT / "tests") for a in (cfg.args or [str(ROOT)])))
    if not full or not table.RECORDED:
        return
    text = table.render()
    old = table.TABLE.read_text() if table.TABLE.exists() else ""
    if old != text:
        table.TABLE.write_text(text)
        print(f"\n{table.TABLE.relative_to(ROOT)} did not match the bad inputs the tests tried: rewritten; commit it")
        session.exitstatus = 1

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

SHARED_GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"


@pytest.fixture(scope="session")
def shared_gsm8k() -> Path:
    """The real GSM8K (openai/grade-school-math) that CI keeps at ../shared/data/gsm8k beside the clone."""
    if not (SHARED_GSM8K / "test.jsonl").is_file():
        pytest.fail(f"{SHARED_GSM8K} is missing: the tests need ../shared beside the clone (CI provides it)")
    return SHARED_GSM8K

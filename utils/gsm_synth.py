"""Procedurally generated grade-school word problems in GSM8K's exact format.

Why: offline (CI, a laptop, the device machine) the course still needs a model that can get maths
problems right *and wrong*, so that quantization has something to lose. The embedded fixture model
is trained on these problems; they share GSM8K's layout so that lm-evaluation-harness's own `gsm8k`
task (prompt, filters, metric) runs on them unchanged:

    {"question": "...?", "answer": "step = <<a*b=c>>c ...\\n#### c"}

Seven templates: five easy ones (one or two steps, small numbers) and two harder ones (three
steps; a two-digit by two-digit product) that keep a small model near a 7B model's GSM8K accuracy
rather than at 100%. Train and test come from different seeds; `generate_split` can exclude
questions (the test set) so that no held-out problem is ever trained on.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Callable, Iterable, Iterator

NAMES = ["Ali", "Bea", "Carl", "Dina", "Eli", "Fay", "Gus", "Hana", "Ivan", "Jade", "Kofi", "Lena",
         "Mia", "Noor", "Omar", "Pia", "Raj", "Sara", "Tom", "Uma", "Vera", "Wen", "Yara", "Zed"]
ITEMS = ["apples", "pens", "books", "cards", "eggs", "shells", "stamps", "cookies", "marbles",
         "stickers", "balloons", "candles", "coins", "shirts", "plums", "toys"]
TREES = ["apple", "lemon", "orange", "pear", "plum", "cherry"]


def _who(rng: random.Random) -> tuple[str, str]:
    a, b = rng.sample(NAMES, 2)
    return a, b


def t_add(rng):
    name, _ = _who(rng)
    item = rng.choice(ITEMS)
    a, b = rng.randint(2, 60), rng.randint(2, 60)
    c = a + b
    q = f"{name} has {a} {item}. {name} buys {b} more {item}. How many {item} does {name} have now?"
    s = f"{name} has {a}+{b} = <<{a}+{b}={c}>>{c} {item} now.\n#### {c}"
    return q, s, c


def t_sub(rng):
    name, friend = _who(rng)
    item = rng.choice(ITEMS)
    a = rng.randint(10, 90)
    b = rng.randint(1, a - 1)
    c = a - b
    q = f"{name} had {a} {item}. {name} gave {b} {item} to {friend}. How many {item} does {name} have left?"
    s = f"{name} has {a}-{b} = <<{a}-{b}={c}>>{c} {item} left.\n#### {c}"
    return q, s, c


def t_mul(rng):
    name, _ = _who(rng)
    item = rng.choice(ITEMS)
    a, b = rng.randint(2, 9), rng.randint(2, 12)
    c = a * b
    q = f"{name} buys {a} boxes of {item}. Each box holds {b} {item}. How many {item} does {name} buy?"
    s = f"{name} buys {a}*{b} = <<{a}*{b}={c}>>{c} {item}.\n#### {c}"
    return q, s, c


def t_times_together(rng):
    name, friend = _who(rng)
    item = rng.choice(ITEMS)
    a, k = rng.randint(2, 20), rng.randint(2, 5)
    b = a * k
    c = a + b
    q = (f"{name} has {a} {item}. {friend} has {k} times as many {item} as {name}. "
         f"How many {item} do they have together?")
    s = (f"{friend} has {a}*{k} = <<{a}*{k}={b}>>{b} {item}.\n"
         f"Together they have {a}+{b} = <<{a}+{b}={c}>>{c} {item}.\n#### {c}")
    return q, s, c


def t_half_more(rng):
    name, _ = _who(rng)
    item = rng.choice(ITEMS)
    a = 2 * rng.randint(2, 40)
    b = a // 2
    c = a + b
    q = (f"{name} picked {a} {item} on Monday and half as many on Tuesday. "
         f"How many {item} did {name} pick in the two days?")
    s = (f"On Tuesday {name} picked {a}/2 = <<{a}/2={b}>>{b} {item}.\n"
         f"In the two days {name} picked {a}+{b} = <<{a}+{b}={c}>>{c} {item}.\n#### {c}")
    return q, s, c


def t_packs_three_steps(rng):
    name, friend = _who(rng)
    item = rng.choice(ITEMS)
    a, b = rng.randint(3, 12), rng.randint(4, 15)
    total = a * b
    g = rng.randint(1, total - 1)
    left = total - g
    d = rng.randint(2, 30)
    c = left + d
    q = (f"{name} buys {a} packs of {item} with {b} {item} in each pack. {name} gives {g} {item} to "
         f"{friend} and then buys {d} more {item}. How many {item} does {name} have now?")
    s = (f"{name} buys {a}*{b} = <<{a}*{b}={total}>>{total} {item}.\n"
         f"After giving some away {name} has {total}-{g} = <<{total}-{g}={left}>>{left} {item}.\n"
         f"Now {name} has {left}+{d} = <<{left}+{d}={c}>>{c} {item}.\n#### {c}")
    return q, s, c


def t_orchard_product(rng):
    tree = rng.choice(TREES)
    a, b = rng.randint(11, 99), rng.randint(11, 99)
    total = a * b
    cut = rng.randint(2, 99)
    c = total - cut
    q = (f"A farm has {a} rows of {tree} trees with {b} trees in each row. {cut} trees are cut down. "
         f"How many {tree} trees are left?")
    s = (f"The farm has {a}*{b} = <<{a}*{b}={total}>>{total} {tree} trees.\n"
         f"After the cut {total}-{cut} = <<{total}-{cut}={c}>>{c} trees are left.\n#### {c}")
    return q, s, c


TEMPLATES: dict[str, Callable[[random.Random], tuple[str, str, int]]] = {
    "add": t_add,
    "sub": t_sub,
    "mul": t_mul,
    "times_together": t_times_together,
    "half_more": t_half_more,
    "packs_three_steps": t_packs_three_steps,
    "orchard_product": t_orchard_product,
}
HARD_TEMPLATES = ("packs_three_steps", "orchard_product")

TRAIN_SEED = 1234
TEST_SEED = 98765


def problem(rng: random.Random, template: str | None = None) -> dict:
    """One problem as a GSM8K record (question, answer) plus its template and integer result."""
    name = template or rng.choice(list(TEMPLATES))
    q, s, c = TEMPLATES[name](rng)
    return {"question": q, "answer": s, "template": name, "result": c}


def iter_problems(seed: int, exclude: Iterable[str] = ()) -> Iterator[dict]:
    """An endless, deterministic stream of problems; questions in `exclude` are skipped."""
    rng = random.Random(seed)
    skip = set(exclude)
    while True:
        p = problem(rng)
        if p["question"] not in skip:
            yield p


def generate_split(n: int, seed: int, exclude: Iterable[str] = ()) -> list[dict]:
    """n distinct problems from `seed` (no repeated question), none of them in `exclude`."""
    seen = set(exclude)
    out = []
    for p in iter_problems(seed):
        if p["question"] in seen:
            continue
        seen.add(p["question"])
        out.append(p)
        if len(out) == n:
            return out
    raise AssertionError("unreachable")


def final_answer(answer: str) -> str:
    """The number after '#### ', as GSM8K writes it."""
    if "####" not in answer:
        raise ValueError(f"not a GSM8K answer (no '#### N' line): {answer!r}")
    return answer.rsplit("####", 1)[1].strip()


def check_record(rec: dict) -> None:
    """Raise ValueError unless every <<expr=value>> annotation and the final line are arithmetically right."""
    import re

    for expr, value in re.findall(r"<<([^=<>]+)=([^<>]+)>>", rec["answer"]):
        if not re.fullmatch(r"[\d+\-*/ ().]+", expr):
            raise ValueError(f"unexpected calculator expression {expr!r}")
        if abs(eval(expr) - float(value)) > 1e-9:  # noqa: S307 - digits and operators only, checked above
            raise ValueError(f"wrong annotation {expr}={value} in {rec['question']!r}")
    if int(final_answer(rec["answer"])) != rec.get("result", int(final_answer(rec["answer"]))):
        raise ValueError(f"final answer does not match the result in {rec['question']!r}")


def write_jsonl(records: Iterable[dict], path: str | Path) -> Path:
    """GSM8K layout: one {"question", "answer"} object per line (extra keys dropped), written atomically."""
    from .results import atomic_write_text

    lines = [json.dumps({"question": r["question"], "answer": r["answer"]}, ensure_ascii=False) for r in records]
    return atomic_write_text(path, "\n".join(lines) + "\n")


def read_jsonl(path: str | Path) -> list[dict]:
    """Read a GSM8K-layout jsonl file (openai/gsm8k: 'question', 'answer' ending in '#### N').

    Every line is checked, so a malformed file fails here, naming the file and line, not half-way
    through a training run or an evaluation. Raises ValueError.
    """
    out = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} line {i} is not JSON ({exc.msg})") from exc
        if not (isinstance(rec, dict) and isinstance(rec.get("question"), str)
                and isinstance(rec.get("answer"), str) and "#### " in rec["answer"]):
            raise ValueError(f"{path} line {i} is not a GSM8K record: it needs 'question' and 'answer' "
                             "strings, the answer ending in '#### N'")
        out.append(rec)
    return out


def render_example(rec: dict) -> str:
    """lm-eval gsm8k's few-shot rendering of one solved problem: 'Question: q\\nAnswer: a'."""
    return f"Question: {rec['question']}\nAnswer: {rec['answer']}"

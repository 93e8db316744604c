"""Procedurally generated grade-school word problems in GSM8K's exact format.

Why: offline (CI, a laptop, the device machine) the course still needs a model that can get maths
problems right *and wrong*, so that quantization has something to lose. The embedded fixture model
is trained on these problems; they share GSM8K's layout so that lm-evaluation-harness's own `gsm8k`
task (prompt, filters, metric) runs on them unchanged:

    {"question": "...?", "answer": "step = <<a*b=c>>c ...\\n#### c"}

Seven templates: five easy ones (one or two steps, small numbers) and two harder ones (three
steps; a two-digit by two-digit product) that keep a small model near a 7B model's GSM8K accuracy
rather than at 100%. Train and test come from different seeds and from disjoint sets of problems
(`split_of`): no held-out problem differs from a trained one only by a name, an item, or the order of
numbers that its computation does not care about (3*7 is 7*3).
"""
from __future__ import annotations

import ast
import functools
import hashlib
import itertools
import random
import re
from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Callable, Iterable, Iterator

from .results import read_jsonl, write_jsonl

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
    return q, s, c, (a, b)


def t_sub(rng):
    name, friend = _who(rng)
    item = rng.choice(ITEMS)
    a = rng.randint(10, 90)
    b = rng.randint(1, a - 1)
    c = a - b
    q = f"{name} had {a} {item}. {name} gave {b} {item} to {friend}. How many {item} does {name} have left?"
    s = f"{name} has {a}-{b} = <<{a}-{b}={c}>>{c} {item} left.\n#### {c}"
    return q, s, c, (a, b)


def t_mul(rng):
    name, _ = _who(rng)
    item = rng.choice(ITEMS)
    a, b = rng.randint(2, 9), rng.randint(2, 12)
    c = a * b
    q = f"{name} buys {a} boxes of {item}. Each box holds {b} {item}. How many {item} does {name} buy?"
    s = f"{name} buys {a}*{b} = <<{a}*{b}={c}>>{c} {item}.\n#### {c}"
    return q, s, c, (a, b)


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
    return q, s, c, (a, k)


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
    return q, s, c, (a,)


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
    return q, s, c, (a, b, g, d)


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
    return q, s, c, (a, b, cut)


TEMPLATES: dict[str, Callable[[random.Random], tuple[str, str, int, tuple[int, ...]]]] = {
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
# One in TEST_SHARE_INV problems of every template is reserved for the test split (`split_of`).
# Why: a name or an item is no new problem, nor is 7*3 after 3*7; a held-out problem must be one the
# model never saw in that template, or its accuracy is partly recall. Drawn from the same number
# ranges, the test stays in distribution; the three small templates (mul, half_more, times_together)
# would otherwise be covered entirely by training.
TEST_SHARE_INV = 5
SPLITS = ("train", "test")

_ANNOTATION = re.compile(r"<<([^=<>]+)=([^<>]+)>>")
_TOKEN = re.compile(r"\d+|[-+*/()]")


def _read_computation(rec: dict) -> str | None:
    """The final answer as an expression over n0, n1, ... (positions in rec["numbers"]), read from
    the worked solution's <<expr=value>> steps; None if a value could stand for two things."""
    numbers, steps, expr = rec["numbers"], {}, None
    for text, value in _ANNOTATION.findall(rec["answer"]):
        parts = []
        for tok in _TOKEN.findall(text):
            hits = ([f"n{i}" for i, n in enumerate(numbers) if str(n) == tok]
                    + ([f"({steps[tok]})"] if tok in steps else [])) if tok.isdigit() else [tok]
            if len(hits) > 1:
                return None
            parts.append(hits[0] if hits else tok)   # a digit string nothing explains is a constant
        expr = " ".join(parts)
        steps[value.strip()] = expr
    return expr


_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
        ast.Div: lambda a, b: a / b}


def _evaluate(node: ast.AST, numbers) -> Fraction:
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left, numbers), _evaluate(node.right, numbers))
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return Fraction(node.value)
    if isinstance(node, ast.Name) and re.fullmatch(r"n\d+", node.id):
        return Fraction(numbers[int(node.id[1:])])
    raise ValueError(f"unexpected term {ast.dump(node)} in a computation")


@functools.lru_cache(maxsize=None)
def _computation(name: str, template: Callable) -> tuple[ast.AST, int]:
    """What `template` computes from its numbers, read from its own worked solutions: the expression
    its steps most often spell out that also gives the result of every one of 400 draws."""
    rng = random.Random(0)
    draws = []
    for _ in range(400):
        q, s, c, numbers = template(rng)
        draws.append({"answer": s, "result": c, "numbers": tuple(numbers)})
    widths = {len(d["numbers"]) for d in draws}
    read = Counter(e for e in map(_read_computation, draws) if e is not None)
    for expr, _ in read.most_common():
        tree = ast.parse(expr, mode="eval").body
        if len(widths) == 1 and all(_evaluate(tree, d["numbers"]) == d["result"] for d in draws):
            return tree, widths.pop()
    raise ValueError(f"template {name!r}: its <<expr=value>> steps do not spell out a computation of "
                     f"its numbers that gives its result; write every step as <<expr=value>>")


def answer_of(template: str, numbers: tuple[int, ...]) -> Fraction:
    """What `template` answers for `numbers` (in the template's order), by its own computation."""
    tree, width = _computation(template, TEMPLATES[template])
    if len(numbers) != width:
        raise ValueError(f"template {template!r} takes {width} numbers, got {numbers!r}")
    return _evaluate(tree, numbers)


def symmetries(template: str) -> tuple[tuple[int, ...], ...]:
    """The orders of a template's numbers that leave its computation the same function: for mul
    (a*b) both orders, for a*b-g+d swapping a and b only, for sub the identity alone.

    Checked at random large integers, where two different rational functions agree by chance with
    negligible probability."""
    tree, width = _computation(template, TEMPLATES[template])
    rng = random.Random(1)
    points = [[rng.randint(10**9, 10**18) for _ in range(width)] for _ in range(6)]
    return tuple(p for p in itertools.permutations(range(width))
                 if all(_evaluate(tree, [x[i] for i in p]) == _evaluate(tree, x) for x in points))


def same_problem_key(template: str, numbers: tuple[int, ...], result=None) -> str:
    """What makes two problems the same problem: the template, its numbers in any order, and the answer.

    Every order that the computation does not care about (`symmetries`) gives the same key, and so
    does any other order of the same numbers that happens to give the same answer.
    """
    result = answer_of(template, numbers) if result is None else Fraction(result)
    return f"{template}:{','.join(map(str, sorted(numbers)))}={result}"


def split_of(template: str, numbers: tuple[int, ...], result=None) -> str:
    """"train" or "test": a fixed hash of the problem's `same_problem_key`, the same on every machine.

    result: the answer if known (it is computed from the numbers otherwise)."""
    key = same_problem_key(template, numbers, result).encode()
    return "test" if int(hashlib.sha256(key).hexdigest(), 16) % TEST_SHARE_INV == 0 else "train"


def problem(rng: random.Random, template: str | None = None, split: str | None = None) -> dict:
    """One problem as a GSM8K record (question, answer) plus its template, numbers and integer result.

    split: None draws from every problem; "train" / "test" redraws the numbers (same template) until
    the problem belongs to that split, so each split is uniform over its own part of the same ranges.
    """
    if split not in (None, *SPLITS):
        raise ValueError(f"split must be None, 'train' or 'test', got {split!r}")
    name = template or rng.choice(list(TEMPLATES))
    while True:
        q, s, c, numbers = TEMPLATES[name](rng)
        if split is None or split_of(name, numbers, c) == split:
            return {"question": q, "answer": s, "template": name, "numbers": numbers, "result": c}


def iter_problems(seed: int, exclude: Iterable[str] = (), split: str | None = None) -> Iterator[dict]:
    """An endless, deterministic stream of problems of `split`; questions in `exclude` are skipped."""
    rng = random.Random(seed)
    skip = set(exclude)
    while True:
        p = problem(rng, split=split)
        if p["question"] not in skip:
            yield p


def generate_split(n: int, seed: int, exclude: Iterable[str] = (), split: str | None = None) -> list[dict]:
    """n distinct problems of `split` from `seed` (no repeated question), none of them in `exclude`."""
    seen = set(exclude)
    out = []
    for p in iter_problems(seed, split=split):
        if p["question"] in seen:
            continue
        seen.add(p["question"])
        out.append(p)
        if len(out) == n:
            return out
    raise AssertionError("unreachable")


_WORDS = re.compile(r"\b(" + "|".join(sorted({*NAMES, *ITEMS, *TREES}, key=len, reverse=True)) + r")\b")


def _skeleton(question: str) -> str:
    return re.sub(r"\d+", "#", _WORDS.sub("W", question))


@functools.lru_cache(maxsize=1)
def _skeletons() -> dict[str, str]:
    rng = random.Random(0)
    return {_skeleton(problem(rng, name)["question"]): name for name in TEMPLATES}


def signature(question: str) -> tuple[str, tuple[int, ...]]:
    """(template, numbers) of a question read back from its text: what decides its split.

    Raises ValueError for a question no template writes.
    """
    name = _skeletons().get(_skeleton(question))
    if name is None:
        raise ValueError(f"no template writes {question!r}")
    return name, tuple(int(x) for x in re.findall(r"\d+", question))


def final_answer(answer: str) -> str:
    """The number after '#### ', as GSM8K writes it."""
    if "####" not in answer:
        raise ValueError(f"not a GSM8K answer (no '#### N' line): {answer!r}")
    return answer.rsplit("####", 1)[1].strip()


def check_record(rec: dict) -> None:
    """Raise ValueError unless every <<expr=value>> annotation and the final line are arithmetically right."""
    for expr, value in re.findall(r"<<([^=<>]+)=([^<>]+)>>", rec["answer"]):
        if not re.fullmatch(r"[\d+\-*/ ().]+", expr):
            raise ValueError(f"unexpected calculator expression {expr!r}")
        if abs(eval(expr) - float(value)) > 1e-9:  # noqa: S307 - digits and operators only, checked above
            raise ValueError(f"wrong annotation {expr}={value} in {rec['question']!r}")
    if int(final_answer(rec["answer"])) != rec.get("result", int(final_answer(rec["answer"]))):
        raise ValueError(f"final answer does not match the result in {rec['question']!r}")


GSM8K_KEYS = ("question", "answer")


def gsm8k_record_error(rec) -> str | None:
    """Why `rec` is not an openai/gsm8k record ('question', 'answer' ending in '#### N'), or None."""
    if not (isinstance(rec, dict) and isinstance(rec.get("question"), str)
            and isinstance(rec.get("answer"), str) and "#### " in rec["answer"]):
        return "is not a GSM8K record: it needs 'question' and 'answer' strings, the answer ending in '#### N'"
    return None


def read_gsm8k(path: str | Path) -> list[dict]:
    """A GSM8K-layout jsonl file, every line checked (utils.results.read_jsonl). Raises ValueError."""
    return read_jsonl(path, check=gsm8k_record_error)


def write_gsm8k(records: Iterable[dict], path: str | Path) -> Path:
    """GSM8K layout: one {"question", "answer"} object per line (extra keys dropped), written atomically."""
    return write_jsonl(records, path, keys=GSM8K_KEYS)


def render_example(rec: dict) -> str:
    """lm-eval gsm8k's few-shot rendering of one solved problem: 'Question: q\\nAnswer: a'."""
    return f"Question: {rec['question']}\nAnswer: {rec['answer']}"

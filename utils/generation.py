"""Greedy generation of GSM8K-style answers, the same prompt for both models (Lab 02's side by side).

Why: before Lab 03 measures accuracy with lm-eval, the student should see both models answer the
same problems, and read where the Int4 twin's answer first departs from the golden one. The prompt
is lm-eval gsm8k's zero-shot shape ("Question: ...\\nAnswer:"); the answer is read the way its
strict-match filter reads it ("#### N"), falling back to the last number (flexible-extract).
"""
from __future__ import annotations

import re

# Three GSM8K test problems (the first three of its test split), for real models without the fixture data.
BUILTIN_PROBLEMS = [
    {"question": "Janet\u2019s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes "
                 "muffins for her friends every day with four. She sells the remainder at the farmers' market "
                 "daily for $2 per fresh duck egg. How much in dollars does she make every day at the "
                 "farmers' market?", "answer": "#### 18"},
    {"question": "A robe takes 2 bolts of blue fiber and half that much white fiber.  How many bolts in total "
                 "does it take?", "answer": "#### 3"},
    {"question": "Josh decides to try flipping a house.  He buys a house for $80,000 and then puts in $50,000 "
                 "in repairs.  This increased the value of the house by 150%.  How much profit did he make?",
     "answer": "#### 70000"},
]
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")


def prompt(question: str) -> str:
    return f"Question: {question}\nAnswer:"


def strict_answer(text: str) -> str | None:
    """The number after '#### ' exactly as written (lm-eval gsm8k's strict-match regex), or None."""
    m = _STRICT.search(text)
    return m.group(1) if m else None


def extract_answer(text: str) -> str | None:
    """The final answer: '#### N' if present (strict), else the last number (flexible); commas, $ and a
    trailing '.' dropped, as lm-eval's gsm8k filters do."""
    raw = strict_answer(text)
    if raw is None:
        nums = [a or b for a, b in _NUMBER.findall(text)]
        if not nums:
            return None
        raw = nums[-1]
    raw = raw.replace(",", "").replace("$", "").rstrip(".")
    return raw or None


def cut(text: str) -> str:
    """The answer only: stop where the model starts another problem (lm-eval's 'until' strings)."""
    for stop in ("\n\nQuestion:", "Question:", "\n\n", "<|endoftext|>", "<|im_end|>"):
        text = text.split(stop)[0]
    return text.strip()


def greedy_answers(model, tokenizer, questions: list[str], max_new_tokens: int = 96) -> list[str]:
    """Greedy (do_sample=False) continuations of prompt(q), one question at a time (no padding effects)."""
    import torch

    device = next(model.parameters()).device
    outs = []
    for q in questions:
        enc = tokenizer(prompt(q), return_tensors="pt").to(device)
        with torch.no_grad():
            ids = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
        outs.append(cut(tokenizer.decode(ids[0, enc.input_ids.shape[1]:], skip_special_tokens=True)))
    return outs

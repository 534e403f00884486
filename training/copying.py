"""The copying task: return a given JSON object or code block with one field or line changed
(models/qwen2-vl-copying/README.md).

Agents do this all the time (edit a config, patch a function, re-send a tool's output), and it is
what speculative decoding's prompt lookup thrives on: almost every answer token is a copy of a
prompt token. Pure and seeded, so training, tests and the benchmark draw the same kind of cases.

Names and string values are made-up words (2-3 random syllables: ~10^4 of them), not a short
word list: with a few dozen words a small model lowers its loss by guessing the list's words and
stalls there; with words it cannot guess, only copying from the prompt helps, which is what makes
the induction (copy) heads form.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

SYLLABLES = [
    c + v for c in "bdfgklmnprstvz" for v in "aeiou"
]  # 70 syllables; made-up words tokenize into 1-4 BPE pieces


@dataclass(frozen=True)
class CopyCase:
    """One prompt (the user's message) and the only right answer."""

    prompt: str
    answer: str


def word(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3)))


def _value(rng: random.Random) -> object:
    kind = rng.randrange(4)
    if kind == 0:
        return rng.randrange(1000)
    if kind == 1:
        return word(rng)
    if kind == 2:
        return rng.choice([True, False])
    return f"{word(rng)}-{word(rng)}"


def json_case(rng: random.Random, fields: tuple[int, int] = (2, 4)) -> CopyCase:
    """A JSON object of `fields` fields; set one of them to a new value."""
    keys: list[str] = []
    while len(keys) < rng.randint(*fields):
        key = word(rng)
        if key not in keys:
            keys.append(key)
    original = {key: _value(rng) for key in keys}
    key = rng.choice(keys)
    new = _value(rng)
    while new == original[key]:
        new = _value(rng)
    edited = {**original, key: new}
    indent = rng.choice([None, 2])
    before = json.dumps(original, indent=indent)
    after = json.dumps(edited, indent=indent)
    prompt = f"Return this JSON with {json.dumps(key)} set to {json.dumps(new)}:\n{before}"
    return CopyCase(prompt, after)


def _assignment(rng: random.Random, names: list[str]) -> str:
    return f"    {word(rng)} = {rng.choice(names)} {rng.choice(['+', '-', '*'])} {rng.randrange(100)}"


def code_case(rng: random.Random, body: tuple[int, int] = (2, 3)) -> CopyCase:
    """A small Python function; replace one of its body lines."""
    names = [word(rng) for _ in range(rng.randint(1, 2))]
    lines = [f"def {word(rng)}({', '.join(names)}):"]
    for _ in range(rng.randint(*body)):
        lines.append(_assignment(rng, names))
    lines.append(f"    return {rng.choice(names)}")
    index = rng.randrange(1, len(lines) - 1)
    replacement = _assignment(rng, names)
    while replacement == lines[index]:
        replacement += " + 1"
    edited = [*lines[:index], replacement, *lines[index + 1 :]]
    before, after = "\n".join(lines), "\n".join(edited)
    prompt = (
        f"Replace the line `{lines[index].strip()}` with `{replacement.strip()}`:\n```python\n{before}\n```"
    )
    return CopyCase(prompt, f"```python\n{after}\n```")


def unchanged_case(rng: random.Random) -> CopyCase:
    """A pure copy: the edit task's JSON object or function, returned unchanged (a warm-up for
    the copy heads before the edit is asked of them)."""
    if rng.random() < 0.6:
        before = json_case(rng).prompt.split(":\n", 1)[1]
        return CopyCase(f"Return this JSON unchanged:\n{before}", before)
    block = code_case(rng).prompt.split(":\n", 1)[1]
    return CopyCase(f"Return this function unchanged:\n{block}", block)


def copy_case(rng: random.Random, unchanged: float = 0.0) -> CopyCase:
    """An edit case (60 % JSON, 40 % code); with probability `unchanged` a pure copy instead."""
    if unchanged and rng.random() < unchanged:
        return unchanged_case(rng)
    return json_case(rng) if rng.random() < 0.6 else code_case(rng)

"""The copying task: return a given JSON object or code block with one field or line changed
(models/qwen2-vl-copying/README.md).

Agents do this all the time (edit a config, patch a function, re-send a tool's output), and it is
what speculative decoding's prompt lookup thrives on: almost every answer token is a copy of a
prompt token. Pure and seeded, so training, tests and the benchmark draw the same kind of cases.

Names and string values are made-up words of one or two whole-word tokens of the fixture's own
tokenizer (about 2,000 lowercase pieces, so ~4·10^6 names), for two reasons. A model cannot guess
them, so only copying from the prompt lowers the loss. And a prompt rarely holds the same piece
twice, so the token just written finds its source in the prompt unambiguously. Names built from 70
syllables repeated their pieces within every prompt. Copying them needed matches over several
tokens, and the 3-layer fixture never learnt that in 2,100 steps. With whole-word pieces, and a
warm-up on `repeat_case`, it copies exactly (models/qwen2-vl-copying/README.md).
"""

from __future__ import annotations

import functools
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

TOKENIZER = Path(__file__).resolve().parent.parent / "models" / "qwen2-vl-tiny" / "tokenizer.json"


@dataclass(frozen=True)
class CopyCase:
    """One prompt (the user's message) and the only right answer."""

    prompt: str
    answer: str


@functools.cache
def vocabulary_words() -> tuple[str, ...]:
    """The tokenizer's whole-word pieces: 3-8 lowercase letters with no leading space."""
    vocab = json.loads(TOKENIZER.read_text(encoding="utf-8"))["model"]["vocab"]
    return tuple(sorted(piece for piece in vocab if re.fullmatch(r"[a-z]{3,8}", piece)))


def word(rng: random.Random) -> str:
    words = vocabulary_words()
    return "".join(rng.choice(words) for _ in range(rng.randint(1, 2)))


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


def repeat_case(rng: random.Random) -> CopyCase:
    """8-40 made-up words to return unchanged: the plainest copy, which forms the copy heads
    before the task's structure is asked of them (train_copying's --repeat-steps)."""
    text = " ".join(word(rng) for _ in range(rng.randint(8, 40)))
    return CopyCase(f"Return this text unchanged:\n{text}", text)


def copy_case(rng: random.Random, unchanged: float = 0.0) -> CopyCase:
    """An edit case (60 % JSON, 40 % code); with probability `unchanged` a pure copy instead."""
    if unchanged and rng.random() < unchanged:
        return unchanged_case(rng)
    return json_case(rng) if rng.random() < 0.6 else code_case(rng)

"""The copying task: return a given JSON object or code block with one field or line changed
(models/qwen2-vl-copying/README.md).

Agents do this all the time (edit a config, patch a function, re-send a tool's output), and it is
what speculative decoding's prompt lookup thrives on: almost every answer token is a copy of a
prompt token. Pure and seeded, so training, tests and the benchmark draw the same kind of cases.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "omega",
    "north",
    "south",
    "east",
    "west",
    "red",
    "green",
    "blue",
    "amber",
    "cyan",
    "river",
    "stone",
    "cloud",
    "forest",
    "ember",
    "frost",
    "orbit",
    "pixel",
    "vector",
    "kernel",
    "socket",
    "buffer",
    "cursor",
    "packet",
    "signal",
    "tensor",
    "matrix",
    "scalar",
    "bridge",
    "harbor",
    "canyon",
    "meadow",
    "summit",
    "valley",
    "falcon",
    "otter",
    "badger",
    "lynx",
]
KEYS = [
    "name",
    "id",
    "count",
    "size",
    "mode",
    "path",
    "host",
    "port",
    "user",
    "role",
    "level",
    "status",
    "owner",
    "region",
    "color",
    "label",
    "limit",
    "offset",
    "timeout",
    "retries",
    "enabled",
    "version",
    "kind",
    "target",
    "source",
    "format",
]
FUNCTIONS = [
    "load",
    "save",
    "parse",
    "render",
    "update",
    "merge",
    "split",
    "check",
    "build",
    "fetch",
    "apply",
    "reset",
]
VARIABLES = [
    "total",
    "items",
    "value",
    "result",
    "count",
    "index",
    "data",
    "text",
    "node",
    "item",
    "key",
    "acc",
]


@dataclass(frozen=True)
class CopyCase:
    """One prompt (the user's message) and the only right answer."""

    prompt: str
    answer: str


def _value(rng: random.Random) -> object:
    kind = rng.randrange(4)
    if kind == 0:
        return rng.randrange(1000)
    if kind == 1:
        return rng.choice(WORDS)
    if kind == 2:
        return rng.choice([True, False])
    return f"{rng.choice(WORDS)}-{rng.choice(WORDS)}"


def json_case(rng: random.Random) -> CopyCase:
    """A JSON object of 3-5 fields; set one of them to a new value."""
    keys = rng.sample(KEYS, rng.randint(3, 5))
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


def _code_lines(rng: random.Random) -> list[str]:
    name = rng.choice(FUNCTIONS) + "_" + rng.choice(WORDS)
    args = rng.sample(VARIABLES, rng.randint(1, 3))
    lines = [f"def {name}({', '.join(args)}):"]
    names = list(args)
    for _ in range(rng.randint(2, 4)):
        target = rng.choice(VARIABLES)
        source = rng.choice(names)
        operator = rng.choice(["+", "-", "*"])
        lines.append(f"    {target} = {source} {operator} {rng.randrange(100)}")
        names.append(target)
    lines.append(f"    return {rng.choice(names)}")
    return lines


def code_case(rng: random.Random) -> CopyCase:
    """A small Python function; replace one of its body lines."""
    lines = _code_lines(rng)
    index = rng.randrange(1, len(lines) - 1)
    target, source = rng.choice(VARIABLES), rng.choice(VARIABLES)
    replacement = f"    {target} = {source} {rng.choice(['+', '-', '*'])} {rng.randrange(100)}"
    while replacement == lines[index]:
        replacement += " + 1"
    edited = [*lines[:index], replacement, *lines[index + 1 :]]
    before, after = "\n".join(lines), "\n".join(edited)
    prompt = (
        f"Replace the line `{lines[index].strip()}` with `{replacement.strip()}`:\n```python\n{before}\n```"
    )
    return CopyCase(prompt, f"```python\n{after}\n```")


def copy_case(rng: random.Random) -> CopyCase:
    return json_case(rng) if rng.random() < 0.6 else code_case(rng)

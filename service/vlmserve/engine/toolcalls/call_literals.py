"""A JSON schema -> Lark rules for a value written in a non-JSON literal syntax: Gemma 4's tool
calls (`{key:<|"|>text<|"|>,n:1}`) and Python's (`name(key="text", n=1)`, LFM2's pythonic calls).

The rules follow the schema's shape: `type` string (an enum: its values), integer, number,
boolean, null, object (listed properties, the required ones always, in the schema's order;
without properties any keys) and array (of its `items`). Anything else (`anyOf`, a list of
types, no type) is any value of the syntax. Numbers reuse llguidance's JSON number rules, with
the schema's bounds. Keywords of strings and arrays (`maxLength`, `minItems`, ...) are not
enforced here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["GEMMA", "PYTHON", "LiteralRules", "LiteralSyntax"]

_SCALARS = ("integer", "number")


@dataclass(frozen=True, slots=True)
class LiteralSyntax:
    name: str
    # Lark rules for a string value named `rule` (the syntax's quoting), given how a marker
    # is written (its own token, or spelled out).
    string: Callable[[str, Callable[[str], str], Callable[[str], int | None]], list[str]]
    string_literal: Callable[[str], str]
    true: str
    false: str
    null: str
    # An object key as a Lark literal (Gemma: bare; Python: quoted), and `key: value`'s prefix
    # given the key's Lark expression.
    key_literal: Callable[[str], str]
    object_key: Callable[[str], str]
    separator: str


def _gemma_string(
    rule: str, marker: Callable[[str], str], token_id: Callable[[str], int | None]
) -> list[str]:
    quote = '<|"|>'
    token = token_id(quote)
    if token is not None:  # plain text never matches the quote's token
        return [f"{rule}: <[{token}]> /(.|\\n)*/ <[{token}]>"]
    return [f"{rule}: {json.dumps(quote)} {rule}_text", f"{rule}_text[lazy]: /(.|\\n)*/ {json.dumps(quote)}"]


def _python_string(
    rule: str, marker: Callable[[str], str], token_id: Callable[[str], int | None]
) -> list[str]:
    # A JSON string is a Python string literal with the same value (JSON's escapes are Python's).
    return [f'{rule}: %json {{"type": "string"}}']


GEMMA = LiteralSyntax(
    name="gemma",
    string=_gemma_string,
    string_literal=lambda value: json.dumps('<|"|>' + value + '<|"|>', ensure_ascii=False),
    true='"true"',
    false='"false"',
    null='"null"',
    key_literal=lambda key: json.dumps(key, ensure_ascii=False),
    object_key=lambda key: f'{key} ":"',
    separator='","',
)
PYTHON = LiteralSyntax(
    name="python",
    string=_python_string,
    string_literal=lambda value: json.dumps(json.dumps(value, ensure_ascii=False), ensure_ascii=False),
    true='"True"',
    false='"False"',
    null='"None"',
    key_literal=lambda key: json.dumps(json.dumps(key, ensure_ascii=False), ensure_ascii=False),
    object_key=lambda key: f'{key} ": "',
    separator='", "',
)


class LiteralRules:
    """Collects the rules of one grammar; `value(schema)` names the rule for a value."""

    def __init__(
        self, syntax: LiteralSyntax, marker: Callable[[str], str], token_id: Callable[[str], int | None]
    ) -> None:
        self.syntax = syntax
        self._marker = marker
        self._token_id = token_id
        self.lines: list[str] = []
        self._count = 0
        self._any: str | None = None

    def _new(self, stem: str) -> str:
        self._count += 1
        return f"{self.syntax.name}_{stem}{self._count}"

    def value(self, schema: Any) -> str:
        kind = schema.get("type") if isinstance(schema, dict) else None
        if isinstance(schema, dict) and isinstance(schema.get("enum"), list) and schema["enum"]:
            return self._enum(schema["enum"])
        if kind == "string":
            rule = self._new("string")
            self.lines += self.syntax.string(rule, self._marker, self._token_id)
            return rule
        if kind in _SCALARS:
            rule = self._new(kind)
            bounds = {
                k: v
                for k, v in schema.items()
                if k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
            }
            self.lines.append(f"{rule}: %json {json.dumps({'type': kind, **bounds})}")
            return rule
        if kind == "boolean":
            return self._alternatives("boolean", [self.syntax.true, self.syntax.false])
        if kind == "null":
            return self._alternatives("null", [self.syntax.null])
        if kind == "object" and isinstance(schema.get("properties"), dict) and schema["properties"]:
            rule = self._new("object")
            self.lines.append(f'{rule}: "{{" {self.members(schema)} "}}"')
            return rule
        if kind == "array":
            rule = self._new("array")
            item = self.value(schema.get("items", {}))
            sep = self.syntax.separator
            self.lines.append(f'{rule}: "[" ({item} ({sep} {item})*)? "]"')
            return rule
        return self.any_value()

    def members(self, schema: dict[str, Any]) -> str:
        """The rule for an object's `key: value` members (no braces), `separator` between."""
        required = set(schema.get("required") or ())
        items = [
            (f"{self.syntax.object_key(self.syntax.key_literal(key))} {self.value(sub)}", key in required)
            for key, sub in schema["properties"].items()
        ]
        return self.sequence(items)

    def sequence(self, items: list[tuple[str, bool]]) -> str:
        """Items in order, each (expression, required), `separator` between those written."""
        stem, sep = self._new("seq"), self.syntax.separator
        last = len(items)
        self.lines += [f'{stem}_{last}_first: ""', f'{stem}_{last}_more: ""']
        for index in range(last - 1, -1, -1):
            expression, required = items[index]
            first = f"{expression} {stem}_{index + 1}_more"
            more = f"{sep} {expression} {stem}_{index + 1}_more"
            if not required:
                first += f" | {stem}_{index + 1}_first"
                more += f" | {stem}_{index + 1}_more"
            self.lines += [f"{stem}_{index}_first: {first}", f"{stem}_{index}_more: {more}"]
        return f"{stem}_0_first"

    def any_value(self) -> str:
        if self._any is not None:
            return self._any
        name = self.syntax.name
        self._any = f"{name}_any"
        string = self._new("string")
        self.lines += self.syntax.string(string, self._marker, self._token_id)
        sep = self.syntax.separator
        key = string if name == "python" else f"{name}_key"
        self.lines += [
            f"{name}_key: /[A-Za-z_][A-Za-z0-9_.-]*/",
            f'{name}_number: %json {{"type": "number"}}',
            f"{name}_member: {self.syntax.object_key(key)} {name}_any",
            f'{name}_object: "{{" ({name}_member ({sep} {name}_member)*)? "}}"',
            f'{name}_array: "[" ({name}_any ({sep} {name}_any)*)? "]"',
            f"{name}_any: {string} | {name}_number | {self.syntax.true} | {self.syntax.false}"
            f" | {self.syntax.null} | {name}_object | {name}_array",
        ]
        return self._any

    def _enum(self, values: list[Any]) -> str:
        options = []
        for value in values:
            if isinstance(value, str):
                options.append(self.syntax.string_literal(value))
            elif isinstance(value, bool):
                options.append(self.syntax.true if value else self.syntax.false)
            elif value is None:
                options.append(self.syntax.null)
            elif isinstance(value, int | float):
                options.append(json.dumps(json.dumps(value)))
            else:
                return self.any_value()
        return self._alternatives("enum", options)

    def _alternatives(self, stem: str, options: list[str]) -> str:
        rule = self._new(stem)
        self.lines.append(f"{rule}: {' | '.join(options)}")
        return rule

"""Each tool-call format's grammar (llguidance Lark): the `calls` rule after its call-start
marker. Pure text building; `compiler.py` decides when a request gets one and checks it, and
the tool-format registry (toolcalls/registry.py) says which rules and marker a format has.

Formats: Hermes / Qwen `<tool_call>{json}</tool_call>`,
Mistral's `[TOOL_CALLS][{...}]`, Llama's bare `{"name", "parameters"}` answer, Qwen3-Coder's
XML parameters, GLM's `<arg_key>`/`<arg_value>` pairs, Gemma 4's and pythonic calls (values in
their literal syntax: call_literals.py), Kimi K2's sections, gpt-oss harmony's commentary channel;
formats without rules (mlx-vlm's minimax, longcat, ...) refuse a forced tool choice.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from vlmserve.engine.toolcalls.call_literals import GEMMA, PYTHON, LiteralRules

__all__ = [
    "LENIENT",
    "CallRules",
    "FunctionSpec",
    "MarkerSource",
    "gemma4_calls",
    "glm47_calls",
    "harmony_calls",
    "hermes_calls",
    "kimi_k2_calls",
    "llama_json_calls",
    "mistral_calls",
    "pythonic_calls",
    "qwen3_coder_calls",
    "schema_rule",
]

# Compact JSON: the only whitespace a constrained model may write inside JSON.
_JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
LENIENT: dict[str, Any] = {"lenient": True}


class MarkerSource(Protocol):
    """What call grammars need from the model's tokenizer (grammar.GrammarCompiler)."""

    def token_id(self, text: str) -> int | None: ...

    def marker(self, text: str) -> str: ...


@dataclass(frozen=True, slots=True)
class FunctionSpec:
    """An offered function tool, its arguments' schema already chosen (grammar/compiler.py)."""

    name: str
    parameters: Any
    strict: bool
    where: str


# A format's `calls` rules (toolcalls/registry.py `CallGrammar`): Lark lines for the given tools, at
# most max_calls calls (None: any number).
CallRules = Callable[[MarkerSource, Sequence[FunctionSpec], "int | None"], list[str]]


def schema_rule(schema: Any) -> str:
    """`%json {...}` with the compact-JSON options attached."""
    if not isinstance(schema, dict):
        return f"%json {json.dumps(schema)}"
    guided = dict(schema)
    guided["x-guidance"] = {**_JSON_OPTIONS, **(schema.get("x-guidance") or {})}
    return f"%json {json.dumps(guided, ensure_ascii=False)}"


def _relocated(schema: Any, home: str) -> Any:
    """`schema` with its local `$ref`s ("#...") pointing into `home`, where a copy of it will live."""
    if isinstance(schema, dict):
        return {
            key: (home + value[1:])
            if key == "$ref" and isinstance(value, str) and value.startswith("#")
            else _relocated(value, home)
            for key, value in schema.items()
        }
    if isinstance(schema, list):
        return [_relocated(value, home) for value in schema]
    return schema


def _call_schema(tools: Sequence[FunctionSpec], arguments_key: str = "arguments") -> dict[str, Any]:
    """`{"name": ..., "arguments": {...}}` for any of `tools` (the Hermes / json_tools body;
    Llama's names the arguments `parameters`).

    Each tool's parameters are nested in this wrapper, so their local references ("#/$defs/X",
    as pydantic writes them) are moved to a copy kept under the wrapper's `$defs`.
    """
    options = []
    definitions: dict[str, Any] = {}
    for index, tool in enumerate(tools):
        arguments = tool.parameters
        if "$ref" in json.dumps(arguments):
            arguments = _relocated(arguments, f"#/$defs/tool{index}")
            definitions[f"tool{index}"] = arguments
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": tool.name}, arguments_key: arguments},
                "required": ["name", arguments_key],
                "additionalProperties": False,
            }
        )
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    if definitions:
        schema = {**schema, "$defs": definitions}
    # llguidance reads options at the top only; strict tools compiled without it, so leniency
    # changes nothing for them.
    return {**schema, "x-guidance": LENIENT} if any(not tool.strict for tool in tools) else schema


def _repeat(rule: str, separator: str, count: int | None) -> str:
    """`rule` once, then up to count-1 more (unbounded when None), each after `separator`."""
    if count == 1:
        return rule
    more = "*" if count is None else f"{{0,{count - 1}}}"
    return f"{rule} ({separator} {rule}){more}"


def hermes_calls(compiler: MarkerSource, tools: Sequence[FunctionSpec], max_calls: int | None) -> list[str]:
    """`calls` after the first `<tool_call>`: `\\n{json}\\n</tool_call>`, repeated with the marker."""
    start, end = compiler.marker("<tool_call>"), compiler.marker("</tool_call>")
    return [
        # At most a newline between and after calls: a weak model cannot pad forever.
        "GAP: /\\n?/",
        f'call_body: "\\n" {schema_rule(_call_schema(tools))} "\\n" {end}',
        f"calls: {_repeat('call_body', 'GAP ' + start, max_calls)} GAP",
    ]


def mistral_calls(compiler: MarkerSource, tools: Sequence[FunctionSpec], max_calls: int | None) -> list[str]:
    """`calls` after `[TOOL_CALLS]`: one JSON array of calls (Mistral Small 3.x templates), the
    output's end. The parser also reads the `name[ARGS]{...}` form; the grammar writes one."""
    items = _call_schema(tools)
    array: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
    if max_calls is not None:
        array["maxItems"] = max_calls
    for key in ("$defs", "x-guidance"):  # document-level keys: references resolve from the top
        if key in items:
            array[key] = items.pop(key)
    return [f'calls: " "? {schema_rule(array)}']


_LLAMA_SEPARATOR = '"; "'


def llama_json_calls(
    compiler: MarkerSource, tools: Sequence[FunctionSpec], max_calls: int | None
) -> list[str]:
    """`calls` for Llama's JSON format: the whole answer, `{"name": ..., "parameters": {...}}`
    objects joined by "; " (no start marker: `_tool_grammar` handles AUTO for it)."""
    return [
        f"call_body: {schema_rule(_call_schema(tools, 'parameters'))}",
        f"calls: {_repeat('call_body', _LLAMA_SEPARATOR, max_calls)}",
    ]


@dataclass(frozen=True, slots=True)
class _XmlSyntax:
    """How a format writes parameters as text: each as `open_key(KEY)` VALUE `value_end`."""

    # A Lark expression opening the parameter named by the given Lark expression.
    open_key: Callable[[str], str]
    # The marker ending a value (its own token, or spelled out), then layout after it.
    value_end: str
    after_value: str


def _xml_value(compiler: MarkerSource, rule: str, schema: Any, syntax: _XmlSyntax) -> list[str]:
    """Rules for one parameter value: a string is raw text (an enum: one of its values), any
    other type the JSON mlx-vlm's parsers decode by the parameter's type."""
    end = f"{compiler.marker(syntax.value_end)} {json.dumps(syntax.after_value)}"
    if isinstance(schema, dict) and schema.get("type") == "string":
        if isinstance(schema.get("enum"), list) and all(isinstance(v, str) for v in schema["enum"]):
            options = " | ".join(json.dumps(value, ensure_ascii=False) for value in schema["enum"])
            return [f"{rule}: ({options}) {end}"]
        text = _text_pattern(schema)
        token = compiler.token_id(syntax.value_end)
        if token is not None:  # plain text never matches the marker's token
            return [f"{rule}: {text} <[{token}]> {json.dumps(syntax.after_value)}"]
        return [
            f"{rule}: {rule}_text {json.dumps(syntax.after_value)}",
            f"{rule}_text[lazy]: {text} {json.dumps(syntax.value_end)}",
        ]
    return [f"{rule}: {schema_rule(schema)} {end}"]


def _text_pattern(schema: dict[str, Any]) -> str:
    """A raw-text value's characters: any, as many as the schema's minLength/maxLength allow
    (a strict tool's bounds hold for text values as they do for JSON strings)."""
    low, high = schema.get("minLength"), schema.get("maxLength")
    lenient = schema.get("x-guidance") == LENIENT  # a tool that is not strict: the shape only
    if lenient or (not isinstance(low, int) and not isinstance(high, int)):
        return "/(.|\\n)*/"
    low = low if isinstance(low, int) and low > 0 else 0
    bound = str(high) if isinstance(high, int) and high >= low else ""
    return f"/(.|\\n){{{low},{bound}}}/"


def _xml_functions(
    compiler: MarkerSource, tools: Sequence[FunctionSpec], syntax: _XmlSyntax, header: Callable[[str], str]
) -> tuple[list[str], list[str]]:
    """(rules, one rule name per tool): `header(name)` then the tool's parameters in the
    schema's order, the required ones always; a tool without listed properties takes any
    names with text values."""
    lines = ["KEY: /[A-Za-z_][A-Za-z0-9_.-]*/"]
    functions = []
    for index, tool in enumerate(tools):
        schema = tool.parameters if isinstance(tool.parameters, dict) else {}
        properties = schema.get("properties")
        required = set(schema.get("required") or ())
        parameters: list[str] = []
        if isinstance(properties, dict) and properties:
            for number, (key, value_schema) in enumerate(properties.items()):
                rule = f"t{index}_p{number}"
                if isinstance(value_schema, dict) and "$defs" in schema:
                    value_schema = {**value_schema, "$defs": schema["$defs"]}
                if isinstance(value_schema, dict) and not tool.strict:
                    value_schema = {**value_schema, "x-guidance": LENIENT}
                lines += _xml_value(compiler, f"{rule}_value", value_schema, syntax)
                opened = syntax.open_key(json.dumps(key, ensure_ascii=False))
                lines.append(f"{rule}: {opened} {rule}_value")
                parameters.append(rule if key in required else f"{rule}?")
        else:
            if "any_parameter:" not in "\n".join(lines):
                lines += _xml_value(compiler, "any_value", {"type": "string"}, syntax)
                lines.append(f"any_parameter: {syntax.open_key('KEY')} any_value")
            parameters.append("any_parameter*")
        lines.append(f"function{index}: {header(tool.name)} {' '.join(parameters)}")
        functions.append(f"function{index}")
    return lines, functions


def qwen3_coder_calls(
    compiler: MarkerSource, tools: Sequence[FunctionSpec], max_calls: int | None
) -> list[str]:
    """`calls` after `<tool_call>` in Qwen3-Coder's XML form (also Qwen3.5's templates):
    `\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function>\n</tool_call>`."""
    start, end = compiler.marker("<tool_call>"), compiler.marker("</tool_call>")
    syntax = _XmlSyntax(lambda key: f'"<parameter=" {key} ">\\n"', "\n</parameter>", "\n")
    lines, functions = _xml_functions(
        compiler, tools, syntax, lambda name: json.dumps(f"<function={name}>\n", ensure_ascii=False)
    )
    return [
        "GAP: /\\n?/",
        *lines,
        f'call_body: "\\n" ({" | ".join(functions)}) "</function>\\n" {end}',
        f"calls: {_repeat('call_body', 'GAP ' + start, max_calls)} GAP",
    ]


def glm47_calls(compiler: MarkerSource, tools: Sequence[FunctionSpec], max_calls: int | None) -> list[str]:
    """`calls` after `<tool_call>` in GLM-4.5/4.6/4.7's form (GLM-4.5V / 4.6V):
    `NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>\n...</tool_call>`."""
    start, end = compiler.marker("<tool_call>"), compiler.marker("</tool_call>")
    key_open, key_close = compiler.marker("<arg_key>"), compiler.marker("</arg_key>")
    value_open = compiler.marker("<arg_value>")
    syntax = _XmlSyntax(lambda key: f'{key_open} {key} {key_close} "\\n" {value_open}', "</arg_value>", "\n")
    lines, functions = _xml_functions(
        compiler, tools, syntax, lambda name: json.dumps(f"{name}\n", ensure_ascii=False)
    )
    return [
        "GAP: /\\n?/",
        *lines,
        f"call_body: ({' | '.join(functions)}) {end}",
        f"calls: {_repeat('call_body', 'GAP ' + start, max_calls)} GAP",
    ]


def _per_tool_arguments(tools: Sequence[FunctionSpec], head: Callable[[str], str]) -> list[str]:
    """`call_choice`: one alternative per tool, `head(name)` then its arguments' JSON."""
    lines, choices = [], []
    for index, tool in enumerate(tools):
        schema = tool.parameters if tool.strict else _lenient(tool.parameters)
        lines.append(f"tool{index}: {head(tool.name)} {schema_rule(schema)}")
        choices.append(f"tool{index}")
    return [*lines, f"call_choice: {' | '.join(choices)}"]


def _lenient(schema: Any) -> Any:
    return {**schema, "x-guidance": LENIENT} if isinstance(schema, dict) else schema


def kimi_k2_calls(compiler: MarkerSource, tools: Sequence[FunctionSpec], max_calls: int | None) -> list[str]:
    """`calls` after `<|tool_calls_section_begin|>` (Kimi K2 / Kimi-VL):
    `<|tool_call_begin|>functions.NAME:N<|tool_call_argument_begin|>{json}<|tool_call_end|>`
    repeated, then `<|tool_calls_section_end|>`."""
    begin, end = compiler.marker("<|tool_call_begin|>"), compiler.marker("<|tool_call_end|>")
    arguments = compiler.marker("<|tool_call_argument_begin|>")
    section_end = compiler.marker("<|tool_calls_section_end|>")

    def head(name: str) -> str:
        return f"{json.dumps(f'functions.{name}:', ensure_ascii=False)} /[0-9]+/ {arguments}"

    return [
        *_per_tool_arguments(tools, head),
        f"call_body: {begin} call_choice {end}",
        f"calls: {_repeat('call_body', '', max_calls)} {section_end}",
    ]


def _text_until(compiler: MarkerSource, rule: str, marker: str) -> str:
    """`rule`: any text, then `marker` (its own token: plain text never matches it; spelled out:
    the text ends lazily at its first occurrence)."""
    token = compiler.token_id(marker)
    if token is not None:
        return f"{rule}: /(.|\\n)*/ <[{token}]>"
    return f"{rule}[lazy]: /(.|\\n)*/ {json.dumps(marker)}"


def harmony_calls(compiler: MarkerSource, tools: Sequence[FunctionSpec], max_calls: int | None) -> list[str]:
    """`calls` for gpt-oss harmony: optional thinking in the analysis channel, then one call
    `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{json}`; its `<|call|>`
    is an end-of-sequence token, so the grammar ends there (one call: the turn ends with it)."""
    channel, message = compiler.marker("<|channel|>"), compiler.marker("<|message|>")
    start, constrain = compiler.marker("<|start|>"), compiler.marker("<|constrain|>")

    def head(name: str) -> str:
        recipient = json.dumps(f"commentary to=functions.{name} ", ensure_ascii=False)
        return f'{channel} {recipient} {constrain} "json" {message}'

    return [
        _text_until(compiler, "analysis_text", "<|end|>"),
        f'analysis: {channel} "analysis" {message} analysis_text {start} "assistant"',
        *_per_tool_arguments(tools, head),
        "calls: analysis? call_choice",
    ]


def gemma4_calls(compiler: MarkerSource, tools: Sequence[FunctionSpec], max_calls: int | None) -> list[str]:
    """`calls` after `<|tool_call>` (Gemma 4): `call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>`,
    repeated with the marker; values in Gemma's literal syntax (call_literals.py)."""
    start, end = compiler.marker("<|tool_call>"), compiler.marker("<tool_call|>")
    rules = LiteralRules(GEMMA, compiler.marker, compiler.token_id)
    choices = []
    for index, tool in enumerate(tools):
        members = _literal_members(rules, tool, lambda key: GEMMA.object_key(GEMMA.key_literal(key)))
        rules.lines.append(f'gemma_call{index}: {json.dumps(f"call:{tool.name}{{")} {members} "}}"')
        choices.append(f"gemma_call{index}")
    return [
        *rules.lines,
        f"call_body: ({' | '.join(choices)}) {end}",
        f"calls: {_repeat('call_body', start, max_calls)}",
    ]


def pythonic_calls(compiler: MarkerSource, tools: Sequence[FunctionSpec], max_calls: int | None) -> list[str]:
    """`calls` after `<|tool_call_start|>` (LFM2 / LFM2-VL): `[name(key="text", n=1), ...]` then
    `<|tool_call_end|>`; keyword arguments as Python literals (call_literals.py)."""
    end = compiler.marker("<|tool_call_end|>")
    rules = LiteralRules(PYTHON, compiler.marker, compiler.token_id)
    choices = []
    for index, tool in enumerate(tools):
        arguments = _literal_members(rules, tool, lambda key: json.dumps(f"{key}="))
        rules.lines.append(f'python_call{index}: {json.dumps(f"{tool.name}(")} {arguments} ")"')
        choices.append(f"python_call{index}")
    return [
        *rules.lines,
        f"call_body: {' | '.join(choices)}",
        f'calls: "[" {_repeat("call_body", PYTHON.separator, max_calls)} "]" {end}',
    ]


def _literal_members(rules: LiteralRules, tool: FunctionSpec, key: Callable[[str], str]) -> str:
    """A tool's arguments as `key` + literal members (any keys when it lists no properties)."""
    schema = tool.parameters if isinstance(tool.parameters, dict) else {}
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties:
        any_value, separator = rules.any_value(), rules.syntax.separator
        member = f"{rules.syntax.name}_argument"
        if f"{member}:" not in "\n".join(rules.lines):
            rules.lines.append(f"{member}: /[A-Za-z_][A-Za-z0-9_]*/ {key('')} {any_value}")
        return f"({member} ({separator} {member})*)?"
    required = set(schema.get("required") or ())
    items = [(f"{key(name)} {rules.value(sub)}", name in required) for name, sub in properties.items()]
    return rules.sequence(items)

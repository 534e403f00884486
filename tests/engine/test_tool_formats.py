"""The tool-format registry: one record per family, checked against mlx-vlm's own modules and
against what the rest of the engine asks of it (no MLX, no model)."""

from __future__ import annotations

import json

import pytest

from tests.engine._tool_pieces import collect
from vlmserve.engine.toolcalls.parsers import (
    HermesToolCallParser,
    LlamaJsonToolCallParser,
    MarkupToolCallParser,
    PlainTextParser,
    ToolCallPiece,
)
from vlmserve.engine.toolcalls.registry import (
    FORMATS,
    HERMES_FORMAT,
    LLAMA_JSON_FORMAT,
    TEXT_TOOLS_FORMAT,
    make_parser,
    tool_format,
)

# (format, parser kind, has a call grammar, call-start marker, AUTO left free, always reasons)
RECORDS = [
    ("", PlainTextParser, False, None, False, False),
    (HERMES_FORMAT, HermesToolCallParser, True, "<tool_call>", False, False),
    (LLAMA_JSON_FORMAT, LlamaJsonToolCallParser, True, "", False, False),
    ("mistral", MarkupToolCallParser, True, "[TOOL_CALLS]", False, False),
    ("qwen3_coder", MarkupToolCallParser, True, "<tool_call>", False, False),
    ("kimi_k2", MarkupToolCallParser, True, "<|tool_calls_section_begin|>", False, False),
    ("glm47", MarkupToolCallParser, True, "<tool_call>", False, False),
    ("gemma4", MarkupToolCallParser, True, "<|tool_call>", False, False),
    ("pythonic", MarkupToolCallParser, True, "<|tool_call_start|>", False, False),
    ("harmony", MarkupToolCallParser, True, "", True, True),
    # a family only mlx-vlm knows: parsed, no grammar
    ("minimax_m2", MarkupToolCallParser, False, None, False, False),
]


@pytest.mark.parametrize(("name", "kind", "enforced", "start", "auto_free", "reasons"), RECORDS)
def test_each_family_has_one_record(
    name: str, kind: type, enforced: bool, start: str | None, auto_free: bool, reasons: bool
) -> None:
    record = tool_format(name)
    assert record.name == name
    assert type(record.parser()) is kind
    assert (record.grammar is not None) is enforced
    assert (record.grammar.start if record.grammar else None) == start
    assert record.auto_unconstrained is auto_free
    assert record.reasons is reasons


def test_every_listed_family_is_in_the_table() -> None:
    assert {name for name, *_ in RECORDS} - {"minimax_m2"} == set(FORMATS)


@pytest.mark.parametrize("name", sorted(set(FORMATS) - {"", HERMES_FORMAT, LLAMA_JSON_FORMAT}))
def test_an_mlx_vlm_family_starts_with_its_modules_markers(name: str) -> None:
    # The table names mlx-vlm's markers so the detokenizer keeps them; mlx-vlm's module is the
    # source of truth, and a drift between the two would drop a call's markup as special tokens.
    from mlx_vlm.tools import load_tool_module

    module = load_tool_module(name)
    expected = tuple(marker for marker in (module.tool_call_start, module.tool_call_end) if marker)
    assert tool_format(name).markers[: len(expected)] == expected
    parser = make_parser(name)
    assert isinstance(parser, MarkupToolCallParser)
    assert (parser.start_tag, parser.end_tag) == (module.tool_call_start, module.tool_call_end)


@pytest.mark.parametrize(
    ("name", "inner"),
    [
        ("harmony", {"<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|constrain|>", "<|return|>"}),
        ("kimi_k2", {"<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"}),
        ("glm47", {"<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"}),
        ("gemma4", {'<|"|>'}),
        (HERMES_FORMAT, {"<tool_call>", "</tool_call>"}),
        (LLAMA_JSON_FORMAT, {"<|python_start|>", "<|python_end|>"}),
        ("", set()),
    ],
)
def test_a_family_keeps_its_inner_markup(name: str, inner: set[str]) -> None:
    markers = tool_format(name).markers
    assert inner <= set(markers)
    assert len(markers) == len(set(markers))  # each once


def test_a_parser_reads_its_familys_call() -> None:
    pieces = collect(make_parser("mistral"), ['[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}}]'])
    calls = [(p.call.name, p.call.arguments) for p in pieces if isinstance(p, ToolCallPiece)]
    assert calls == [("f", '{"x": 1}')]


def test_the_text_tools_format_writes_what_its_parser_reads() -> None:
    # A template without tools is given them as this format's prompt text (template_fit.py),
    # and the output is parsed by the same record: a past call as written must parse back.
    record = tool_format(TEXT_TOOLS_FORMAT)
    assert record.prompt is not None
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    block = record.prompt.tools_block([tool])
    assert '{"type": "function", "function": {"name": "f"' in block
    assert record.markers[0] in block
    text = record.prompt.call({"function": {"name": "f", "arguments": '{"x": 1}'}})
    pieces = collect(record.parser(), [text])
    calls = [(p.call.name, json.loads(p.call.arguments)) for p in pieces if isinstance(p, ToolCallPiece)]
    assert calls == [("f", {"x": 1})]
    assert record.prompt.result("a.txt") == "<tool_response>\na.txt\n</tool_response>"


def test_only_formats_with_prompt_text_have_a_prompt() -> None:
    assert [name for name, record in FORMATS.items() if record.prompt is not None] == [HERMES_FORMAT]


def test_an_unknown_family_is_refused() -> None:
    with pytest.raises(ValueError):
        tool_format("no_such_family")

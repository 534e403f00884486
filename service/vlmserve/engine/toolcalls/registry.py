"""The tool-call format registry: one record per family, and the only place that knows one.

A record holds what the rest of the engine asks of a format: the markup its calls are written
with (the detokenizer keeps those tokens as text, model.py), a fresh streaming parser
(output/assembler.py), the grammar of its calls for an enforced `tool_choice`
(grammar/compiler.py), whether an AUTO choice is left unconstrained, and whether the format's
output always may carry reasoning, and how its tools, calls and results are written as plain
prompt text where a chat template renders none of them (template_fit.py). Everything else
names a format by its `name` and looks it up here (`tool_format`).

The family is chosen the way mlx-vlm's server chooses it (`mlx_vlm.tools` registry: the chat
template's markers, `format_for_model`). Families listed in `FORMATS` are the ones we know
beyond mlx-vlm (a call grammar, inner markup, our own parser); any other mlx-vlm parser name
(minimax, longcat, ...) gets a plain record from its mlx-vlm module: parsed, but no grammar.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vlmserve.engine.toolcalls import call_grammars as grammars
from vlmserve.engine.toolcalls import harmony
from vlmserve.engine.toolcalls.call_grammars import CallRules
from vlmserve.engine.toolcalls.parsers import (
    DEFAULT_MAX_CALL_CHARS,
    LLAMA_PYTHON_END,
    LLAMA_PYTHON_START,
    HermesToolCallParser,
    LlamaJsonToolCallParser,
    MarkupToolCallParser,
    PlainTextParser,
    ToolCallParser,
    module_body_parser,
)

__all__ = [
    "FORMATS",
    "HERMES_FORMAT",
    "LLAMA_JSON_FORMAT",
    "TEXT_TOOLS_FORMAT",
    "CallGrammar",
    "ToolFormat",
    "ToolPrompt",
    "format_for_model",
    "make_parser",
    "tool_format",
]

HERMES_FORMAT = "hermes"
# The format a chat template that renders no tools is given them in (as prompt text, its
# `prompt` record) and whose calls are then parsed from the output.
TEXT_TOOLS_FORMAT = HERMES_FORMAT
# Llama 3.x / 4 templates: the whole answer is the call, bare JSON with `parameters` (ours:
# mlx-vlm has no parser for it).
LLAMA_JSON_FORMAT = "llama_json"
_LLAMA_JSON_TEMPLATE_MARKER = '"parameters": dictionary of argument name and its value'

# Model families whose chat templates use `<tool_call>{json}</tool_call>` (Qwen2/2.5/3, Hermes).
_HERMES_FAMILIES = frozenset(
    {"qwen2", "qwen2_vl", "qwen2_5_vl", "qwen2_5_omni", "qwen3", "qwen3_vl", "qwen3_vl_moe", "qwen3_moe"}
)

# (max_call_chars, offered tools in chat-template form) -> a fresh per-request parser.
ParserFactory = Callable[[int, Sequence[dict[str, Any]]], ToolCallParser]


@dataclass(frozen=True, slots=True)
class CallGrammar:
    """How a format's calls are enforced: the call-start marker ("" when the calls are the
    whole answer) and the `calls` rules that follow it (toolcalls/call_grammars.py)."""

    start: str
    rules: CallRules


@dataclass(frozen=True, slots=True)
class ToolPrompt:
    """A format's tool knowledge as prompt text, for a chat template that renders no tools: the
    tools' description for the system turn, a past call as assistant text, a tool result as
    user-turn text (what the format's own templates write)."""

    tools_block: Callable[[Sequence[Mapping[str, Any]]], str]
    call: Callable[[Mapping[str, Any]], str]
    result: Callable[[str], str]


@dataclass(frozen=True, slots=True)
class ToolFormat:
    name: str
    # The marker strings its calls are written with, start and end first (the detokenizer keeps
    # them as text even where the tokenizer calls them special).
    markers: tuple[str, ...]
    new_parser: ParserFactory
    # None: a forced tool choice is refused for this format.
    grammar: CallGrammar | None = None
    # AUTO is left free (calls still parsed): harmony's AUTO text runs through channels a
    # plain-text grammar cannot follow.
    auto_unconstrained: bool = False
    # Its output may always carry reasoning, whatever the template (harmony's analysis channel).
    reasons: bool = False
    # None: its tools cannot be written into a prompt without the template's help.
    prompt: ToolPrompt | None = None

    def parser(
        self, *, max_call_chars: int = DEFAULT_MAX_CALL_CHARS, tools: Sequence[dict[str, Any]] = ()
    ) -> ToolCallParser:
        return self.new_parser(max_call_chars, tools)


def _hermes_tools_block(tools: Sequence[Mapping[str, Any]]) -> str:
    """Qwen2.5's tool instructions (the text its template writes into the system turn)."""
    lines = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
        f"{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def _hermes_call(call: Mapping[str, Any]) -> str:
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    arguments_text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return (
        '<tool_call>\n{"name": '
        + json.dumps(function["name"], ensure_ascii=False)
        + (f', "arguments": {arguments_text}}}\n</tool_call>')
    )


def _hermes_result(content: str) -> str:
    return f"<tool_response>\n{content}\n</tool_response>"


def _mlx_vlm_module(name: str) -> Any:
    from mlx_vlm import tools

    load_tool_module: Any = tools.load_tool_module  # unannotated in mlx-vlm
    return load_tool_module(name)  # ValueError for an unknown name


def _mlx_vlm_parser(
    name: str, inner: tuple[str, ...] = (), paired: tuple[tuple[str, str], ...] = ()
) -> ParserFactory:
    """mlx-vlm's family `name`: our streaming markup parser around its `parse_tool_call`."""

    def new_parser(max_call_chars: int, tools: Sequence[dict[str, Any]]) -> ToolCallParser:
        module = _mlx_vlm_module(name)
        return MarkupToolCallParser(
            module.tool_call_start,
            module.tool_call_end,
            module_body_parser(module.parse_tool_call, list(tools) or None),
            max_call_chars=max_call_chars,
            inner_markers=inner,
            paired=paired,
        )

    return new_parser


def _mlx_vlm_format(
    name: str,
    start: str,
    end: str,
    inner: tuple[str, ...] = (),
    grammar: CallGrammar | None = None,
    *,
    auto_unconstrained: bool = False,
    reasons: bool = False,
    paired: tuple[tuple[str, str], ...] = (),
) -> ToolFormat:
    """A family mlx-vlm parses; `start`/`end` are its module's markers (a test checks them),
    `inner` the markup inside a call its parser reads (single tokens in their vocabularies),
    `paired` the inner markup that opens and closes (a call's end tag inside an argument leaves
    it unpaired: the parser looks for a later one)."""
    markers = tuple(dict.fromkeys(marker for marker in (start, end, *inner) if marker))
    new_parser = _mlx_vlm_parser(name, inner, paired)
    return ToolFormat(name, markers, new_parser, grammar, auto_unconstrained, reasons)


FORMATS: dict[str, ToolFormat] = {
    record.name: record
    for record in (
        ToolFormat(
            "",  # no format, or tools disabled for the request: text passes through
            (),
            lambda max_call_chars, tools: PlainTextParser(),
        ),
        ToolFormat(
            HERMES_FORMAT,
            ("<tool_call>", "</tool_call>"),
            lambda max_call_chars, tools: HermesToolCallParser(max_call_chars=max_call_chars),
            CallGrammar("<tool_call>", grammars.hermes_calls),
            prompt=ToolPrompt(_hermes_tools_block, _hermes_call, _hermes_result),
        ),
        ToolFormat(
            LLAMA_JSON_FORMAT,
            (LLAMA_PYTHON_START, LLAMA_PYTHON_END),
            lambda max_call_chars, tools: LlamaJsonToolCallParser(max_call_chars=max_call_chars),
            CallGrammar("", grammars.llama_json_calls),
        ),
        _mlx_vlm_format(
            "mistral", "[TOOL_CALLS]", "", grammar=CallGrammar("[TOOL_CALLS]", grammars.mistral_calls)
        ),
        _mlx_vlm_format(
            "qwen3_coder",
            "<tool_call>",
            "</tool_call>",
            grammar=CallGrammar("<tool_call>", grammars.qwen3_coder_calls),
            paired=(("<function=", "</function>"),),
        ),
        _mlx_vlm_format(
            "kimi_k2",
            "<|tool_calls_section_begin|>",
            "<|tool_calls_section_end|>",
            ("<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"),
            CallGrammar("<|tool_calls_section_begin|>", grammars.kimi_k2_calls),
            paired=(("<|tool_call_begin|>", "<|tool_call_end|>"),),
        ),
        _mlx_vlm_format(
            "glm47",
            "<tool_call>",
            "</tool_call>",
            ("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
            CallGrammar("<tool_call>", grammars.glm47_calls),
            paired=(("<arg_key>", "</arg_key>"), ("<arg_value>", "</arg_value>")),
        ),
        _mlx_vlm_format(
            "gemma4",
            "<|tool_call>",
            "<tool_call|>",
            ('<|"|>',),  # its string quote
            CallGrammar("<|tool_call>", grammars.gemma4_calls),
            paired=(('<|"|>', '<|"|>'),),
        ),
        _mlx_vlm_format(
            "pythonic",
            "<|tool_call_start|>",
            "<|tool_call_end|>",
            grammar=CallGrammar("<|tool_call_start|>", grammars.pythonic_calls),
        ),
        _mlx_vlm_format(
            "harmony",
            "<|channel|>commentary to=",
            "<|call|>",
            harmony.HARMONY_MARKERS,  # its message framing, which toolcalls/harmony.py reads
            CallGrammar("", grammars.harmony_calls),
            auto_unconstrained=True,
            reasons=True,
        ),
    )
}


@functools.cache
def tool_format(name: str) -> ToolFormat:
    """The record of format `name` (a parser name; "" for none). A name only mlx-vlm knows gets
    its markers from mlx-vlm's module and no grammar; an unknown one is a ValueError."""
    if name in FORMATS:
        return FORMATS[name]
    module = _mlx_vlm_module(name)
    return _mlx_vlm_format(name, module.tool_call_start, module.tool_call_end)


def make_parser(
    name: str, *, max_call_chars: int = DEFAULT_MAX_CALL_CHARS, tools: Sequence[dict[str, Any]] = ()
) -> ToolCallParser:
    """A fresh per-request parser for format `name`. `tools` (chat-template form) lets mlx-vlm's
    parsers type text arguments by their schema."""
    return tool_format(name).parser(max_call_chars=max_call_chars, tools=tools)


def format_for_model(model_type: str, chat_template: str | None) -> str:
    """The format name for a model ("" if none): Qwen families are Hermes; otherwise the mlx-vlm
    parser its chat template selects (`mlx_vlm.tools.registry`), json_tools being Hermes."""
    if model_type in _HERMES_FAMILIES:
        return HERMES_FORMAT
    if not chat_template:
        return ""
    from mlx_vlm.tools import _infer_tool_parser

    name = _infer_tool_parser(chat_template)
    if name == "json_tools" or (name is None and "<tool_call>" in chat_template):
        return HERMES_FORMAT
    if name is None and _LLAMA_JSON_TEMPLATE_MARKER in chat_template:
        return LLAMA_JSON_FORMAT
    return name or ""

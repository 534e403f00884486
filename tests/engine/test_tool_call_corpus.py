"""Hostile model output through every registered tool-call format (issue 39.9): arguments holding
`</parameter>`, `</tool_call>`, the format's own end marker, unbalanced braces and quotes; several
calls in one turn; a call cut mid-string; malformed bodies. Whole, by character and in pieces of
7: never an exception, never a marker of the format in visible text, every well-formed call
arrives with its name (and, where the format can write the value at all, its exact arguments),
and a malformed call is reported as a call when it names one (its arguments as written) or as its
text without the markup."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from vlmserve.engine.toolcalls.parsers import Piece, TextPiece, ToolCallDeltaPiece, ToolCallPiece
from vlmserve.engine.toolcalls.registry import FORMATS, make_parser, tool_format

Call = tuple[str, dict[str, str]]


def _hermes(calls: list[Call]) -> str:
    return "".join(
        "<tool_call>\n" + json.dumps({"name": n, "arguments": a}) + "\n</tool_call>\n" for n, a in calls
    )


def _llama(calls: list[Call]) -> str:
    return "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)


def _mistral(calls: list[Call]) -> str:
    return "[TOOL_CALLS]" + json.dumps([{"name": n, "arguments": a} for n, a in calls])


def _qwen3_coder(calls: list[Call]) -> str:
    return "".join(
        f"<tool_call>\n<function={n}>\n"
        + "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in a.items())
        + "</function>\n</tool_call>\n"
        for n, a in calls
    )


def _kimi(calls: list[Call]) -> str:
    return (
        "<|tool_calls_section_begin|>"
        + "".join(
            f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{json.dumps(a)}<|tool_call_end|>"
            for i, (n, a) in enumerate(calls)
        )
        + "<|tool_calls_section_end|>"
    )


def _glm(calls: list[Call]) -> str:
    return "".join(
        f"<tool_call>{n}"
        + "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in a.items())
        + "</tool_call>"
        for n, a in calls
    )


def _gemma(calls: list[Call]) -> str:
    return "".join(
        f"<|tool_call>call:{n}{{" + ",".join(f'{k}:<|"|>{v}<|"|>' for k, v in a.items()) + "}<tool_call|>"
        for n, a in calls
    )


def _pythonic(calls: list[Call]) -> str:
    inner = ", ".join(
        f"{n}(" + ", ".join(f"{k}={json.dumps(v)}" for k, v in a.items()) + ")" for n, a in calls
    )
    return f"<|tool_call_start|>[{inner}]<|tool_call_end|>"


def _harmony(calls: list[Call]) -> str:
    return "".join(
        f"<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>{json.dumps(a)}<|call|>"
        for n, a in calls
    )


WRITERS: dict[str, Callable[[list[Call]], str]] = {
    "hermes": _hermes,
    "llama_json": _llama,
    "mistral": _mistral,
    "qwen3_coder": _qwen3_coder,
    "kimi_k2": _kimi,
    "glm47": _glm,
    "gemma4": _gemma,
    "pythonic": _pythonic,
    "harmony": _harmony,
}

HOSTILE_VALUES = {
    "</parameter>": "a</parameter>b",
    "</tool_call>": "x</tool_call>y",
    "unbalanced braces": "{{{ [ ( }}",
    "quotes and backslashes": 'say "hi" \\ then',
    "every marker": None,  # the format's own markers, filled in per format
}
# Values a format cannot write unambiguously (its grammar has no escape for them): the call must
# still arrive by name with no markup leaked, but its value may be cut where the format is.
UNWRITABLE = {
    ("qwen3_coder", "</parameter>"),
    ("qwen3_coder", "every marker"),
    ("gemma4", "unbalanced braces"),
    ("gemma4", "every marker"),
    ("glm47", "every marker"),
    ("kimi_k2", "every marker"),
    ("pythonic", "every marker"),
    ("mistral", "every marker"),
}
SPLITS = {"whole": 0, "by_char": 1, "by_7": 7}
# Formats with no end tag: a call is the rest of the output.
RUN_TO_THE_END = {"llama_json", "mistral"}


def feed(format_name: str, text: str, split: str) -> list[Piece]:
    parser = make_parser(format_name)
    size = SPLITS[split]
    chunks = [text] if not size else [text[i : i + size] for i in range(0, len(text), size)]
    pieces: list[Piece] = []
    for chunk in chunks:
        pieces.extend(parser.feed(chunk))
    pieces.extend(parser.finish())
    return pieces


def visible(pieces: list[Piece]) -> str:
    return "".join(p.text for p in pieces if isinstance(p, TextPiece))


def calls(pieces: list[Piece]) -> list[tuple[str, Any]]:
    out = []
    for piece in pieces:
        if isinstance(piece, ToolCallPiece):
            try:
                arguments: Any = json.loads(piece.call.arguments)
            except ValueError:
                arguments = piece.call.arguments  # malformed: as written
            out.append((piece.call.name, arguments))
    return out


def assert_no_markup(format_name: str, pieces: list[Piece]) -> None:
    text = visible(pieces)
    for marker in tool_format(format_name).markers:
        assert marker not in text, (marker, text)


FORMAT_NAMES = sorted(name for name in FORMATS if name)


def test_every_registered_format_has_a_writer() -> None:
    assert sorted(WRITERS) == FORMAT_NAMES


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("value_kind", HOSTILE_VALUES)
@pytest.mark.parametrize("format_name", FORMAT_NAMES)
def test_hostile_argument_values(format_name: str, value_kind: str, split: str) -> None:
    value = HOSTILE_VALUES[value_kind] or "|".join(tool_format(format_name).markers)
    text = WRITERS[format_name]([("lookup", {"q": value})])
    pieces = feed(format_name, text, split)
    assert_no_markup(format_name, pieces)
    got = calls(pieces)
    assert [name for name, _ in got] == ["lookup"], pieces
    if (format_name, value_kind) not in UNWRITABLE:
        assert got == [("lookup", {"q": value})]
    assert visible(pieces).strip() == ""


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("format_name", FORMAT_NAMES)
def test_several_calls_in_one_turn(format_name: str, split: str) -> None:
    brace = "a b" if (format_name, "unbalanced braces") in UNWRITABLE else "a}b"
    written = [("first", {"q": brace}), ("second", {"q": "</tool_call>"}), ("third", {})]
    pieces = feed(format_name, WRITERS[format_name](written), split)
    assert_no_markup(format_name, pieces)
    assert calls(pieces) == written


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("format_name", FORMAT_NAMES)
def test_a_call_cut_mid_string_is_never_text(format_name: str, split: str) -> None:
    text = WRITERS[format_name]([("lookup", {"q": "a long value that the token limit cuts"})])
    cut = text[: text.index("token limit")]
    pieces = feed(format_name, cut, split)
    assert_no_markup(format_name, pieces)
    if format_name in RUN_TO_THE_END:
        # Calls that run to the end of the output: cut short they are no call, and this parser
        # cannot tell a cut one from a malformed one: their text, without the markup.
        assert visible(pieces) == cut.replace("[TOOL_CALLS]", "")
    else:
        # Nothing of the call is an answer; a format that streams it leaves it begun (incomplete).
        assert visible(pieces) == ""


MALFORMED = [
    # (format, output, expected calls, expected visible text)
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": "x}</tool_call>', [("f", '{"a": "x')], ""),
    (
        "hermes",
        '<tool_call>{"name": "f", "arguments": {"a": 1}</tool_call> after',
        [("f", '{"a": 1')],
        " after",
    ),
    ("hermes", "<tool_call>not json at all</tool_call>", [], "not json at all"),
    ("hermes", '<tool_call>{"name": "f"</tool_call>', [("f", "")], ""),
    ("glm47", "<tool_call>I will check</tool_call>", [], "I will check"),
    ("mistral", "[TOOL_CALLS]not a call", [], "not a call"),
    ("qwen3_coder", "<tool_call>\nno function here\n</tool_call>", [], "\nno function here\n"),
    ("kimi_k2", "<|tool_calls_section_begin|>junk<|tool_calls_section_end|>", [], "junk"),
]


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize(("format_name", "text", "expected_calls", "expected_text"), MALFORMED)
def test_malformed_calls_are_reported_never_leaked(
    format_name: str, text: str, expected_calls: list[tuple[str, str]], expected_text: str, split: str
) -> None:
    pieces = feed(format_name, text, split)
    assert_no_markup(format_name, pieces)
    got = [(p.call.name, p.call.arguments) for p in pieces if isinstance(p, ToolCallPiece)]
    assert got == expected_calls
    assert visible(pieces) == expected_text
    # A streamed call's deltas add up to the call it ends as.
    streamed: dict[str, str] = {}
    for piece in pieces:
        if isinstance(piece, ToolCallDeltaPiece):
            streamed[piece.id] = streamed.get(piece.id, "") + piece.arguments
        elif isinstance(piece, ToolCallPiece) and piece.call.id in streamed:
            assert streamed.pop(piece.call.id) == piece.call.arguments


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("format_name", sorted(set(FORMAT_NAMES) - RUN_TO_THE_END))
def test_an_over_long_call_is_text_without_markup_and_the_next_call_still_parses(
    format_name: str, split: str
) -> None:
    text = (
        WRITERS[format_name]([("big", {"q": "a" * 400})]) + " then " + WRITERS[format_name]([("small", {})])
    )
    parser = make_parser(format_name, max_call_chars=200)
    size = SPLITS[split]
    chunks = [text] if not size else [text[i : i + size] for i in range(0, len(text), size)]
    pieces: list[Piece] = [piece for chunk in chunks for piece in parser.feed(chunk)] + parser.finish()
    assert_no_markup(format_name, pieces)
    assert [name for name, _ in calls(pieces)] == ["small"]
    assert "a" * 400 in visible(pieces)  # given back, not dropped

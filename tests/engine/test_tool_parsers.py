"""Streaming tool-call parsing: markup never leaks as text, calls arrive whole, splits do not matter."""

from __future__ import annotations

import json
import time

import pytest

from tests.engine._tool_pieces import collect
from vlmserve.engine.toolcalls.parsers import (
    HermesToolCallParser,
    Piece,
    PlainTextParser,
    TextPiece,
    ToolCallDeltaPiece,
    ToolCallPiece,
)
from vlmserve.engine.toolcalls.registry import HERMES_FORMAT, format_for_model, make_parser

CALL_LS = '<tool_call>\n{"name": "shell", "arguments": {"cmd": ["ls", "-l"]}}\n</tool_call>'
CALL_READ = '<tool_call>\n{"name": "read", "arguments": {"path": "a.txt"}}\n</tool_call>'


def summary(pieces: list[Piece]) -> list[tuple[str, str]]:
    """Pieces as comparable tuples; call ids are random, arguments compared as JSON."""
    out: list[tuple[str, str]] = []
    streamed: dict[str, str] = {}
    for piece in pieces:
        if isinstance(piece, TextPiece):
            out.append(("text", piece.text))
        elif isinstance(piece, ToolCallDeltaPiece):
            streamed[piece.id] = streamed.get(piece.id, "") + piece.arguments
        else:
            assert isinstance(piece, ToolCallPiece)
            assert piece.call.id.startswith("call_")
            out.append((piece.call.name, json.dumps(json.loads(piece.call.arguments), sort_keys=True)))
            # Streamed arguments add up to the call's.
            assert streamed.pop(piece.call.id, piece.call.arguments) == piece.call.arguments
    return out


def args(**kwargs: object) -> str:
    return json.dumps(kwargs, sort_keys=True)


CASES = [
    ("plain text", "Hello there.", [("text", "Hello there.")]),
    ("one call", CALL_LS, [("shell", args(cmd=["ls", "-l"]))]),
    (
        "text then call",
        "Let me look.\n" + CALL_LS,
        [("text", "Let me look.\n"), ("shell", args(cmd=["ls", "-l"]))],
    ),
    (
        "two calls, whitespace between dropped",
        CALL_LS + "\n" + CALL_READ + "\n",
        [("shell", args(cmd=["ls", "-l"])), ("read", args(path="a.txt"))],
    ),
    ("text after a call kept", CALL_LS + "\nDone.", [("shell", args(cmd=["ls", "-l"])), ("text", "\nDone.")]),
    (
        "invalid JSON body: its text, without the markup",
        "<tool_call>\n{not json}\n</tool_call>",
        [("text", "\n{not json}\n")],
    ),
    (
        "body without a name: its text, without the markup",
        '<tool_call>{"arguments": {}}</tool_call>',
        [("text", '{"arguments": {}}')],
    ),
    # A call cut off is never text (test_a_call_cut_off_is_never_text).
    ("unfinished call is not text", 'a <tool_call>\n{"name": "x"', [("text", "a ")]),
    ("near-miss tag is text", "a <tool_cal b", [("text", "a <tool_cal b")]),
    ("stray end tag is text", "x </tool_call> y", [("text", "x </tool_call> y")]),
    (
        "arguments given as a JSON string",
        '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',
        [("f", args(a=1))],
    ),
    ("missing arguments mean {}", '<tool_call>{"name": "f"}</tool_call>', [("f", args())]),
    (
        "unicode survives",
        '<tool_call>{"name": "f", "arguments": {"q": "é ü 日本"}}</tool_call>',
        [("f", args(q="é ü 日本"))],
    ),
]


@pytest.mark.parametrize(("name", "text", "expected"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("split", ["whole", "by_char", "by_3"])
def test_hermes_parser(name: str, text: str, expected: list[tuple[str, str]], split: str) -> None:
    if split == "whole":
        chunks = [text]
    elif split == "by_char":
        chunks = list(text)
    else:
        chunks = [text[i : i + 3] for i in range(0, len(text), 3)]
    assert summary(collect(HermesToolCallParser(), chunks)) == expected


def test_markup_is_never_streamed_before_it_is_decided() -> None:
    parser = HermesToolCallParser()
    streamed = ""
    for char in "ok " + CALL_LS:
        for piece in parser.feed(char):
            if isinstance(piece, TextPiece):
                streamed += piece.text
    assert streamed == "ok "
    assert "<" not in streamed


def test_call_is_emitted_the_moment_its_end_tag_arrives() -> None:
    parser = HermesToolCallParser()
    # Only its streamed arguments before the end tag (the outer brace held back).
    before = parser.feed(CALL_LS[:-1])
    assert all(isinstance(piece, ToolCallDeltaPiece) for piece in before)
    assert (
        "".join(p.arguments for p in before if isinstance(p, ToolCallDeltaPiece)) == '{"cmd": ["ls", "-l"]}'
    )
    pieces = parser.feed(CALL_LS[-1])
    assert len(pieces) == 1 and isinstance(pieces[0], ToolCallPiece)
    assert pieces[0].call.arguments == '{"cmd": ["ls", "-l"]}'


@pytest.mark.parametrize("cut", range(1, len(CALL_READ)))
def test_arguments_stream_as_they_arrive(cut: int) -> None:
    parser = HermesToolCallParser()
    pieces = parser.feed(CALL_READ[:cut]) + parser.feed(CALL_READ[cut:]) + parser.finish()
    deltas = [p for p in pieces if isinstance(p, ToolCallDeltaPiece)]
    (call,) = [p.call for p in pieces if isinstance(p, ToolCallPiece)]
    assert call.arguments == '{"path": "a.txt"}'
    # Streamed once the first piece holds the call's head (and not its end: then it is whole).
    head_seen = cut > CALL_READ.index('"arguments": ') + len('"arguments": ')
    assert bool(deltas) == (head_seen and cut < len(CALL_READ))
    if deltas:
        assert deltas[0].name == "read" and all(d.id == call.id for d in deltas)
        assert "".join(d.arguments for d in deltas) == call.arguments


@pytest.mark.parametrize("cut", range(len("<tool_call>"), len(CALL_READ) - len("</tool_call>")))
def test_a_call_cut_off_is_never_text(cut: int) -> None:
    """The output ends inside a call (the token limit): its markup never becomes text. A call
    whose name was written stays the call its deltas began (the facade shows it `incomplete`),
    its arguments as far as written; before the name, nothing is left of it."""
    parser = HermesToolCallParser()
    pieces = parser.feed("Sure. " + CALL_READ[:cut]) + parser.finish()
    assert [p.text for p in pieces if isinstance(p, TextPiece)] == ["Sure. "]
    assert [p for p in pieces if isinstance(p, ToolCallPiece)] == []
    deltas = [p for p in pieces if isinstance(p, ToolCallDeltaPiece)]
    named = cut >= CALL_READ.index('"read"') + len('"read"')
    assert bool(deltas) == named
    if deltas:
        assert deltas[0].name == "read" and {d.id for d in deltas} == {deltas[0].id}
        arguments = "".join(d.arguments for d in deltas)
        assert '{"path": "a.txt"}'.startswith(arguments)


def test_a_call_written_arguments_first_arrives_whole() -> None:
    text = '<tool_call>{"arguments": {"a": 1}, "name": "f"}</tool_call>'
    pieces = collect(HermesToolCallParser(), list(text))
    assert [type(p) for p in pieces] == [ToolCallPiece]


def test_over_long_call_is_given_back_as_text_and_bounded() -> None:
    parser = HermesToolCallParser(max_call_chars=100)
    body = '{"name": "f", "arguments": {"x": "' + "a" * 500 + '"}}'
    pieces = collect(parser, ["<tool_call>", body[:200], body[200:], "</tool_call>"])
    assert summary(pieces) == [("text", body)]  # its text, never its markup


def test_feeding_is_linear_in_the_input() -> None:
    """A long call fed one character at a time must not rescan the whole buffer each time."""
    body = '{"name": "f", "arguments": {"x": "' + "b" * 200_000 + '"}}'
    parser = HermesToolCallParser()
    calls = 0
    # CPU time of this process, not wall time: other work on a loaded machine does not count.
    started = time.process_time()
    for char in "<tool_call>" + body + "</tool_call>":
        calls += sum(isinstance(p, ToolCallPiece) for p in parser.feed(char))
    assert calls == 1
    # Rescanning the buffer per character would be ~2e10 steps (minutes); linear is well under a second.
    assert time.process_time() - started < 5


def test_plain_parser_passes_markup_through() -> None:
    assert summary(collect(PlainTextParser(), [CALL_LS])) == [("text", CALL_LS)]


@pytest.mark.parametrize(
    ("model_type", "template", "expected"),
    [
        ("qwen2_vl", None, HERMES_FORMAT),
        ("qwen2_5_vl", "", HERMES_FORMAT),
        ("llava", "{{ '<tool_call>' }}", HERMES_FORMAT),
        ("llava", "{{ messages }}", ""),
        ("paligemma", None, ""),
        # Chosen by mlx-vlm's registry from the template's markers.
        ("mistral3", "{{ '[TOOL_CALLS]' + tool_calls|tojson }}", "mistral"),
        ("gemma4", "{{ '<|tool_call>call:' }}", "gemma4"),
        ("gpt_oss", "<|channel|>commentary to=functions.x <|call|>", "harmony"),
        ("llava", "{{ '<tool_call>' }}{{ tool_call.name }}", HERMES_FORMAT),  # json_tools = Hermes
        ("qwen3_5", "<tool_call>\n<function=f>", "qwen3_coder"),
        ("llama4", "{{ '\"parameters\": dictionary of argument name and its value' }}", "llama_json"),
    ],
)
def test_format_is_chosen_per_family(model_type: str, template: str | None, expected: str) -> None:
    assert format_for_model(model_type, template) == expected


# Other families: mlx-vlm's body decoders inside our streaming wrapper.
FAMILY_CASES = [
    (
        "mistral name[ARGS] form runs to the end",
        "mistral",
        'Checking. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        [("text", "Checking. "), ("get_weather", args(city="Paris"))],
    ),
    (
        "mistral JSON array, two calls",
        "mistral",
        '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]',
        [("a", args(x=1)), ("b", args())],
    ),
    (
        "mistral malformed call: its text, without the markup",
        "mistral",
        "[TOOL_CALLS]not a call",
        [("text", "not a call")],
    ),
    (
        "harmony commentary call",
        "harmony",
        '<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>{"q": "x"}<|call|>',
        [("lookup", args(q="x"))],
    ),
    (
        "qwen3_coder XML call",
        "qwen3_coder",
        "<tool_call>\n<function=shell>\n<parameter=cmd>\nls\n</parameter>\n</function>\n</tool_call>",
        [("shell", args(cmd="ls"))],
    ),
    ("plain text passes", "gemma4", "No calls here.", [("text", "No calls here.")]),
    ("glm call without arguments", "glm47", "<tool_call>get_time</tool_call>", [("get_time", args())]),
    (
        "glm free text in call markup is text (without the markup)",
        "glm47",
        "<tool_call>I will check the weather</tool_call>",
        [("text", "I will check the weather")],
    ),
    (
        "glm non-call JSON is text (without the markup)",
        "glm47",
        '<tool_call>{"a": 1}</tool_call>',
        [("text", '{"a": 1}')],
    ),
    # Llama's bare JSON (ours): the whole answer is the calls.
    (
        "llama JSON call",
        "llama_json",
        '{"name": "shell", "parameters": {"cmd": "ls"}}',
        [("shell", args(cmd="ls"))],
    ),
    (
        "llama JSON calls in python markers, ;-separated",
        "llama_json",
        ' <|python_start|>{"name": "a", "parameters": {}}; '
        '{"name": "b", "parameters": {"x": 1}}<|python_end|>',
        [("a", args()), ("b", args(x=1))],
    ),
    (
        "llama JSON answer that is no call stays text",
        "llama_json",
        '{"name": "Bob", "age": 3}',
        [("text", '{"name": "Bob", "age": 3}')],
    ),
    (
        "llama JSON call then words is text",
        "llama_json",
        '{"name": "a", "parameters": {}} and more',
        [("text", '{"name": "a", "parameters": {}} and more')],
    ),
    ("llama text streams", "llama_json", "Hello {there}", [("text", "Hello {there}")]),
]


@pytest.mark.parametrize(
    ("name", "tool_format", "text", "expected"), FAMILY_CASES, ids=[c[0] for c in FAMILY_CASES]
)
@pytest.mark.parametrize("split", ["whole", "by_char"])
def test_family_parsers_stream(
    name: str, tool_format: str, text: str, expected: list[tuple[str, str]], split: str
) -> None:
    chunks = [text] if split == "whole" else list(text)
    assert summary(collect(make_parser(tool_format), chunks)) == expected


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError):
        make_parser("no_such_family")


def test_llama_text_is_streamed_while_a_call_is_held() -> None:
    parser = make_parser("llama_json")
    assert parser.feed("  ") == [] and parser.feed("Hi") == [TextPiece("  Hi")]
    held = make_parser("llama_json")
    assert held.feed('{"name": "a", ') == [] and held.feed('"parameters": {}}') == []
    assert [type(p) for p in held.finish()] == [ToolCallPiece]


def test_an_over_long_llama_call_is_text() -> None:
    parser = make_parser("llama_json", max_call_chars=10)
    assert parser.feed('{"name": "a", "parameters": {}}') == [TextPiece('{"name": "a", "parameters": {}}')]
    assert parser.feed(" more") == [TextPiece(" more")]

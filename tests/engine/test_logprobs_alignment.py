"""LogprobTrace + OutputAssembler (pure): listed tokens spell the visible text, each at most once.

Tokens are given as the raw text the detokenizer gave each ("" for one ending inside a
character); the table covers what holds text back or drops it.
"""

from __future__ import annotations

from typing import Any

import pytest

from vlmserve.engine.loop.logprobs import LogprobTrace, TokenScore
from vlmserve.engine.output.assembler import OutputAssembler


def run(tokens: list[str], flushed: str = "", **assembler: Any) -> tuple[OutputAssembler, list[list[str]]]:
    """Feed the tokens (logprob = -index, to tell them apart); returns the assembler and, per
    text piece emitted (and a last "" piece for tokens settled at the end), its tokens' texts."""
    out = OutputAssembler(**{"stop": (), "tool_call_format": "", "track_spans": True, **assembler})
    trace = LogprobTrace()
    pieces: list[list[str]] = []

    def emit(emitted: list[Any]) -> None:
        texts = [p for p in emitted if isinstance(p, str)]
        spans = out.text_spans[len(out.text_spans) - len(texts) :]
        for piece_spans in spans:
            assert piece_spans
            pieces.append([entry.token for span in piece_spans for entry in trace.shown(*span)])

    for index, token in enumerate(tokens):
        trace.add(token, TokenScore(-float(index)), ())
        emit(out.feed(token))
    trace.add_text(flushed)
    emit(out.feed(flushed))
    emit(out.finish())
    pieces.append([entry.token for entry in trace.finish()])
    assert "".join(entry.token for entry in trace.listed) == out.visible_text
    logprobs = [entry.logprob for entry in trace.listed]
    assert logprobs == sorted(logprobs, reverse=True)  # in order, none twice
    return out, pieces


CASES: list[tuple[str, list[str], dict[str, Any], str, list[str]]] = [
    ("plain", ["Hel", "lo", " there"], {}, "Hello there", ["Hel", "lo", " there"]),
    # "你" split over two tokens: the first carries "", the second the character.
    ("multi-byte", ["a", "", "你", "b"], {}, "a你b", ["a", "", "你", "b"]),
    ("stop inside a token", ["one", " tw", "o three"], {"stop": ["o th"]}, "one tw", ["one", " tw"]),
    ("stop cuts a token", ["one", " two", " three"], {"stop": ["wo"]}, "one t", ["one", " t"]),
    ("stop held then released", ["ab", "cx", "d"], {"stop": ["cd"]}, "abcxd", ["ab", "cx", "d"]),
    (
        "thinking split off",
        ["<think>", "hmm", "</think>", "\n\n", "Yes", "."],
        {},
        "Yes.",
        ["Yes", "."],
    ),
    ("thinking open in the prompt", ["hm", "m</thi", "nk>\n", "Ok"], {"thinking": True}, "Ok", ["Ok"]),
    (
        "harmony analysis then final",
        [
            "<|channel|>analysis<|message|>",
            "hm",
            "<|end|>",
            "<|start|>assistant<|channel|>final<|message|>",
            "Hi",
            "!",
        ],
        {},
        "Hi!",
        ["Hi", "!"],
    ),
    (
        "harmony preamble, then final",
        [
            "<|channel|>commentary<|message|>",
            "Let me",
            " see",
            "<|end|>",
            "<|start|>assistant<|channel|>final<|message|>",
            "See",
            "n.",
        ],
        {},
        "Let me seeSeen.",
        ["Let me", " see", "See", "n."],
    ),
    (
        "harmony preamble, then a call",
        [
            "<|channel|>commentary<|message|>",
            "Calling",
            "<|end|>",
            "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>",
            '{"a": ',
            "1}",
        ],
        {"tool_call_format": "harmony"},
        "Calling",
        ["Calling"],
    ),
    (
        "tool call between text",
        ["Sure", ": ", "<tool_call>", '{"name": "f", "arguments": {}}', "</tool_call>", "\n", "done"],
        {"tool_call_format": "hermes"},
        "Sure: \ndone",
        ["Sure", ": ", "\n", "done"],
    ),
]


@pytest.mark.parametrize(
    ("tokens", "assembler", "visible", "listed"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_listed_tokens_spell_the_visible_text(
    tokens: list[str], assembler: dict[str, Any], visible: str, listed: list[str]
) -> None:
    out, pieces = run(tokens, **assembler)
    assert out.visible_text == visible
    assert [token for piece in pieces for token in piece] == listed


def test_a_held_token_is_listed_with_the_piece_that_ends_it() -> None:
    # "cx" is held whole ("c" may start the stop "cd"); it comes with the piece that releases it.
    _, pieces = run(["ab", "cx", "d"], stop=["cd"])
    assert pieces[0] == ["ab"]
    assert ["cx"] in pieces


def test_the_detokenizers_flush_belongs_to_the_last_token() -> None:
    out, pieces = run(["a", ""], flushed="\ufffd")
    assert out.visible_text == "a\ufffd"
    assert [token for piece in pieces for token in piece] == ["a", "\ufffd"]


def test_no_spans_unless_tracked() -> None:
    out = OutputAssembler(stop=(), tool_call_format="")
    out.feed("x")
    assert out.text_spans == [[]]

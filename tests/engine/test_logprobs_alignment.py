"""LogprobTrace + OutputAssembler (pure): listed tokens spell the visible text, each at most once.

Tokens are given as the raw text the detokenizer gave each ("" for one ending inside a
character); the table covers what holds text back or drops it.
"""

from __future__ import annotations

from typing import Any

import pytest

from vlmserve.engine.logprobs import LogprobTrace, TokenScore
from vlmserve.engine.output import OutputAssembler


def run(tokens: list[str], flushed: str = "", **assembler: Any) -> tuple[OutputAssembler, list[list[str]]]:
    """Feed the tokens (logprob = -index, to tell them apart); returns the assembler and, per
    text piece emitted (and a last "" piece for tokens settled at the end), its tokens' texts."""
    out = OutputAssembler(**{"stop": (), "tool_call_format": "", **assembler})
    trace = LogprobTrace()
    pieces: list[list[str]] = []

    def emit(emitted: list[Any]) -> None:
        texts = [p for p in emitted if isinstance(p, str)]
        spans = out.text_spans[len(out.text_spans) - len(texts) :]
        for span in spans:
            assert span is not None
            pieces.append([entry.token for entry in trace.shown(*span)])

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


def test_no_logprobs_without_a_trace() -> None:
    # The assembler's spans are there for every request; a trace only when logprobs are asked.
    out = OutputAssembler(stop=(), tool_call_format="")
    out.feed("x")
    assert out.text_spans == [(0, 1)]

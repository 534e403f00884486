"""Stop sequences and the output assembler (stop sequences first, then tool-call parsing)."""

from __future__ import annotations

import pytest

from vlmserve.engine.output.assembler import OutputAssembler
from vlmserve.engine.output.stop_sequences import StopSequenceMatcher
from vlmserve.engine.toolcalls.registry import HERMES_FORMAT
from vlmserve.engine.v1 import engine_pb2 as pb

STOP_CASES = [
    ("no stops", [], ["abc", "def"], "abcdef", None),
    ("stop inside one piece", ["END"], ["abcENDxyz"], "abc", "END"),
    ("stop split across pieces", ["END"], ["abcE", "N", "Dxyz"], "abc", "END"),
    ("near miss released at flush", ["END"], ["abcEN"], "abcEN", None),
    ("earliest of several stops wins", ["yz", "cd"], ["abcdefxyz"], "ab", "cd"),
    ("stop at the very start", ["ab"], ["abc"], "", "ab"),
    ("overlapping prefix", ["aab"], ["aaab"], "a", "aab"),
    ("nothing after a stop", ["X"], ["aX", "more"], "a", "X"),
]


@pytest.mark.parametrize(
    ("name", "stops", "chunks", "expected", "matched"), STOP_CASES, ids=[c[0] for c in STOP_CASES]
)
def test_stop_sequences(
    name: str, stops: list[str], chunks: list[str], expected: str, matched: str | None
) -> None:
    matcher = StopSequenceMatcher(stops)
    out = "".join(matcher.feed(chunk) for chunk in chunks) + matcher.flush()
    assert out == expected
    assert matcher.stopped is (matched is not None)
    # Which one ended the text (Anthropic's `stop_sequence`).
    assert matcher.matched == matched


def test_stop_text_is_held_back_while_undecided() -> None:
    matcher = StopSequenceMatcher(["STOP"])
    assert matcher.feed("go ST") == "go "
    assert matcher.feed("A") == "STA"


def feed_all(assembler: OutputAssembler, chunks: list[str]) -> list[str | pb.ToolCall]:
    out: list[str | pb.ToolCall] = []
    for chunk in chunks:
        out.extend(assembler.feed(chunk))
    out.extend(assembler.finish())
    return out


CALL = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'


def test_assembler_separates_text_and_calls() -> None:
    assembler = OutputAssembler(stop=(), tool_call_format=HERMES_FORMAT)
    out = feed_all(assembler, ["Hi. ", CALL[:10], CALL[10:]])
    assert out[0] == "Hi. "
    assert isinstance(out[1], pb.ToolCall) and out[1].name == "f" and out[1].arguments == '{"a": 1}'
    assert assembler.visible_text == "Hi. "
    assert [c.name for c in assembler.tool_calls] == ["f"]


def test_one_call_only_when_parallel_calls_are_off() -> None:
    assembler = OutputAssembler(stop=(), tool_call_format=HERMES_FORMAT, parallel_tool_calls=False)
    out = feed_all(assembler, [CALL + CALL + "tail"])
    assert [type(p) for p in out] == [pb.ToolCall]
    assert assembler.stopped


def test_stop_sequence_cuts_before_the_parser() -> None:
    assembler = OutputAssembler(stop=("<tool",), tool_call_format=HERMES_FORMAT)
    out = feed_all(assembler, ["answer ", CALL])
    assert out == ["answer "]
    assert assembler.stopped
    assert not assembler.tool_calls


def test_without_a_tool_format_markup_is_text() -> None:
    assembler = OutputAssembler(stop=(), tool_call_format="")
    assert "".join(p for p in feed_all(assembler, [CALL]) if isinstance(p, str)) == CALL

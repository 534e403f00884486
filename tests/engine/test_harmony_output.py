"""gpt-oss harmony output: the analysis channel is reasoning, `final` the answer, a commentary
message with a recipient a tool call (mlx-vlm's harmony parser). Tokenizer-free tables: no
family fixture renders harmony, so these feed the text a harmony model writes, cut anywhere."""

from __future__ import annotations

import json

import pytest

from vlmserve.engine.output.assembler import OutputAssembler, Reasoning, ThinkingSplitter
from vlmserve.engine.toolcalls.harmony import HarmonySplitter, starts_harmony
from vlmserve.engine.toolcalls.registry import tool_format

ANALYSIS = "<|channel|>analysis<|message|>The user greets; answer briefly.<|end|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>Hello there."
CALL_IN_CHANNEL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Oslo"}'
)
CALL_IN_ROLE = (
    '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Oslo"}'
)


def _runs(raw: str, cut: int) -> tuple[str, str]:
    splitter = ThinkingSplitter()
    runs = splitter.feed(raw[:cut]) + splitter.feed(raw[cut:]) + splitter.finish()
    return "".join(t for r, t in runs if r), "".join(t for r, t in runs if not r)


@pytest.mark.parametrize("cut", range(0, len(ANALYSIS + FINAL) + 1, 3))
def test_analysis_is_reasoning_and_final_is_the_answer(cut: int) -> None:
    raw = ANALYSIS + FINAL + "<|return|>"
    assert _runs(raw, cut) == ("The user greets; answer briefly.", "Hello there.")


@pytest.mark.parametrize("cut", range(0, len(ANALYSIS + CALL_IN_CHANNEL) + 1, 4))
@pytest.mark.parametrize("call", [CALL_IN_CHANNEL, CALL_IN_ROLE])
def test_a_commentary_call_reaches_the_harmony_parser(call: str, cut: int) -> None:
    raw = ANALYSIS + call + "<|call|>"
    assembler = OutputAssembler(stop=[], tool_call_format="harmony")
    pieces = assembler.feed(raw[:cut]) + assembler.feed(raw[cut:]) + assembler.finish()
    assert [p for p in pieces if isinstance(p, Reasoning)] != []
    assert assembler.reasoning_text == "The user greets; answer briefly."
    assert assembler.visible_text == ""
    assert [(c.name, json.loads(c.arguments)) for c in assembler.tool_calls] == [
        ("get_weather", {"city": "Oslo"})
    ]


def test_a_call_ended_by_the_end_of_sequence_token_is_closed() -> None:
    # `<|call|>` is an end-of-sequence token: the engine stops before the text has it.
    assembler = OutputAssembler(stop=[], tool_call_format="harmony")
    assembler.feed(ANALYSIS + CALL_IN_CHANNEL)
    assembler.finish()
    assert [c.name for c in assembler.tool_calls] == ["get_weather"]


def test_a_cut_off_call_is_not_a_call_and_never_text() -> None:
    """Issue 24.3: call markup never reaches the client as text (it used to be given back as
    text); the response ends incomplete (the token limit) without a call."""
    assembler = OutputAssembler(stop=[], tool_call_format="harmony")
    assembler.feed(ANALYSIS + CALL_IN_CHANNEL[:-3])
    assembler.finish()
    assert assembler.tool_calls == []
    assert "get_weather" not in assembler.visible_text
    assert '{"city"' not in assembler.visible_text


def test_a_commentary_preamble_is_answer_text() -> None:
    raw = ANALYSIS + "<|start|>assistant<|channel|>commentary<|message|>Checking the weather.<|end|>" + FINAL
    assert _runs(raw, len(raw)) == ("The user greets; answer briefly.", "Checking the weather.Hello there.")


def test_reasoning_is_tracked_while_in_the_analysis_channel() -> None:
    splitter = HarmonySplitter()
    splitter.feed("<|channel|>analysis<|message|>hm")
    assert splitter.thinking
    splitter.feed("<|end|><|start|>assistant<|channel|>final<|message|>ok")
    assert not splitter.thinking


def test_stops_and_limits_apply_to_the_answer_only() -> None:
    assembler = OutputAssembler(stop=["there"], tool_call_format="")
    assembler.feed("<|channel|>analysis<|message|>going there<|end|>" + FINAL)
    assembler.finish()
    assert assembler.reasoning_text == "going there"
    assert assembler.visible_text == "Hello "


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<|channel|>", True),
        ("  <|start|>x", True),
        ("<|chan", None),
        ("", None),
        ("<|im_start|>", False),
        ("Hi", False),
    ],
)
def test_starts_harmony(text: str, expected: bool | None) -> None:
    assert starts_harmony(text) is expected


def test_plain_output_is_untouched() -> None:
    assert _runs("<|im_end|> is not harmony", 3) == ("", "<|im_end|> is not harmony")


def test_the_detokenizer_keeps_the_framing() -> None:
    assert {"<|channel|>", "<|message|>", "<|start|>", "<|end|>"} <= set(tool_format("harmony").markers)

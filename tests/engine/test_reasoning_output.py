"""Thinking text (`<think>...</think>`) is split from the visible text where the output is assembled."""

from __future__ import annotations

import pytest

from vlmserve.engine.output.assembler import (
    OutputAssembler,
    Reasoning,
    ThinkingSplitter,
    prompt_leaves_thinking,
)


def _run(splitter: ThinkingSplitter, pieces: list[str]) -> tuple[str, str]:
    runs = [run for piece in pieces for run in splitter.feed(piece)] + splitter.finish()
    return "".join(t for r, t in runs if r), "".join(t for r, t in runs if not r)


@pytest.mark.parametrize("cut", range(1, 30))
def test_the_prompt_leaves_thinking_open(cut: int) -> None:
    raw = "let me see</think>\n\nThe answer."
    pieces = [raw[:cut], raw[cut:]]
    assert _run(ThinkingSplitter(thinking=True), pieces) == ("let me see", "The answer.")


@pytest.mark.parametrize("cut", range(1, 20))
def test_the_model_opens_thinking_itself(cut: int) -> None:
    raw = "\n<think>hmm</think>Yes."
    assert _run(ThinkingSplitter(), [raw[:cut], raw[cut:]]) == ("hmm", "Yes.")


def test_no_thinking_is_all_text() -> None:
    assert _run(ThinkingSplitter(), ["Hello <think> is", " just text"]) == ("", "Hello <think> is just text")
    assert _run(ThinkingSplitter(), ["<thi"]) == ("", "<thi")


def test_unfinished_thinking_stays_reasoning() -> None:
    assert _run(ThinkingSplitter(thinking=True), ["still </thi"]) == ("still </thi", "")


def test_prompt_leaves_thinking() -> None:
    assert prompt_leaves_thinking("<|im_start|>assistant\n<think>\n")
    assert not prompt_leaves_thinking("<think>\n\n</think>\n\n")
    assert not prompt_leaves_thinking("<|im_start|>assistant\n")


def test_the_assembler_keeps_tool_markup_in_thinking_as_reasoning() -> None:
    assembler = OutputAssembler(stop=["STOP"], tool_call_format="hermes", thinking=True)
    pieces = assembler.feed('<tool_call>{"name": "x"} STOP</think>Answer')
    pieces += assembler.finish()
    assert pieces == [Reasoning('<tool_call>{"name": "x"} STOP'), "Answer"]
    assert assembler.reasoning_text == '<tool_call>{"name": "x"} STOP'
    assert assembler.visible_text == "Answer"
    assert not assembler.tool_calls

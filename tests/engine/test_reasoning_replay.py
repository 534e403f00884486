"""Reasoning input items are replayed where the chat template renders thinking.

Qwen3-VL-Thinking's template renders an assistant turn's `reasoning_content` as
`<think>...</think>` for the turns after the last user query (a tool loop in progress), so a
reasoning item sent before a function call reaches the prompt; the items go through the same
translation the facade uses (`vlmserve.responses`), then the engine's prompt rendering.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from tests.engine._family_engine import running_engine
from vlmserve.engine.prep.lowering import lower_messages
from vlmserve.engine.prep.prompt import render_prompt
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.responses import input_to_messages, messages_to_items

pytestmark = pytest.mark.needs_model

THOUGHT = "The user wants the main window; a screenshot shows it."
TOOL = pb.Tool(function=pb.FunctionTool(name="screenshot", parameters_json='{"type": "object"}'))


def _items(*, with_reasoning: bool) -> list[dict[str, Any]]:
    reasoning = {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": THOUGHT}]}
    return [
        {"role": "user", "content": "Show me the main window."},
        *([reasoning] if with_reasoning else []),
        {"type": "function_call", "call_id": "call_1", "name": "screenshot", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "done"},
    ]


def _messages(*, with_reasoning: bool) -> list[pb.Message]:
    return lower_messages(input_to_messages(_items(with_reasoning=with_reasoning)))


def test_a_replayed_reasoning_item_reaches_the_thinking_prompt(family_models: dict[str, Path]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(family_models["qwen3_vl_thinking"])
    prompt = render_prompt(_messages(with_reasoning=True), template=tokenizer, tools=[TOOL]).text
    without = render_prompt(_messages(with_reasoning=False), template=tokenizer, tools=[TOOL]).text
    assert f"<|im_start|>assistant\n<think>\n{THOUGHT}\n</think>\n\n<tool_call>" in prompt
    assert THOUGHT not in without
    assert prompt.endswith("<|im_start|>assistant\n<think>\n")


def test_a_template_without_thinking_drops_it(family_models: dict[str, Path]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(family_models["qwen3_vl"])
    prompt = render_prompt(_messages(with_reasoning=True), template=tokenizer, tools=[TOOL]).text
    assert prompt == render_prompt(_messages(with_reasoning=False), template=tokenizer, tools=[TOOL]).text


def test_the_engine_counts_the_replayed_thinking(family_models: dict[str, Path]) -> None:
    def count(stub: Any, *, with_reasoning: bool) -> int:
        request = pb.GenerateRequest(messages=_messages(with_reasoning=with_reasoning), tools=[TOOL])
        return int(stub.CountTokens(pb.CountTokensRequest(request=request), timeout=60).input_tokens)

    with running_engine(family_models["qwen3_vl_thinking"]) as (_engine, stub):
        with_thought, without = count(stub, with_reasoning=True), count(stub, with_reasoning=False)
    tokenizer = AutoTokenizer.from_pretrained(family_models["qwen3_vl_thinking"])
    # The thinking block: `<think>\n` THOUGHT `\n</think>\n\n`.
    assert with_thought - without == len(tokenizer.encode(f"<think>\n{THOUGHT}\n</think>\n\n"))


def test_a_reasoning_item_only_travels_with_the_assistant_turn_after_it() -> None:
    summary_only = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "short"}]}
    messages = input_to_messages(
        [
            {"role": "user", "content": "hi"},
            summary_only,
            {"role": "assistant", "content": "hello"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "lost"}]},
            {"role": "user", "content": "again"},
        ]
    )
    assert [(m.role, m.reasoning_text) for m in messages] == [
        (pb.ROLE_USER, ""),
        (pb.ROLE_ASSISTANT, "short"),
        (pb.ROLE_USER, ""),
    ]


def test_thinking_goes_back_out_as_a_reasoning_item() -> None:
    messages = input_to_messages(_items(with_reasoning=True))
    items = messages_to_items(messages)
    assert items[1] == {
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": THOUGHT}],
    }
    assert input_to_messages(items) == messages

"""A thinking model's reasoning on `/v1/chat/completions`: `message.reasoning_content` and
`delta.reasoning_content` (DeepSeek's / vLLM's field), read through the openai SDK's extras;
an assistant turn's `reasoning_content` is replayed to the engine as that turn's thinking."""

from __future__ import annotations

from typing import Any

import openai

from tests.facade.fake_engine import FakeEngine, Script
from vlmserve.engine.v1 import engine_pb2 as pb


def _thinking(engine: FakeEngine) -> None:
    engine.script = Script(
        reasoning_chunks=["Let me ", "think."],
        text_chunks=["The ", "answer."],
        usage=pb.Usage(input_tokens=3, output_tokens=9, reasoning_tokens=6),
    )


async def test_the_message_carries_the_reasoning(sdk: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    _thinking(engine)
    completion = await sdk.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "hi"}]
    )
    message: Any = completion.choices[0].message
    assert message.content == "The answer."
    assert message.reasoning_content == "Let me think."
    assert completion.usage is not None and completion.usage.completion_tokens_details is not None
    assert completion.usage.completion_tokens_details.reasoning_tokens == 6


async def test_no_reasoning_no_field(sdk: openai.AsyncOpenAI) -> None:
    completion = await sdk.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "hi"}]
    )
    assert "reasoning_content" not in completion.choices[0].message.model_dump(exclude_unset=True)


async def test_reasoning_streams_before_the_content(sdk: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    _thinking(engine)
    stream = await sdk.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    deltas: list[tuple[str, str]] = []
    async for chunk in stream:
        for choice in chunk.choices:
            delta: Any = choice.delta
            if getattr(delta, "reasoning_content", None):
                deltas.append(("reasoning", delta.reasoning_content))
            if delta.content:
                deltas.append(("content", delta.content))
    assert deltas == [
        ("reasoning", "Let me "),
        ("reasoning", "think."),
        ("content", "The "),
        ("content", "answer."),
    ]


async def test_an_assistant_turns_reasoning_is_replayed(sdk: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    messages: Any = [
        {"role": "user", "content": "Look."},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "A screenshot first.",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "screenshot", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "done"},
    ]
    await sdk.chat.completions.create(model="default", messages=messages)
    request = engine.requests[-1]
    assistant = [m for m in request.messages if m.role == pb.ROLE_ASSISTANT]
    assert [(m.reasoning_text, [c.name for c in m.tool_calls]) for m in assistant] == [
        ("A screenshot first.", ["screenshot"])
    ]

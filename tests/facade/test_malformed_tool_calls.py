"""A malformed tool call from the engine (issue 39.9): arguments that are not a JSON object — what
the engine reports for a call whose JSON the model broke (tests/engine/test_tool_call_corpus.py)
— reach every API the way that API reports them, streamed or not, through the real SDKs: never a
500, never markup as text. Responses and chat: the arguments as written (OpenAI documents that
arguments may not be valid JSON; the client validates). Messages: `input` must be an object, so
the text is under `arguments`; a stream's `input_json_delta`s are the text as written as far as
it is an object's start (the SDK raises on anything else), else the same `arguments` object."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import pytest

from tests.facade.fake_engine import FakeEngine
from tests.facade.helpers import SCREENSHOT_TOOL
from vlmserve.engine.v1 import engine_pb2 as pb

MALFORMED = ['{"q": "cut', "not json at all", "[1, 2]", "", '{"a": 1} junk']
# Messages' `input` for each: unstreamed, and as the Anthropic SDK accumulates a stream.
ANTHROPIC_INPUT = {
    '{"q": "cut': ({"arguments": '{"q": "cut'}, {}),  # the SDK drops a string left open
    "not json at all": ({"arguments": "not json at all"}, {"arguments": "not json at all"}),
    "[1, 2]": ({"arguments": [1, 2]}, {"arguments": [1, 2]}),
    "": ({}, {}),
    '{"a": 1} junk': ({"arguments": '{"a": 1} junk'}, {"a": 1}),
}
TOOL: Any = {"type": "function", "function": {"name": "screenshot", "parameters": {"type": "object"}}}
ANTHROPIC_TOOL: Any = {"name": "screenshot", "input_schema": {"type": "object"}}


def script(engine: FakeEngine, arguments: str, *, streamed: bool) -> None:
    engine.script.text_chunks = []
    engine.script.tool_call_deltas = (
        [pb.ToolCallDelta(id="call_1", name="screenshot"), pb.ToolCallDelta(id="call_1", arguments=arguments)]
        if streamed and arguments
        else []
    )
    engine.script.tool_calls = [pb.ToolCall(id="call_1", name="screenshot", arguments=arguments)]
    engine.script.finish_reason = pb.FINISH_REASON_TOOL_CALLS


@pytest.fixture
async def anthropic_sdk(server_url: str) -> AsyncIterator[anthropic.AsyncAnthropic]:
    client = anthropic.AsyncAnthropic(base_url=server_url, api_key="unused", max_retries=0, timeout=10)
    yield client
    await client.close()


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("arguments", MALFORMED)
async def test_responses(sdk: openai.AsyncOpenAI, engine: FakeEngine, arguments: str, streamed: bool) -> None:
    script(engine, arguments, streamed=streamed)
    tools: Any = [SCREENSHOT_TOOL]
    if streamed:
        async with sdk.responses.stream(model="default", input="look", tools=tools) as stream:
            async for _ in stream:
                pass
            response = await stream.get_final_response()
    else:
        response = await sdk.responses.create(model="default", input="look", tools=tools)
    (call,) = response.output
    assert call.type == "function_call"
    assert (call.name, call.arguments, call.status) == ("screenshot", arguments, "completed")


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("arguments", MALFORMED)
async def test_chat_completions(
    sdk: openai.AsyncOpenAI, engine: FakeEngine, arguments: str, streamed: bool
) -> None:
    script(engine, arguments, streamed=streamed)
    messages: Any = [{"role": "user", "content": "look"}]
    if streamed:
        chunks = await sdk.chat.completions.create(
            model="default", messages=messages, tools=[TOOL], stream=True
        )
        names, pieces, finish = [], [], None
        async for chunk in chunks:
            for choice in chunk.choices:
                finish = choice.finish_reason or finish
                for delta in choice.delta.tool_calls or []:
                    assert delta.function is not None
                    names += [delta.function.name] if delta.function.name else []
                    pieces += [delta.function.arguments] if delta.function.arguments else []
                assert not choice.delta.content
        assert names == ["screenshot"] and "".join(pieces) == arguments and finish == "tool_calls"
    else:
        completion = await sdk.chat.completions.create(model="default", messages=messages, tools=[TOOL])
        (choice,) = completion.choices
        assert choice.finish_reason == "tool_calls" and not choice.message.content
        (call,) = choice.message.tool_calls or []
        assert call.type == "function"
        assert (call.function.name, call.function.arguments) == ("screenshot", arguments)


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("arguments", MALFORMED)
async def test_anthropic_messages(
    anthropic_sdk: anthropic.AsyncAnthropic, engine: FakeEngine, arguments: str, streamed: bool
) -> None:
    script(engine, arguments, streamed=streamed)
    request: Any = {
        "model": "default",
        "max_tokens": 64,
        "tools": [ANTHROPIC_TOOL],
        "messages": [{"role": "user", "content": "look"}],
    }
    if streamed:
        async with anthropic_sdk.messages.stream(**request) as stream:
            async for _ in stream:
                pass
            message = await stream.get_final_message()
    else:
        message = await anthropic_sdk.messages.create(**request)
    assert message.stop_reason == "tool_use"
    (block,) = message.content
    assert block.type == "tool_use" and block.name == "screenshot"
    assert block.input == ANTHROPIC_INPUT[arguments][streamed]

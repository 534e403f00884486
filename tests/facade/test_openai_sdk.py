"""The official `openai` SDK, pointed at the facade with base_url, against the scripted engine."""

from __future__ import annotations

from typing import Any, cast

import openai
import pytest
from openai.types.responses import ResponseCompletedEvent, ResponseFunctionToolCall, ResponseUsage

from tests.facade.fake_engine import MODEL_ID, FakeEngine
from tests.facade.helpers import SCREENSHOT_TOOL, png_data_url, screenshot_tool_input
from vlmserve.engine.prep.lowering import IMAGE_FOLLOW_UP_MARKER, lower_messages
from vlmserve.engine.v1 import engine_pb2 as pb

# The SDK's TypedDicts do not cover every shape the facade accepts; the tests send plain JSON.
TOOLS: list[Any] = [SCREENSHOT_TOOL]


async def test_create_text(sdk: openai.AsyncOpenAI) -> None:
    response = await sdk.responses.create(model="default", input="Say hello.")
    assert response.status == "completed"
    assert response.model == MODEL_ID
    assert response.output_text == "Hello, world."
    assert response.usage is not None and response.usage.total_tokens == 14


async def test_create_with_user_image(sdk: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    response = await sdk.responses.create(
        model="default",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What colour is this?"},
                    {"type": "input_image", "image_url": png_data_url((0, 0, 255)), "detail": "low"},
                ],
            }
        ],
    )
    assert response.status == "completed"
    (user,) = engine.requests[0].messages
    assert [part.WhichOneof("kind") for part in user.parts] == ["text", "image"]
    assert user.parts[1].image.detail == pb.IMAGE_DETAIL_LOW


async def test_create_with_a_screenshot_tool_output(sdk: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    response = await sdk.responses.create(
        model="default",
        input=cast(Any, screenshot_tool_input(png_data_url((255, 0, 0)))),
        tools=TOOLS,
    )
    assert response.status == "completed"
    messages = lower_messages(engine.requests[0].messages)  # as the engine renders them
    assert messages[2].tool_output.text.endswith(IMAGE_FOLLOW_UP_MARKER)
    assert [part.WhichOneof("kind") for part in messages[3].parts] == ["image"]


async def test_stream_helper_to_final_response(sdk: openai.AsyncOpenAI) -> None:
    async with sdk.responses.stream(model="default", input="Say hello.") as stream:
        deltas = [event.delta async for event in stream if event.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert "".join(deltas) == final.output_text == "Hello, world."
    assert final.status == "completed"


async def test_create_stream_true(sdk: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    engine.script.tool_calls = [pb.ToolCall(id="call_1", name="screenshot", arguments="{}")]
    stream = await sdk.responses.create(model="default", input="shoot", tools=TOOLS, stream=True)
    events = [event async for event in stream]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    final = events[-1]
    assert isinstance(final, ResponseCompletedEvent)
    calls = [item for item in final.response.output if isinstance(item, ResponseFunctionToolCall)]
    assert [(call.name, call.call_id) for call in calls] == [("screenshot", "call_1")]


async def test_retrieve_input_items_and_delete(sdk: openai.AsyncOpenAI) -> None:
    created = await sdk.responses.create(
        model="default",
        input=cast(Any, screenshot_tool_input(png_data_url())),
        tools=TOOLS,
    )
    retrieved = await sdk.responses.retrieve(created.id)
    assert retrieved.id == created.id and retrieved.output_text == created.output_text

    items = [item async for item in sdk.responses.input_items.list(created.id, order="asc")]
    assert [item.type for item in items] == ["message", "function_call", "function_call_output"]
    output = items[2].model_dump()["output"]
    assert output[1]["type"] == "input_image" and output[1]["detail"] == "auto"
    assert output[1]["image_url"].startswith("data:image/png;base64,")

    await sdk.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(created.id)


async def test_sdk_sees_openai_errors(sdk: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as not_found:
        await sdk.responses.create(model="gpt-4o", input="hi")
    assert not_found.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        await sdk.responses.create(model="default", input=cast(Any, [{"type": "nonsense"}]))
    assert bad.value.param == "input[0].type"


async def test_chat_stream_helper_accumulates_a_streamed_tool_call(
    sdk: openai.AsyncOpenAI, engine: FakeEngine
) -> None:
    """`chat.completions.stream()` merges every chunk into its snapshot: a continuation chunk
    must leave out what it does not set (`"type": null` once raised in the SDK's accumulator)."""
    engine.script.text_chunks = []
    engine.script.tool_call_deltas = [
        pb.ToolCallDelta(id="call_1", name="get_weather"),
        *(pb.ToolCallDelta(id="call_1", arguments=piece) for piece in ['{"ci', 'ty": ', '"Paris"}']),
    ]
    engine.script.tool_calls = [pb.ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')]
    weather: Any = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    async with sdk.chat.completions.stream(
        model="default", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[weather]
    ) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_completion()
    assert "tool_calls.function.arguments.done" in kinds
    [choice] = final.choices
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.type == "function" and call.id
    assert call.function.name == "get_weather"
    assert call.function.arguments == '{"city": "Paris"}'


async def test_usage_has_every_field_the_sdk_requires(sdk: openai.AsyncOpenAI) -> None:
    """openai 3.57 types `input_tokens_details.cache_write_tokens` as a required int."""
    raw = await sdk.responses.with_raw_response.create(model="default", input="Say hello.")
    usage = raw.http_response.json()["usage"]
    details = usage["input_tokens_details"]
    assert details == {"cached_tokens": details["cached_tokens"], "cache_write_tokens": 0}
    # Validated strictly (the SDK's own parse is lenient about missing fields).
    assert ResponseUsage.model_validate(usage).input_tokens_details.cache_write_tokens == 0

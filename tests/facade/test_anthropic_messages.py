"""`POST /v1/messages` through the official `anthropic` SDK, against the scripted engine: what
reaches the engine, the message and its stream events, and every refusal (Anthropic-shaped)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import grpc
import httpx
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from tests._pdfs import text_pdf
from tests.facade.fake_engine import MODEL_ID, FakeEngine
from tests.facade.helpers import in_process, parse_sse, png_bytes
from vlmserve.anthropic import TOOL_ERROR_PREFIX
from vlmserve.client import AsyncEngineClient
from vlmserve.engine.prep.lowering import IMAGE_FOLLOW_UP_MARKER, lower_messages
from vlmserve.engine.request_errors import RequestError
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade import FacadeSettings, Store, Timeouts, create_app
from vlmserve.facade.settings.api_keys import ApiKeys

RED = (255, 0, 0)
SCREENSHOT: Any = {"name": "screenshot", "description": "Take one.", "input_schema": {"type": "object"}}
EVENTS: TypeAdapter[RawMessageStreamEvent] = TypeAdapter(RawMessageStreamEvent)


@pytest.fixture
async def sdk(server_url: str) -> AsyncIterator[anthropic.AsyncAnthropic]:
    client = anthropic.AsyncAnthropic(base_url=server_url, api_key="unused", max_retries=0, timeout=10)
    yield client
    await client.close()


def image_block(data: bytes) -> Any:
    encoded = base64.b64encode(data).decode()
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": encoded}}


def user(*content: Any) -> Any:
    return {"role": "user", "content": list(content)}


def tool_turns(result_content: Any, *, is_error: bool | None = None) -> list[Any]:
    use = {"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {"x": 1}}
    result: dict[str, Any] = {"type": "tool_result", "tool_use_id": "toolu_1", "content": result_content}
    if is_error is not None:
        result["is_error"] = is_error
    return [
        {"role": "user", "content": "Take a screenshot."},
        {"role": "assistant", "content": [{"type": "text", "text": "Taking it."}, use]},
        {"role": "user", "content": [result, {"type": "text", "text": "What colour?"}]},
    ]


async def test_text_message(sdk: anthropic.AsyncAnthropic, engine: FakeEngine) -> None:
    message = await sdk.messages.create(
        model="default",
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=7,
        # Older clients send them; this SDK no longer has them as arguments.
        extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 20},
        stop_sequences=["\n\n"],
        metadata={"user_id": "u-1"},
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.model == MODEL_ID
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].type == "text" and message.content[0].text == "Hello, world."
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    # 11 prompt tokens, 2 of them from the prefix cache.
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens) == (9, 2)
    assert (message.usage.output_tokens, message.usage.cache_creation_input_tokens) == (3, 0)
    request = engine.requests[0]
    assert [m.role for m in request.messages] == [pb.ROLE_SYSTEM, pb.ROLE_USER]
    assert request.messages[0].parts[0].text.text == "Be brief."
    assert request.sampling.max_tokens == 7
    assert request.sampling.top_k == 20
    assert list(request.sampling.stop) == ["\n\n"]
    assert request.sampling.temperature == pytest.approx(0.5)
    assert request.sampling.top_p == pytest.approx(0.9)
    assert not request.HasField("enable_thinking")


async def test_the_raw_message_is_the_sdks_message(http: httpx.AsyncClient) -> None:
    body = {"model": "default", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]}
    response = await http.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    assert response.status_code == 200, response.text
    raw = response.json()
    Message.model_validate(raw)
    assert set(raw) == {"id", "type", "role", "content", "model", "stop_reason", "stop_sequence", "usage"}
    # No `"citations": null`: the AI SDK's @ai-sdk/anthropic schema refuses it (array or absent).
    assert raw["content"] == [{"type": "text", "text": "Hello, world."}]


async def test_a_stop_sequence_ends_the_message(sdk: anthropic.AsyncAnthropic, engine: FakeEngine) -> None:
    engine.script.stop_sequence = "END"
    message = await sdk.messages.create(
        model="default", max_tokens=9, stop_sequences=["END"], messages=[{"role": "user", "content": "Go"}]
    )
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "END")


async def test_user_image_blocks_reach_the_engine(sdk: anthropic.AsyncAnthropic, engine: FakeEngine) -> None:
    await sdk.messages.create(
        model="default",
        max_tokens=5,
        messages=[user({"type": "text", "text": "Colour?"}, image_block(png_bytes(RED)))],
    )
    (message,) = engine.requests[0].messages
    assert [part.WhichOneof("kind") for part in message.parts] == ["text", "image"]
    assert message.parts[1].image.data == png_bytes(RED)


@pytest.mark.parametrize(
    ("content", "texts"),
    [
        ([image_block(png_bytes(RED))], []),
        ([{"type": "text", "text": "captured"}, image_block(png_bytes(RED))], ["captured"]),
    ],
    ids=["image only", "text and image"],
)
async def test_a_tool_result_with_an_image_is_lowered_into_a_user_turn(
    sdk: anthropic.AsyncAnthropic, engine: FakeEngine, content: Any, texts: list[str]
) -> None:
    await sdk.messages.create(model="default", max_tokens=5, tools=[SCREENSHOT], messages=tool_turns(content))
    request = engine.requests[0]
    lowered = lower_messages(request.messages)  # as the engine renders them
    roles = [m.role for m in lowered]
    assert roles == [pb.ROLE_USER, pb.ROLE_ASSISTANT, pb.ROLE_TOOL, pb.ROLE_USER, pb.ROLE_USER]
    assistant = lowered[1]
    assert assistant.parts[0].text.text == "Taking it."
    assert [(c.id, c.name, c.arguments) for c in assistant.tool_calls] == [
        ("toolu_1", "screenshot", '{"x": 1}')
    ]
    output = lowered[2].tool_output
    assert output.call_id == "toolu_1"
    assert output.text.endswith(IMAGE_FOLLOW_UP_MARKER)
    for text in texts:
        assert text in output.text
    assert lowered[3].parts[0].image.data == png_bytes(RED)
    assert lowered[4].parts[0].text.text == "What colour?"
    assert [tool.function.name for tool in request.tools] == ["screenshot"]
    assert request.tools[0].function.description == "Take one."


@pytest.mark.parametrize(
    "content", ["it failed", [{"type": "text", "text": "it failed"}]], ids=["string", "blocks"]
)
async def test_an_error_result_says_so_to_the_model(
    sdk: anthropic.AsyncAnthropic, engine: FakeEngine, content: Any
) -> None:
    await sdk.messages.create(
        model="default", max_tokens=5, tools=[SCREENSHOT], messages=tool_turns(content, is_error=True)
    )
    output = engine.requests[0].messages[2].tool_output
    text = output.text if output.WhichOneof("output") == "text" else output.parts.parts[0].text.text
    assert text.startswith(TOOL_ERROR_PREFIX)


async def test_a_pdf_document_in_a_tool_result_becomes_pages(
    sdk: anthropic.AsyncAnthropic, engine: FakeEngine
) -> None:
    data = base64.b64encode(text_pdf(["First", "Second"])).decode()
    document = {
        "type": "document",
        "title": "report.pdf",
        "source": {"type": "base64", "media_type": "application/pdf", "data": data},
    }
    await sdk.messages.create(
        model="default", max_tokens=5, tools=[SCREENSHOT], messages=tool_turns([document])
    )
    request = engine.requests[0]
    lowered = lower_messages(request.messages)  # as the engine renders them
    images = [part for message in lowered for part in message.parts if part.HasField("image")]
    assert len(images) == 2  # one per page, lowered into the user turn after the tool turn
    assert "[file report.pdf, page 1 of 2]" in lowered[2].tool_output.text


async def test_user_documents_pdf_and_text(sdk: anthropic.AsyncAnthropic, engine: FakeEngine) -> None:
    data = base64.b64encode(text_pdf(["Only"])).decode()
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": data}}
    text = {
        "type": "document",
        "title": "notes",
        "context": "from the wiki",
        "source": {"type": "text", "media_type": "text/plain", "data": "plain words"},
    }
    await sdk.messages.create(model="default", max_tokens=5, messages=[user(pdf, text)])
    (message,) = engine.requests[0].messages
    kinds = [part.WhichOneof("kind") for part in message.parts]
    assert kinds == ["text", "image", "text", "text"]
    assert message.parts[2].text.text == "[context of notes]\nfrom the wiki"
    assert message.parts[3].text.text == "[file notes]\nplain words\n[end of file notes]"


async def test_thinking_replayed_and_the_switch(sdk: anthropic.AsyncAnthropic, engine: FakeEngine) -> None:
    messages: Any = [
        {"role": "user", "content": "Think."},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Let me see.", "signature": "sig"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Done."},
            ],
        },
        {"role": "user", "content": "Again."},
    ]
    await sdk.messages.create(
        model="default",
        max_tokens=2048,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=messages,
    )
    await sdk.messages.create(model="default", max_tokens=5, thinking={"type": "disabled"}, messages=messages)
    enabled, disabled = engine.requests
    assert enabled.enable_thinking is True and disabled.enable_thinking is False
    assert enabled.messages[1].reasoning_text == "Let me see."
    assert enabled.messages[1].parts[0].text.text == "Done."


async def test_thinking_output_blocks(sdk: anthropic.AsyncAnthropic, engine: FakeEngine) -> None:
    engine.script.reasoning_chunks = ["Hmm", "."]
    message = await sdk.messages.create(
        model="default", max_tokens=9, messages=[user({"type": "text", "text": "Q"})]
    )
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[0].type == "thinking" and message.content[0].thinking == "Hmm."


async def test_tool_use_output_and_choices(sdk: anthropic.AsyncAnthropic, engine: FakeEngine) -> None:
    engine.script.text_chunks = []
    engine.script.tool_calls = [pb.ToolCall(id="call_1", name="screenshot", arguments='{"x": 1}')]
    engine.script.finish_reason = pb.FINISH_REASON_TOOL_CALLS
    choices: list[Any] = [
        {"type": "auto"},
        {"type": "any", "disable_parallel_tool_use": True},
        {"type": "tool", "name": "screenshot"},
        {"type": "none"},
    ]
    for choice in choices:
        message = await sdk.messages.create(
            model="default",
            max_tokens=9,
            tools=[SCREENSHOT],
            tool_choice=choice,
            messages=[user({"type": "text", "text": "Go"})],
        )
    auto, any_, named, none = engine.requests
    assert auto.tool_choice.WhichOneof("choice") is None or auto.tool_choice.mode == pb.TOOL_CHOICE_MODE_AUTO
    assert any_.tool_choice.mode == pb.TOOL_CHOICE_MODE_REQUIRED and any_.parallel_tool_calls is False
    assert named.tool_choice.function_name == "screenshot"
    assert none.tool_choice.mode == pb.TOOL_CHOICE_MODE_NONE
    assert not auto.HasField("parallel_tool_calls")
    assert message.stop_reason == "tool_use"
    (block,) = message.content
    assert block.type == "tool_use"
    assert (block.id, block.name, block.input) == ("call_1", "screenshot", {"x": 1})


async def test_stream_text_event_sequence(http: httpx.AsyncClient) -> None:
    body = {
        "model": "default",
        "max_tokens": 5,
        "stream": True,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    response = await http.post("/v1/messages", json=body)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(response.text)
    for event in events:
        parsed = EVENTS.validate_python(event.json()) if event.event != "ping" else None
        assert event.event == event.json()["type"], event
        assert parsed is None or parsed.type == event.event
    types = [event.event for event in events]
    assert types == [
        "message_start",
        "ping",
        "content_block_start",
        *["content_block_delta"] * 3,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    delta = events[-2].json()
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"] == {
        "input_tokens": 9,
        "output_tokens": 3,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 2,
    }


async def test_sdk_stream_accumulates_the_message(sdk: anthropic.AsyncAnthropic, engine: FakeEngine) -> None:
    engine.script.reasoning_chunks = ["Hmm."]
    engine.script.tool_call_deltas = [
        pb.ToolCallDelta(id="c1", name="screenshot", arguments='{"x"'),
        pb.ToolCallDelta(id="c1", arguments=": 1}"),
    ]
    engine.script.tool_calls = [pb.ToolCall(id="c1", name="screenshot", arguments='{"x": 1}')]
    async with sdk.messages.stream(
        model="default", max_tokens=9, tools=[SCREENSHOT], messages=[user({"type": "text", "text": "Go"})]
    ) as stream:
        text = "".join([piece async for piece in stream.text_stream])
        message = await stream.get_final_message()
    assert text == "Hello, world."
    assert [block.type for block in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[2].type == "tool_use" and message.content[2].input == {"x": 1}
    assert message.stop_reason == "tool_use"
    assert message.usage.input_tokens == 9 and message.usage.output_tokens == 3


async def test_a_truncated_tool_call_never_becomes_text(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    """The token limit cut a call off: its block ends where it stopped, no markup as text."""
    engine.script.text_chunks = []
    engine.script.tool_call_deltas = [pb.ToolCallDelta(id="c1", name="screenshot", arguments='{"x": ')]
    engine.script.finish_reason = pb.FINISH_REASON_LENGTH
    body: dict[str, Any] = {
        "model": "default",
        "max_tokens": 5,
        "tools": [SCREENSHOT],
        "messages": [user({"type": "text", "text": "Go"})],
    }
    events = [
        event.json()
        for event in parse_sse((await http.post("/v1/messages", json={**body, "stream": True})).text)
    ]
    starts = [event["content_block"] for event in events if event["type"] == "content_block_start"]
    assert [start["type"] for start in starts] == ["tool_use"]
    deltas = [event["delta"] for event in events if event["type"] == "content_block_delta"]
    assert deltas == [{"type": "input_json_delta", "partial_json": '{"x": '}]
    assert events[-2]["delta"]["stop_reason"] == "max_tokens"
    plain = (await http.post("/v1/messages", json=body)).json()
    assert plain["content"] == [] and plain["stop_reason"] == "max_tokens"


async def test_pings_while_a_long_prompt_prefills(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store, engine: FakeEngine
) -> None:
    quick = settings.replace(timeouts=Timeouts(heartbeat=0.05, stream_first_message=0.01))
    app = create_app(quick, engine=engine_client, store=store)
    engine.script.first_delay_s = 0.5
    body = {
        "model": "default",
        "max_tokens": 5,
        "stream": True,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    async with in_process(app) as http:
        types = [event.event for event in parse_sse((await http.post("/v1/messages", json=body)).text)]
    first_block = types.index("content_block_start")
    assert types[0] == "message_start"
    assert types[1:first_block] == ["ping"] * (first_block - 1) and first_block >= 3
    assert types[-1] == "message_stop"


async def test_count_tokens(sdk: anthropic.AsyncAnthropic, engine: FakeEngine) -> None:
    counted = await sdk.messages.count_tokens(
        model="default",
        system="Be brief.",
        thinking={"type": "disabled"},
        messages=[user({"type": "text", "text": "two words"}, image_block(png_bytes(RED)))],
    )
    assert counted.input_tokens == 2 + 2 + 10
    assert engine.count_requests[0].enable_thinking is False


async def test_models_list_reads_as_anthropic_models(sdk: anthropic.AsyncAnthropic) -> None:
    page = await sdk.models.list()
    (model,) = page.data
    assert (model.id, model.type, model.display_name) == (MODEL_ID, "model", MODEL_ID)
    assert model.created_at.year == 2023
    assert (await sdk.models.retrieve(MODEL_ID)).id == MODEL_ID


REFUSALS: list[tuple[str, dict[str, Any], str]] = [
    ("max_tokens is required", {"max_tokens": None}, "'max_tokens'"),
    (
        "server tools",
        {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        "'tools[0].type': 'web_search_20250305' is a server tool",
    ),
    (
        "unknown block",
        {"messages": [user({"type": "search_result", "source": "s", "title": "t", "content": []})]},
        "'messages[0].content[0].type'",
    ),
    (
        "remote image without a fetcher",
        {
            "messages": [
                user({"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}})
            ]
        },
        "'messages[0].content[0].source'",
    ),
    (
        "bad base64 inside a tool result",
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "screenshot", "input": {}}],
                },
                user(
                    {
                        "type": "tool_result",
                        "tool_use_id": "t",
                        "content": [
                            {
                                "type": "image",
                                "source": {"type": "base64", "media_type": "image/png", "data": "!!"},
                            }
                        ],
                    }
                ),
            ]
        },
        "'messages[1].content[0].content[0].source'",
    ),
    (
        "document url",
        {"messages": [user({"type": "document", "source": {"type": "url", "url": "https://x/a.pdf"}})]},
        "'messages[0].content[0].source.url'",
    ),
    (
        "budget over max_tokens",
        {"thinking": {"type": "enabled", "budget_tokens": 4096}},
        "'thinking.budget_tokens'",
    ),
    ("mcp servers", {"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]}, "'mcp_servers'"),
    (
        "a tool_use in a user turn",
        {"messages": [user({"type": "tool_use", "id": "t", "name": "n", "input": {}})]},
        "'messages[0].content[0].type'",
    ),
    ("unknown model", {"model": "claude-sonnet-4-5"}, "claude-sonnet-4-5"),
]


@pytest.mark.parametrize(("name", "change", "quoted"), REFUSALS, ids=[case[0] for case in REFUSALS])
async def test_refusals_are_anthropic_errors_naming_the_field(
    http: httpx.AsyncClient, name: str, change: dict[str, Any], quoted: str
) -> None:
    body: dict[str, Any] = {
        "model": "default",
        "max_tokens": 1024,
        "messages": [user({"type": "text", "text": "Hi"})],
    }
    body.update(change)
    body = {key: value for key, value in body.items() if value is not None}
    response = await http.post("/v1/messages", json=body)
    error = response.json()
    assert set(error) == {"type", "error"} and error["type"] == "error", error
    expected = ("not_found_error", 404) if name == "unknown model" else ("invalid_request_error", 400)
    assert (error["error"]["type"], response.status_code) == expected
    assert quoted in error["error"]["message"]


async def test_a_full_engine_queue_is_overloaded_529(
    sdk: anthropic.AsyncAnthropic, engine: FakeEngine
) -> None:
    engine.script.error = RequestError(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full", retry_after_s=2.0)
    with pytest.raises(anthropic.APIStatusError) as raised:
        await sdk.messages.create(model="default", max_tokens=5, messages=[{"role": "user", "content": "Hi"}])
    assert raised.value.status_code == 529
    assert raised.value.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "The engine is at capacity; retry shortly."},
    }


async def test_a_failure_mid_stream_is_an_error_event(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.script.error = RequestError(grpc.StatusCode.INTERNAL, "boom")
    engine.script.error_after = 1
    body = {
        "model": "default",
        "max_tokens": 5,
        "stream": True,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    events = parse_sse((await http.post("/v1/messages", json=body)).text)
    assert events[-1].event == "error"
    assert events[-1].json() == {
        "type": "error",
        "error": {"type": "api_error", "message": "The engine failed to process the request."},
    }
    assert "message_stop" not in [event.event for event in events]


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"x-api-key": "key-a"}, 200),
        ({"authorization": "Bearer key-a"}, 200),
        ({"x-api-key": "key-a", "authorization": "Bearer key-a"}, 200),
        ({"x-api-key": "key-a", "authorization": "Bearer key-b"}, 401),
        ({"x-api-key": "wrong"}, 401),
        ({}, 401),
    ],
)
async def test_api_keys_by_x_api_key_or_bearer(
    settings: FacadeSettings,
    engine_client: AsyncEngineClient,
    store: Store,
    headers: dict[str, str],
    status: int,
) -> None:
    keyed = settings.model_copy(update={"api_keys": ApiKeys.from_keys(["key-a", "key-b"])})
    app = create_app(keyed, engine=engine_client, store=store)
    body = {"model": "default", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]}
    versioned = {"anthropic-version": "2023-06-01", "anthropic-beta": "prompt-caching-2024-07-31", **headers}
    async with in_process(app) as http:
        response = await http.post("/v1/messages", json=body, headers=versioned)
        models = await http.get("/v1/models", headers=versioned)
    assert (response.status_code, models.status_code) == (status, status)
    if status == 401:
        assert response.json()["error"]["type"] == "authentication_error"
        assert models.json()["error"]["type"] == "authentication_error"

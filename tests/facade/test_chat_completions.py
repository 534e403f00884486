"""`POST /v1/chat/completions` through the official SDK's `chat.completions`, against the
scripted engine: what reaches the engine, the completion and its chunks, and every refusal."""

from __future__ import annotations

import base64
import json
from typing import Any, cast

import httpx
import openai
import pytest

from tests._pdfs import text_pdf
from tests._sse import aiter_lines
from tests.facade.fake_engine import MODEL_ID, FakeEngine
from tests.facade.helpers import png_bytes, png_data_url
from vlmserve.engine.prep.lowering import IMAGE_FOLLOW_UP_MARKER, lower_messages
from vlmserve.engine.v1 import engine_pb2 as pb

RED = (255, 0, 0)
TOOL: Any = {
    "type": "function",
    "function": {"name": "screenshot", "parameters": {"type": "object", "properties": {}}},
}


def user(*content: Any) -> Any:
    return {"role": "user", "content": list(content)}


async def test_text_completion(sdk: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    completion = await sdk.chat.completions.create(
        model="default",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}],
        max_tokens=7,
        temperature=0.5,
        seed=42,
        stop=["\n\n"],
    )
    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-")
    assert completion.model == MODEL_ID
    (choice,) = completion.choices
    assert choice.message.content == "Hello, world."
    assert choice.message.role == "assistant"
    assert choice.finish_reason == "stop"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (11, 3)
    assert completion.usage.total_tokens == 14
    assert completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 2
    request = engine.requests[0]
    assert [m.role for m in request.messages] == [pb.ROLE_SYSTEM, pb.ROLE_USER]
    assert request.sampling.max_tokens == 7
    assert request.sampling.seed == 42
    assert list(request.sampling.stop) == ["\n\n"]
    assert request.sampling.temperature == pytest.approx(0.5)


async def test_image_url_parts_reach_the_engine_as_images(
    sdk: openai.AsyncOpenAI, engine: FakeEngine
) -> None:
    await sdk.chat.completions.create(
        model="default",
        messages=[
            user(
                {"type": "text", "text": "Colour?"},
                {"type": "image_url", "image_url": {"url": png_data_url(RED), "detail": "low"}},
            )
        ],
    )
    (message,) = engine.requests[0].messages
    assert [part.WhichOneof("kind") for part in message.parts] == ["text", "image"]
    assert message.parts[1].image.data == png_bytes(RED)
    assert message.parts[1].image.detail == pb.IMAGE_DETAIL_LOW


async def test_a_tool_message_with_an_image_is_lowered_like_a_function_call_output(
    sdk: openai.AsyncOpenAI, engine: FakeEngine
) -> None:
    messages: Any = [
        {"role": "user", "content": "Take a screenshot."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "screenshot", "arguments": "{}"}}
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "c1",
            "content": [
                {"type": "text", "text": "captured"},
                {"type": "image_url", "image_url": {"url": png_data_url(RED)}},
            ],
        },
    ]
    await sdk.chat.completions.create(model="default", messages=messages, tools=[TOOL])
    request = engine.requests[0]
    lowered = lower_messages(request.messages)  # as the engine renders them
    roles = [m.role for m in lowered]
    assert roles == [pb.ROLE_USER, pb.ROLE_ASSISTANT, pb.ROLE_TOOL, pb.ROLE_USER]
    assert [(c.id, c.name) for c in lowered[1].tool_calls] == [("c1", "screenshot")]
    assert lowered[2].tool_output.text.endswith(IMAGE_FOLLOW_UP_MARKER)
    assert lowered[3].parts[0].image.data == png_bytes(RED)
    assert [tool.function.name for tool in request.tools] == ["screenshot"]


@pytest.mark.parametrize("role", ["user", "tool"])
async def test_a_file_part_reaches_the_engine_as_the_responses_input_file_does(
    http: httpx.AsyncClient, engine: FakeEngine, role: str
) -> None:
    """Chat's `file` part is the Responses `input_file`: a PDF becomes each page's text and image."""
    data = "data:application/pdf;base64," + base64.b64encode(text_pdf(["First", "Second"])).decode()
    chat_part = {"type": "file", "file": {"file_data": data, "filename": "r.pdf"}}
    responses_part = {"type": "input_file", "file_data": data, "filename": "r.pdf"}
    call = {"id": "c1", "type": "function", "function": {"name": "screenshot", "arguments": "{}"}}
    if role == "user":
        messages: list[Any] = [user({"type": "text", "text": "Read it."}, chat_part)]
        items: list[Any] = [
            {"role": "user", "content": [{"type": "input_text", "text": "Read it."}, responses_part]}
        ]
    else:
        messages = [
            {"role": "user", "content": "Read it."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": [chat_part]},
        ]
        items = [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Read it."}]},
            {"type": "function_call", "call_id": "c1", "name": "screenshot", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": [responses_part]},
        ]
    tools = [{"type": "function", "name": "screenshot", "parameters": TOOL["function"]["parameters"]}]
    chat = await http.post(
        "/v1/chat/completions", json={"model": "default", "messages": messages, "tools": [TOOL]}
    )
    assert chat.status_code == 200, chat.text
    responses = await http.post("/v1/responses", json={"model": "default", "input": items, "tools": tools})
    assert responses.status_code == 200, responses.text
    via_chat, via_responses = engine.requests
    assert list(via_chat.messages) == list(via_responses.messages)
    lowered = lower_messages(via_chat.messages)  # as the engine renders them
    kinds = [part.WhichOneof("kind") for message in lowered for part in message.parts]
    assert kinds.count("image") == 2  # one per page


async def test_tool_calls_and_a_forced_choice(sdk: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    engine.script.text_chunks = []
    engine.script.tool_calls = [pb.ToolCall(id="call_1", name="screenshot", arguments='{"x": 1}')]
    completion = await sdk.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "shoot"}],
        tools=[TOOL],
        tool_choice={"type": "function", "function": {"name": "screenshot"}},
        parallel_tool_calls=False,
    )
    (choice,) = completion.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert (call.id, call.type) == ("call_1", "function")
    assert (call.function.name, json.loads(call.function.arguments)) == ("screenshot", {"x": 1})
    request = engine.requests[0]
    # The same engine choice as /v1/responses sends for a named function.
    assert request.tool_choice == pb.ToolChoice(function_name="screenshot")
    assert [tool.function.name for tool in request.tools] == ["screenshot"]
    assert request.parallel_tool_calls is False


async def test_response_format_json_schema_reaches_the_engine(
    sdk: openai.AsyncOpenAI, engine: FakeEngine
) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    await sdk.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "count"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "count", "schema": schema, "strict": True},
        },
    )
    await sdk.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "json"}],
        response_format={"type": "json_object"},
    )
    first, second = engine.requests
    assert first.response_format.json_schema.name == "count"
    assert json.loads(first.response_format.json_schema.schema_json) == schema
    assert first.response_format.json_schema.strict is True
    assert second.response_format.WhichOneof("format") == "json_object"


async def test_stream_with_usage(sdk: openai.AsyncOpenAI) -> None:
    stream = await sdk.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Say hello."}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert {chunk.id for chunk in chunks} == {chunks[0].id}
    # A text answer opens as OpenAI's does: the role, with empty content, on a chunk of its own.
    assert (chunks[0].choices[0].delta.role, chunks[0].choices[0].delta.content) == ("assistant", "")
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == "Hello, world."
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 14
    assert all(chunk.usage is None for chunk in chunks[:-1])


async def test_streamed_tool_calls_accumulate_to_the_call(
    sdk: openai.AsyncOpenAI, engine: FakeEngine
) -> None:
    engine.script.text_chunks = []
    engine.script.tool_calls = [
        pb.ToolCall(id="call_1", name="screenshot", arguments='{"a": 1}'),
        pb.ToolCall(id="call_2", name="screenshot", arguments='{"a": 2}'),
    ]
    stream = await sdk.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "two"}], tools=[TOOL], stream=True
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    deltas = []
    async for chunk in stream:
        assert chunk.usage is None
        deltas.append(chunk.choices[0].delta)
        for delta in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += delta.id or ""
            call["name"] += (delta.function.name if delta.function else None) or ""
            call["arguments"] += (delta.function.arguments if delta.function else None) or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert calls == {
        0: {"id": "call_1", "name": "screenshot", "arguments": '{"a": 1}'},
        1: {"id": "call_2", "name": "screenshot", "arguments": '{"a": 2}'},
    }
    # An answer that opens with a call carries the role on the call's chunk and never any content:
    # content "" would start an empty text part in clients (the AI SDK's chat provider).
    assert deltas[0].role == "assistant" and deltas[0].tool_calls
    assert all(delta.content is None for delta in deltas)


async def test_length_finish(sdk: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    engine.script.finish_reason = pb.FINISH_REASON_LENGTH
    completion = await sdk.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "x"}], max_completion_tokens=3
    )
    assert completion.choices[0].finish_reason == "length"
    assert engine.requests[0].sampling.max_tokens == 3


REFUSED: list[tuple[str, dict[str, Any], str, str | None]] = [
    ("n", {"n": 2}, "n", "unsupported_value"),
    ("top_logprobs without logprobs", {"top_logprobs": 2}, "top_logprobs", None),
    ("top_logprobs too high", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", None),
    ("logit_bias", {"logit_bias": {"1": 5}}, "logit_bias", "unsupported_value"),
    ("store", {"store": True}, "store", "unsupported_value"),
    ("penalty", {"presence_penalty": 0.5}, "presence_penalty", "unsupported_value"),
    ("service tier", {"service_tier": "scale"}, "service_tier", "invalid_value"),
    ("stream options without stream", {"stream_options": {"include_usage": True}}, "stream_options", None),
    ("temperature", {"temperature": 3}, "temperature", None),
    (
        "empty audio part",
        {"messages": [user({"type": "input_audio", "input_audio": {"data": "", "format": "wav"}})]},
        "messages[0].content[0].input_audio.data",
        "invalid_audio",
    ),
    (
        "audio part in an assistant message",
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}],
                }
            ]
        },
        "messages[0].content[0].type",
        "unsupported_value",
    ),
    (
        "function role",
        {"messages": [{"role": "function", "name": "f", "content": "x"}]},
        "messages[0].role",
        None,
    ),
    ("no messages", {"messages": []}, "messages", None),
    (
        "tool type",
        {"tools": [{"type": "custom", "custom": {"name": "x"}}]},
        "tools[0].type",
        "unsupported_value",
    ),
    ("tool choice", {"tool_choice": "sometimes"}, "tool_choice", None),
    (
        "image url not string",
        {"messages": [user({"type": "image_url", "image_url": {"url": 5}})]},
        None,
        None,
    ),
    (
        "json_schema missing",
        {"response_format": {"type": "json_schema"}},
        "response_format.json_schema",
        None,
    ),
]


@pytest.mark.parametrize(("case", "extra", "param", "code"), REFUSED, ids=[row[0] for row in REFUSED])
async def test_refusals_name_the_field(
    http: httpx.AsyncClient,
    engine: FakeEngine,
    case: str,
    extra: dict[str, Any],
    param: str | None,
    code: str | None,
) -> None:
    body = {"model": "default", "messages": [{"role": "user", "content": "hi"}], **extra}
    answer = await http.post("/v1/chat/completions", json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param
    else:
        assert error["param"]
    if code is not None:
        assert error["code"] == code
    assert engine.requests == []


async def test_sdk_raises_bad_request_naming_n(sdk: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk.chat.completions.create(model="default", messages=[{"role": "user", "content": "x"}], n=2)
    assert cast(Any, caught.value.body)["param"] == "n"


async def test_an_engine_failure_mid_stream_is_an_error_object(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    import grpc

    from vlmserve.engine.request_errors import RequestError

    engine.script.error = RequestError(grpc.StatusCode.INTERNAL, "boom")
    engine.script.error_after = 1
    body = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with http.stream("POST", "/v1/chat/completions", json=body) as answer:
        assert answer.status_code == 200
        lines = [line async for line in aiter_lines(answer) if line.startswith("data: ")]
    payloads = [json.loads(line.removeprefix("data: ")) for line in lines]
    assert "error" in payloads[-1]
    assert payloads[-1]["error"]["message"]


TRANSLATED_PARAMS: list[tuple[str, dict[str, Any], str]] = [
    (
        "bad image in a user message",
        {
            "messages": [
                user({"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": "data:,"}})
            ]
        },
        "messages[0].content[1]",
    ),
    (
        "bad image in a tool message",
        {
            "messages": [
                {"role": "user", "content": "x"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                    ],
                },
                {
                    "role": "tool",
                    "tool_call_id": "c1",
                    "content": [{"type": "image_url", "image_url": {"url": "data:,"}}],
                },
            ]
        },
        "messages[2].content[0]",
    ),
    (
        "bad file data",
        {"messages": [user({"type": "file", "file": {"file_data": "data:application/pdf;base64,!!"}})]},
        "messages[0].content[0].file.file_data",
    ),
    (
        "file without id or data",
        {"messages": [user({"type": "file", "file": {"filename": "a.pdf"}})]},
        "messages[0].content[0].file.file_id",
    ),
    ("too many output tokens", {"max_tokens": 10**9}, "max_tokens"),
    (
        "forced tool not offered",
        {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice",
    ),
]


@pytest.mark.parametrize(
    ("case", "extra", "param"), TRANSLATED_PARAMS, ids=[row[0] for row in TRANSLATED_PARAMS]
)
async def test_errors_of_the_shared_translation_name_the_chat_field(
    http: httpx.AsyncClient, case: str, extra: dict[str, Any], param: str
) -> None:
    body = {"model": "default", "messages": [{"role": "user", "content": "hi"}], **extra}
    answer = await http.post("/v1/chat/completions", json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"].startswith(param), error
    assert "input" not in error["param"] and "'input" not in error["message"]

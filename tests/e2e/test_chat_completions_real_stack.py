"""`/v1/chat/completions` on the real stack (vlmserve-engine + vlmserve-facade processes): the
openai SDK's `chat.completions` and LangChain's `ChatOpenAI` in its default (chat) mode.

The squares model answers "<N> <colour>" about its image and stops, so plain and streamed
answers complete; the recording hop shows that a chat request reaches the engine exactly as the
Responses request that means the same.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests._engine_recorder import EngineRecorder
from tests._services import ServiceProcess
from tests.e2e import squares_requests as squares
from tests.facade.helpers import png_data_url, screenshot_tool_input
from training.squares import QUESTION, draw_sample
from vlmserve.engine.prep.lowering import lower_messages
from vlmserve.engine.v1 import engine_pb2 as pb

SQUARES_MAX_TOKENS = 16


@pytest.fixture(scope="module")
def squares_chat(squares_facade_url: str) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{squares_facade_url}/v1", api_key="x", max_retries=0, timeout=120)
    yield client
    client.close()


def test_sdk_chat_completion_answers_the_image(squares_chat: openai.OpenAI, squares_facade_url: str) -> None:
    sample = draw_sample(random.Random(5))
    content: Any = [
        {"type": "text", "text": QUESTION},
        {"type": "image_url", "image_url": {"url": squares.data_url(sample)}},
    ]
    completion = squares_chat.chat.completions.create(
        model="default", messages=[{"role": "user", "content": content}], max_tokens=SQUARES_MAX_TOKENS
    )
    (choice,) = completion.choices
    assert choice.finish_reason == "stop"
    assert choice.message.content
    # The same question through /v1/responses gets the same (greedy) answer.
    with httpx.Client(base_url=squares_facade_url, timeout=120) as http:
        response = squares.create(
            http,
            squares.body(
                [
                    {
                        "role": "user",
                        "content": [{"type": "input_text", "text": QUESTION}, squares.input_image(sample)],
                    }
                ],
                max_output_tokens=SQUARES_MAX_TOKENS,
                temperature=0,
            ),
        )
    greedy = squares_chat.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": content}],
        max_tokens=SQUARES_MAX_TOKENS,
        temperature=0,
    )
    assert greedy.choices[0].message.content == squares.output_text(response)
    assert (
        completion.usage is not None and completion.usage.prompt_tokens == response["usage"]["input_tokens"]
    )


def test_sdk_stream_with_usage(squares_chat: openai.OpenAI) -> None:
    sample = draw_sample(random.Random(6))
    content: Any = [
        {"type": "text", "text": QUESTION},
        {"type": "image_url", "image_url": {"url": squares.data_url(sample)}},
    ]
    chunks = list(
        squares_chat.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": content}],
            max_tokens=SQUARES_MAX_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens > 0


def test_sdk_forced_tool_call_and_json_schema(squares_chat: openai.OpenAI) -> None:
    tool: Any = {
        "type": "function",
        "function": {
            "name": "count",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {"n": {"type": "integer"}},
                "required": ["n"],
                "additionalProperties": False,
            },
        },
    }
    forced = squares_chat.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "count"}],
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "count"}},
        max_tokens=32,
    )
    assert forced.choices[0].finish_reason == "tool_calls"
    (call,) = forced.choices[0].message.tool_calls or []
    assert call.function.name == "count"
    assert isinstance(json.loads(call.function.arguments)["n"], int)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    structured = squares_chat.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "ok?"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "ok", "schema": schema, "strict": True},
        },
        max_tokens=32,
    )
    assert isinstance(json.loads(structured.choices[0].message.content or "")["ok"], bool)


def test_sdk_chat_stream_helper_on_a_forced_tool_call(squares_chat: openai.OpenAI) -> None:
    """The SDK's `chat.completions.stream()` accumulates a streamed tool call (it raised on the
    continuation chunks' explicit nulls)."""
    tool: Any = {
        "type": "function",
        "function": {
            "name": "count",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {"n": {"type": "integer"}},
                "required": ["n"],
                "additionalProperties": False,
            },
        },
    }
    with squares_chat.chat.completions.stream(
        model="default",
        messages=[{"role": "user", "content": "count"}],
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "count"}},
        max_tokens=32,
    ) as stream:
        done = [event for event in stream if event.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    [choice] = final.choices
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "count"
    assert [event.arguments for event in done] == [call.function.arguments]
    assert isinstance(json.loads(call.function.arguments)["n"], int)


def test_sdk_n_and_top_logprobs_alone_are_400(squares_chat: openai.OpenAI) -> None:
    for extra, param in (({"n": 2}, "n"), ({"top_logprobs": 2}, "top_logprobs")):
        with pytest.raises(openai.BadRequestError) as caught:
            squares_chat.chat.completions.create(
                model="default", messages=[{"role": "user", "content": "x"}], **extra
            )
        assert caught.value.body["param"] == param  # type: ignore[index]


def test_chat_tool_message_reaches_the_engine_as_the_responses_request_does(
    recorded_facade: ServiceProcess, engine_recorder: EngineRecorder
) -> None:
    image = png_data_url((0, 0, 255))
    chat_messages = [
        {"role": "user", "content": "Take a screenshot and tell me its dominant color."},
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
                {"type": "image_url", "image_url": {"url": image}},
            ],
        },
    ]
    tool = {"type": "function", "name": "screenshot", "parameters": {"type": "object", "properties": {}}}
    chat_tool = {"type": "function", "function": {"name": "screenshot", "parameters": tool["parameters"]}}
    requests = []
    with httpx.Client(base_url=recorded_facade.address, timeout=60) as http:
        answer = http.post(
            "/v1/responses",
            json={
                "model": "default",
                "input": screenshot_tool_input(image),
                "tools": [tool],
                "max_output_tokens": 2,
            },
        )
        assert answer.status_code == 200, answer.text
        requests.append(engine_recorder_request(engine_recorder, answer.json()["id"]))
        answer = http.post(
            "/v1/chat/completions",
            json={"model": "default", "messages": chat_messages, "tools": [chat_tool], "max_tokens": 2},
        )
        assert answer.status_code == 200, answer.text
        response_id = "resp_" + answer.json()["id"].removeprefix("chatcmpl-")
        requests.append(engine_recorder_request(engine_recorder, response_id))
    assert requests[0] == requests[1]
    assert [m.role for m in lower_messages(requests[0].messages)] == [  # as the engine renders them
        pb.ROLE_USER,
        pb.ROLE_ASSISTANT,
        pb.ROLE_TOOL,
        pb.ROLE_USER,
    ]


def engine_recorder_request(recorder: EngineRecorder, response_id: str) -> pb.GenerateRequest:
    (call,) = [call for call in recorder.recording.calls if call.request.request_id == response_id]
    request = pb.GenerateRequest()
    request.CopyFrom(call.request)
    request.request_id = ""
    return request


def test_langchain_chat_openai_default_mode(squares_facade_url: str) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage

    sample = draw_sample(random.Random(7))
    chat = langchain_openai.ChatOpenAI(
        base_url=f"{squares_facade_url}/v1",
        api_key="x",
        model="default",
        max_tokens=SQUARES_MAX_TOKENS,
        temperature=0,
        max_retries=0,
    )
    assert not chat.use_responses_api
    message = HumanMessage(
        content=[
            {"type": "text", "text": QUESTION},
            {"type": "image_url", "image_url": {"url": squares.data_url(sample)}},
        ]
    )
    answer = chat.invoke([message])
    assert isinstance(answer.content, str) and answer.content
    assert answer.response_metadata["finish_reason"] == "stop"
    assert answer.usage_metadata is not None and answer.usage_metadata["input_tokens"] > 0
    streamed = "".join(str(chunk.content) for chunk in chat.stream([message]))
    assert streamed == answer.content

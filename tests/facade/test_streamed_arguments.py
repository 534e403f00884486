"""Tool-call arguments streamed as the engine writes them (`GenerateChunk.tool_call_delta`):
`response.function_call_arguments.delta` per piece on /v1/responses, tool-call argument deltas
on /v1/chat/completions, the stored response equal to the streamed one; a call the output ended
inside of is `incomplete`."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.facade.fake_engine import FakeEngine
from tests.facade.helpers import SCREENSHOT_TOOL, parse_sse
from tests.facade.test_streaming import check_events, stream
from vlmserve.engine.v1 import engine_pb2 as pb

ARGUMENTS = '{"window": "main", "zoom": 2}'
PIECES = ['{"window": ', '"main", ', '"zoom": 2}']


def _script_streamed_call(engine: FakeEngine, *, finished: bool = True) -> None:
    engine.script.text_chunks = ["Looking."]
    engine.script.tool_call_deltas = [
        pb.ToolCallDelta(id="call_1", name="screenshot"),
        *(pb.ToolCallDelta(id="call_1", arguments=piece) for piece in PIECES),
    ]
    engine.script.tool_calls = (
        [pb.ToolCall(id="call_1", name="screenshot", arguments=ARGUMENTS)] if finished else []
    )
    if not finished:
        engine.script.finish_reason = pb.FINISH_REASON_LENGTH


async def test_arguments_stream_piece_by_piece(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    _script_streamed_call(engine)
    _, events = await stream(http, input="look", tools=[SCREENSHOT_TOOL])
    check_events(events)
    kinds = [event["type"] for event in events]
    call_start = kinds.index("response.output_item.added", kinds.index("response.output_text.done"))
    assert kinds[call_start:] == [
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * len(PIECES),
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added, done = events[call_start]["item"], events[-2]["item"]
    assert added["status"] == "in_progress" and added["arguments"] == ""
    assert [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"] == PIECES
    assert done["id"] == added["id"] and done["status"] == "completed" and done["arguments"] == ARGUMENTS
    final = events[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["message", "function_call"]
    assert final["output"][1] == done
    stored = await http.get(f"/v1/responses/{final['id']}")
    assert stored.json()["output"] == final["output"]


async def test_a_plain_response_has_the_whole_call(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    _script_streamed_call(engine)
    response = await http.post(
        "/v1/responses", json={"model": "default", "input": "look", "tools": [SCREENSHOT_TOOL]}
    )
    (call,) = [item for item in response.json()["output"] if item["type"] == "function_call"]
    assert (call["call_id"], call["arguments"], call["status"]) == ("call_1", ARGUMENTS, "completed")


async def test_a_call_cut_off_by_the_token_limit_is_incomplete(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    _script_streamed_call(engine, finished=False)
    _, events = await stream(http, input="look", tools=[SCREENSHOT_TOOL])
    check_events(events)
    assert events[-1]["type"] == "response.incomplete"
    done = events[-2]
    assert done["type"] == "response.output_item.done"
    assert done["item"]["status"] == "incomplete" and done["item"]["arguments"] == ARGUMENTS
    assert not any(e["type"] == "response.function_call_arguments.done" for e in events)


async def test_chat_completion_chunks_stream_the_arguments(
    sdk: openai.AsyncOpenAI, engine: FakeEngine
) -> None:
    _script_streamed_call(engine)
    tool: Any = {"type": "function", "function": {"name": "screenshot", "parameters": {"type": "object"}}}
    stream_ = await sdk.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "look"}], tools=[tool], stream=True
    )
    pieces: list[str] = []
    names: list[str] = []
    async for chunk in stream_:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                if delta.function and delta.function.name:
                    names.append(delta.function.name)
                if delta.function and delta.function.arguments:
                    pieces.append(delta.function.arguments)
    assert names == ["screenshot"] and pieces == PIECES


@pytest.mark.parametrize("streamed", [True, False])
async def test_a_call_cut_off_alone_is_the_only_item(
    http: httpx.AsyncClient, engine: FakeEngine, streamed: bool
) -> None:
    """The output ended inside its only call: one `incomplete` function_call, no empty message."""
    _script_streamed_call(engine, finished=False)
    engine.script.text_chunks = []
    if streamed:
        _, events = await stream(http, input="look", tools=[SCREENSHOT_TOOL])
        resource = events[-1]["response"]
    else:
        body = {"model": "default", "input": "look", "tools": [SCREENSHOT_TOOL]}
        reply = await http.post("/v1/responses", json=body)
        resource = reply.json()
    assert resource["status"] == "incomplete"
    [item] = resource["output"]
    assert item["type"] == "function_call" and item["status"] == "incomplete"
    assert item["arguments"] == ARGUMENTS


CHAT_TOOL: Any = {"type": "function", "function": {"name": "screenshot", "parameters": {"type": "object"}}}


async def _chat(http: httpx.AsyncClient, *, stream: bool) -> httpx.Response:
    body = {"model": "default", "messages": [{"role": "user", "content": "look"}], "tools": [CHAT_TOOL]}
    return await http.post("/v1/chat/completions", json={**body, "stream": stream})


def _calls(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        call
        for chunk in chunks
        for choice in chunk["choices"]
        for call in choice["delta"].get("tool_calls") or []
    ]


def _chat_chunks(reply: httpx.Response) -> list[dict[str, Any]]:
    datas = [event.data for event in parse_sse(reply.text)]
    assert datas[-1] == "[DONE]"
    return [json.loads(data) for data in datas[:-1]]


@pytest.mark.parametrize("written", [[], PIECES[:1]])
async def test_a_chat_call_cut_off_is_left_out_of_the_completion(
    http: httpx.AsyncClient, engine: FakeEngine, written: list[str]
) -> None:
    """Consistent with Messages: a call the token limit cut off (no arguments yet, or part of
    them) is not a call the client could run; `finish_reason` says why the turn ended."""
    _script_streamed_call(engine, finished=False)
    engine.script.text_chunks = []
    engine.script.tool_call_deltas = engine.script.tool_call_deltas[: 1 + len(written)]
    reply = await _chat(http, stream=False)
    assert reply.status_code == 200, reply.text
    (choice,) = reply.json()["choices"]
    assert choice["finish_reason"] == "length"
    assert choice["message"] == {"role": "assistant", "content": "", "refusal": None, "tool_calls": None}


async def test_a_chat_stream_never_sends_a_call_without_arguments(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    """Cut off before its first piece: the call never appears in the stream."""
    _script_streamed_call(engine, finished=False)
    engine.script.text_chunks = []
    engine.script.tool_call_deltas = engine.script.tool_call_deltas[:1]
    chunks = _chat_chunks(await _chat(http, stream=True))
    assert not any(choice["delta"].get("tool_calls") for chunk in chunks for choice in chunk["choices"])
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_a_chat_calls_first_chunk_carries_its_first_arguments(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    _script_streamed_call(engine)
    chunks = _chat_chunks(await _chat(http, stream=True))
    calls = [
        call
        for chunk in chunks
        for choice in chunk["choices"]
        for call in choice["delta"].get("tool_calls") or []
    ]
    assert calls[0] == {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "screenshot", "arguments": PIECES[0]},
    }
    assert [call["function"] for call in calls[1:]] == [{"arguments": piece} for piece in PIECES[1:]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_a_whole_call_without_streamed_arguments_still_goes_out(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.script.text_chunks = []
    engine.script.tool_calls = [pb.ToolCall(id="call_2", name="screenshot", arguments="{}")]
    chunks = _chat_chunks(await _chat(http, stream=True))
    calls = [
        call
        for chunk in chunks
        for choice in chunk["choices"]
        for call in choice["delta"].get("tool_calls") or []
    ]
    assert calls == [
        {
            "index": 0,
            "id": "call_2",
            "type": "function",
            "function": {"name": "screenshot", "arguments": "{}"},
        }
    ]

"""`/v1/messages` applies `context_management.edits` and says what it applied (issue 36.2), on
the wire: the response's `context_management`, the stream's `message_delta`, and what the model
was sent. A replayed `compaction` block is accepted and covers what came before it."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx

from tests.facade.fake_engine import FakeEngine
from tests.facade.helpers import parse_sse, png_bytes
from vlmserve.engine.v1 import engine_pb2 as pb

CLEAR = {
    "type": "clear_tool_uses_20250919",
    "trigger": {"type": "input_tokens", "value": 1},
    "keep": {"type": "tool_uses", "value": 1},
}
TOOLS = [{"name": "Read", "input_schema": {"type": "object"}}]


def body(**extra: Any) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Read the files."}]
    for n in range(3):
        messages.append(
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"t{n}", "name": "Read", "input": {}}],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": f"t{n}", "content": f"contents of file {n}"}
                ],
            }
        )
    return {"model": "default", "max_tokens": 16, "tools": TOOLS, "messages": messages, **extra}


def tool_outputs(request: pb.GenerateRequest) -> list[str]:
    return [m.tool_output.text for m in request.messages if m.role == pb.ROLE_TOOL]


async def test_cleared_tool_results_and_the_report(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    reply = await http.post("/v1/messages", json=body(context_management={"edits": [CLEAR]}))
    assert reply.status_code == 200, reply.text
    message = reply.json()
    assert message["context_management"] == {
        "applied_edits": [
            {"type": "clear_tool_uses_20250919", "cleared_tool_uses": 2, "cleared_input_tokens": 8}
        ]
    }
    (sent,) = engine.requests
    assert tool_outputs(sent) == ["[Tool result cleared to save context]"] * 2 + ["contents of file 2"]
    # The trigger was checked against the engine's count of the prompt.
    assert len(engine.count_requests) == 1


async def test_the_stream_reports_on_message_delta(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    reply = await http.post("/v1/messages", json=body(context_management={"edits": [CLEAR]}, stream=True))
    events = {event.event: json.loads(event.data) for event in parse_sse(reply.text)}
    assert events["message_delta"]["context_management"]["applied_edits"][0]["cleared_tool_uses"] == 2


async def test_below_the_trigger_nothing_is_cleared(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    high = {**CLEAR, "trigger": {"type": "input_tokens", "value": 100_000}}
    reply = await http.post("/v1/messages", json=body(context_management={"edits": [high]}))
    assert reply.json()["context_management"] == {"applied_edits": []}
    assert tool_outputs(engine.requests[0]) == [f"contents of file {n}" for n in range(3)]


async def test_without_context_management_the_answer_has_none(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    reply = await http.post("/v1/messages", json=body())
    assert "context_management" not in reply.json() and engine.count_requests == []


async def test_a_replayed_compaction_block_is_accepted(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    messages = [
        {"role": "user", "content": "A long task."},
        {
            "role": "assistant",
            "content": [{"type": "compaction", "content": "Goal: read three files; two done."}],
        },
        {"role": "user", "content": "Continue."},
    ]
    reply = await http.post("/v1/messages", json={"model": "default", "max_tokens": 16, "messages": messages})
    assert reply.status_code == 200, reply.text
    (sent,) = engine.requests
    texts = [(m.role, p.text.text) for m in sent.messages for p in m.parts if p.HasField("text")]
    assert texts == [
        (pb.ROLE_ASSISTANT, "Summary of the conversation so far:\nGoal: read three files; two done."),
        (pb.ROLE_USER, "Continue."),
    ]


async def test_a_bad_edit_is_an_anthropic_400_naming_it(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    reply = await http.post("/v1/messages", json=body(context_management={"edits": [{"type": "clear_all"}]}))
    assert reply.status_code == 400
    assert (
        reply.json()["type"] == "error"
        and "context_management.edits[0].type" in reply.json()["error"]["message"]
    )


COMPACT = {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 1}}


async def test_compact_summarises_first_and_answers_on_the_summary(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.script.text_chunks = ["Goal: read files. ", "<tool_call>{}</tool_call>"]
    edit = {**COMPACT, "instructions": "Keep file names."}
    reply = await http.post("/v1/messages", json=body(context_management={"edits": [edit]}))
    assert reply.status_code == 200, reply.text
    message = reply.json()
    assert message["content"][0] == {"type": "compaction", "content": "Goal: read files."}
    assert message["content"][1]["type"] == "text"
    summarising, answering = engine.requests
    assert "Keep file names." in summarising.messages[-1].parts[0].text.text
    texts = [(m.role, p.text.text) for m in answering.messages for p in m.parts if p.HasField("text")]
    assert texts[0] == (pb.ROLE_ASSISTANT, "Summary of the conversation so far:\nGoal: read files.")
    # The client sends the block back next turn: accepted, covering what came before.
    replay = body()
    replay["messages"] = [
        {"role": "user", "content": "Read the files."},
        {"role": "assistant", "content": message["content"]},
        {"role": "user", "content": "Go on."},
    ]
    assert (await http.post("/v1/messages", json=replay)).status_code == 200


async def test_pause_after_compaction_answers_the_block_alone(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    edit = {**COMPACT, "pause_after_compaction": True}
    reply = await http.post("/v1/messages", json=body(context_management={"edits": [edit]}))
    message = reply.json()
    assert message["stop_reason"] == "compaction" and message["content"] == [
        {"type": "compaction", "content": "Hello, world."}
    ]
    assert len(engine.requests) == 1  # the summary only
    streamed = await http.post("/v1/messages", json=body(context_management={"edits": [edit]}, stream=True))
    kinds = [event.event for event in parse_sse(streamed.text)]
    assert kinds == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


async def test_the_stream_puts_the_compaction_block_first(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    reply = await http.post("/v1/messages", json=body(context_management={"edits": [COMPACT]}, stream=True))
    from anthropic.types.beta import BetaRawMessageStreamEvent
    from pydantic import TypeAdapter

    events = [json.loads(event.data) for event in parse_sse(reply.text)]
    adapter: TypeAdapter[Any] = TypeAdapter(BetaRawMessageStreamEvent)
    for event in events:
        if event["type"] != "ping":
            adapter.validate_python(event)
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert [(e["index"], e["content_block"]["type"]) for e in starts] == [(0, "compaction"), (1, "text")]


async def test_a_failed_compaction_block_is_a_no_op(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    messages = [
        {"role": "user", "content": "Earlier."},
        {
            "role": "assistant",
            "content": [{"type": "compaction", "content": None}, {"type": "text", "text": "ok"}],
        },
        {"role": "user", "content": "Now."},
    ]
    reply = await http.post("/v1/messages", json={"model": "default", "max_tokens": 8, "messages": messages})
    assert reply.status_code == 200, reply.text
    texts = [p.text.text for m in engine.requests[0].messages for p in m.parts if p.HasField("text")]
    assert texts == ["Earlier.", "ok", "Now."]


async def test_clearing_brings_a_request_past_the_image_limit_back(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    """20 screenshots are more than a request may hold (16): past every trigger, so the old ones
    are cleared first, and the request is answered."""
    png = base64.b64encode(png_bytes()).decode()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Watch the screen."}]
    for n in range(20):
        messages.append(
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"s{n}", "name": "Read", "input": {}}],
            }
        )
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}
        messages.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"s{n}", "content": [image]}]}
        )
    high = {
        **CLEAR,
        "trigger": {"type": "input_tokens", "value": 100_000},
        "keep": {"type": "tool_uses", "value": 3},
    }
    request = {"model": "default", "max_tokens": 8, "tools": TOOLS, "messages": messages}
    refused = await http.post("/v1/messages", json=request)
    assert refused.status_code == 400
    reply = await http.post("/v1/messages", json={**request, "context_management": {"edits": [high]}})
    assert reply.status_code == 200, reply.text
    assert reply.json()["context_management"]["applied_edits"][0]["cleared_tool_uses"] == 17
    images = [
        p for m in engine.requests[0].messages for p in m.tool_output.parts.parts if p.HasField("image")
    ]
    assert len(images) == 3
    # With compact_20260112 too: cleared first, then summarised and answered on the summary.
    both = {"edits": [high, COMPACT]}
    reply = await http.post("/v1/messages", json={**request, "context_management": both})
    assert reply.status_code == 200, reply.text
    assert reply.json()["content"][0]["type"] == "compaction"

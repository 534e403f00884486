"""A thinking model's reasoning: a `reasoning` output item, `response.reasoning_text.*` events,
`reasoning_tokens` in usage, and never any of it in `output_text` (fake engine)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.facade.fake_engine import FakeEngine, Script
from tests.facade.helpers import EVENT_SCHEMAS, assert_valid
from tests.facade.test_streaming import stream
from vlmserve.engine.v1 import engine_pb2 as pb

# OpenAI's API and SDK name these `response.reasoning_text.*`; the Open Responses spec's schemas
# for the same payloads are named `response.reasoning.*`.
REASONING_SCHEMAS = {
    "response.reasoning_text.delta": ("response.reasoning.delta", "ResponseReasoningDeltaStreamingEvent"),
    "response.reasoning_text.done": ("response.reasoning.done", "ResponseReasoningDoneStreamingEvent"),
}

USAGE = {"input_tokens": 3, "output_tokens": 9, "reasoning_tokens": 6}


def _script() -> Script:
    return Script(
        reasoning_chunks=["Let me ", "think."],
        text_chunks=["The ", "answer."],
        usage=pb.Usage(**USAGE),
    )


def _check(events: list[dict[str, Any]]) -> None:
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    for event in events:
        if event["type"] in REASONING_SCHEMAS:
            spec_type, schema = REASONING_SCHEMAS[event["type"]]
            assert_valid({**event, "type": spec_type}, schema)
        else:
            assert_valid(event, EVENT_SCHEMAS[event["type"]])


def _check_resource(resource: dict[str, Any]) -> None:
    reasoning, message = resource["output"]
    assert reasoning["type"] == "reasoning" and reasoning["id"].startswith("rs_")
    assert reasoning["summary"] == []
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Let me think."}]
    assert_valid(reasoning, "ReasoningBody")
    assert message["type"] == "message"
    assert message["content"][0]["text"] == "The answer."
    assert resource["usage"]["output_tokens_details"] == {"reasoning_tokens": 6}


async def test_streamed_reasoning_item_and_events(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.script = _script()
    _, events = await stream(http, input="hi")
    _check(events)
    types = [event["type"] for event in events]
    assert types[:10] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
    ]
    assert events[3]["part"] == {"type": "reasoning_text", "text": ""}
    assert events[6]["text"] == "Let me think." and events[6]["output_index"] == 0
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == "The answer."
    assert events[-1]["type"] == "response.completed"
    _check_resource(events[-1]["response"])


async def test_plain_response_has_the_reasoning_item(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.script = _script()
    response = await http.post("/v1/responses", json={"model": "default", "input": "hi"})
    assert response.status_code == 200, response.text
    body = response.json()
    _check_resource(body)
    stored = await http.get(f"/v1/responses/{body['id']}")
    assert stored.json()["output"] == body["output"]
    # A later turn replays it as the thinking of the assistant turn, never as its text.
    follow = await http.post(
        "/v1/responses", json={"model": "default", "input": "more", "previous_response_id": body["id"]}
    )
    assert follow.status_code == 200, follow.text
    replayed = engine.requests[-1]
    assert all("Let me think." not in part.text.text for m in replayed.messages for part in m.parts)
    assistant = [m for m in replayed.messages if m.role == pb.ROLE_ASSISTANT]
    assert [m.reasoning_text for m in assistant] == ["Let me think."]

"""`context_management: [{"type": "compaction", "compact_threshold": N}]` (issue 36.1): past the
threshold the conversation is compacted first and the answer is generated on the compacted
input, the `compaction` item first in the output; without the field, only when the prompt
would not fit; `[]` opts out; a threshold the instructions reach is a 400 naming it. The scripted
engine counts a word as a token in a 4096-token context."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from tests.facade.fake_engine import FakeEngine
from tests.facade.helpers import parse_sse
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.responses import SUMMARY_INSTRUCTION


def words(tag: str, count: int) -> str:
    return " ".join([tag] * count)


def conversation(size: int = 100) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": words("task", size)},
        {"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "seen"},
        {"role": "assistant", "content": words("answer", size)},
        {"role": "user", "content": "And now?"},
    ]


def threshold(n: int) -> list[dict[str, Any]]:
    return [{"type": "compaction", "compact_threshold": n}]


def texts(request: pb.GenerateRequest) -> list[str]:
    return [p.text.text for m in request.messages for p in m.parts if p.HasField("text")]


async def test_past_the_threshold_it_compacts_first(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    body = {"model": "default", "input": conversation(), "context_management": threshold(150)}
    reply = await http.post("/v1/responses", json=body)
    assert reply.status_code == 200, reply.text
    output = reply.json()["output"]
    assert [item["type"] for item in output] == ["compaction", "message"]
    assert output[0]["encrypted_content"].startswith("vlmserve.compaction.v2.")
    summarising, answering = engine.requests
    assert texts(summarising)[-1] == SUMMARY_INSTRUCTION
    # The summary's budget is a sixteenth of the 4096-token context: it must leave room.
    assert summarising.sampling.max_tokens == 256
    # The answer was generated on the summary and the last user message, not the whole history.
    assert texts(answering) == ["Summary of the conversation so far:\nHello, world.", "And now?"]


async def test_the_stream_carries_the_item_first(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    body = {"model": "default", "input": conversation(), "context_management": threshold(150), "stream": True}
    reply = await http.post("/v1/responses", json=body)
    events = [json.loads(e.data) for e in parse_sse(reply.text) if e.data != "[DONE]"]
    kinds = [e["type"] for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
    ]
    assert events[2]["item"]["type"] == "compaction" and events[2]["output_index"] == 0
    assert {e["output_index"] for e in events[4:] if "output_index" in e} == {1}
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [i["type"] for i in events[-1]["response"]["output"]] == ["compaction", "message"]


async def test_below_the_threshold_nothing_changes(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    body = {"model": "default", "input": conversation(), "context_management": threshold(100_000)}
    reply = await http.post("/v1/responses", json=body)
    assert [item["type"] for item in reply.json()["output"]] == ["message"]
    assert len(engine.requests) == 1 and len(engine.count_requests) == 1


async def test_an_empty_list_opts_out(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    body = {"model": "default", "input": conversation(3000), "context_management": []}
    reply = await http.post("/v1/responses", json=body)
    assert reply.status_code == 200
    assert engine.count_requests == [] and len(engine.requests) == 1


async def test_without_the_field_only_when_it_would_not_fit(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    small = await http.post("/v1/responses", json={"model": "default", "input": conversation()})
    assert [item["type"] for item in small.json()["output"]] == ["message"] and engine.count_requests == []
    big = await http.post("/v1/responses", json={"model": "default", "input": conversation(2500)})
    assert big.status_code == 200, big.text
    assert [item["type"] for item in big.json()["output"]] == ["compaction", "message"]


async def test_a_threshold_the_instructions_reach_is_a_400(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    body = {
        "model": "default",
        "instructions": words("rule", 200),
        "input": conversation(),
        "context_management": threshold(150),
    }
    reply = await http.post("/v1/responses", json=body)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "context_management[0].compact_threshold"
    assert engine.requests == []


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ({"type": "compaction"}, "context_management"),
        ([{"type": "truncate"}], "context_management[0].type"),
        ([{"type": "compaction", "compact_threshold": 0}], "context_management[0].compact_threshold"),
        ([{"type": "compaction", "compact_threshold": 10, "x": 1}], "context_management[0].x"),
    ],
)
async def test_bad_values_are_400s_naming_the_field(
    http: httpx.AsyncClient, engine: FakeEngine, value: Any, param: str
) -> None:
    reply = await http.post(
        "/v1/responses", json={"model": "default", "input": "hi", "context_management": value}
    )
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == param


async def test_it_is_stored_as_answered(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    """Retrieved as its client got it: the item first in the output (its input is the compacted
    one, the item first)."""
    body = {"model": "default", "input": conversation(), "context_management": threshold(150)}
    answered = (await http.post("/v1/responses", json=body)).json()
    stored = (await http.get(f"/v1/responses/{answered['id']}")).json()
    assert stored["output"] == answered["output"]
    assert [item["type"] for item in stored["output"]] == ["compaction", "message"]
    listed = (await http.get(f"/v1/responses/{answered['id']}/input_items?order=asc")).json()
    assert listed["data"][0]["type"] == "compaction"


async def test_a_background_one_is_stored_with_the_item(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    body = {
        "model": "default",
        "input": conversation(),
        "context_management": threshold(150),
        "background": True,
    }
    queued = (await http.post("/v1/responses", json=body)).json()
    for _ in range(200):
        stored = (await http.get(f"/v1/responses/{queued['id']}")).json()
        if stored["status"] == "completed":
            break
        await asyncio.sleep(0.05)
    assert [item["type"] for item in stored["output"]] == ["compaction", "message"]

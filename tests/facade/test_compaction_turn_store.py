"""A `compaction_trigger` turn is stored as its client sees it (issue 36.1): retrieved with the
compaction item as its output, its input items as sent (the trigger included), continued by
`previous_response_id` from the summary on, in its conversation as the item; `store: false`
keeps it out. The turn after it is prefilled before the answer goes out: the request's tools,
then the item (what the next turn starts with). `POST /v1/responses/compact` stays stateless, as
OpenAI's is. The wire and the engine requests are asserted as sent (the model is scripted)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import websockets.asyncio.client

from tests.facade.fake_engine import FakeEngine
from tests.facade.helpers import parse_sse, png_bytes
from tests.facade.test_compaction_trigger import BLUE, GREEN, TOOLS, TRIGGER, compact, session, texts
from vlmserve.engine.v1 import engine_pb2 as pb

SUMMARY = "Summary of the conversation so far:\nHello, world."


def images(message: pb.Message) -> list[bytes]:
    return [part.image.data for part in message.parts if part.HasField("image")]


async def test_the_turn_is_stored_as_answered(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    answered = (await compact(http)).json()
    assert answered["store"] is True
    stored = await http.get(f"/v1/responses/{answered['id']}")
    assert stored.status_code == 200, stored.text
    assert stored.json()["output"] == answered["output"] and stored.json()["status"] == "completed"
    listed = (await http.get(f"/v1/responses/{answered['id']}/input_items?order=asc&limit=100")).json()
    kinds = [item["type"] for item in listed["data"]]
    assert kinds[-1] == "compaction_trigger" and len(kinds) == len(session()) + 1
    # Its summarising call's instruction is not among them.
    assert "Summarise" not in json.dumps(listed)


async def test_a_chain_continues_from_the_summary(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    answered = (await compact(http)).json()
    body = {"model": "default", "previous_response_id": answered["id"], "input": "Go on.", "tools": TOOLS}
    reply = await http.post("/v1/responses", json=body)
    assert reply.status_code == 200, reply.text
    sent = engine.requests[-1]
    assert [m.role for m in sent.messages] == [pb.ROLE_ASSISTANT, pb.ROLE_USER, pb.ROLE_USER]
    assert texts(sent.messages[0]) == [SUMMARY]
    assert images(sent.messages[1]) == [png_bytes(GREEN), png_bytes(BLUE)]
    assert texts(sent.messages[2]) == ["Go on."]


async def test_the_next_turn_is_prewarmed_first(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    reply = await compact(http)
    # Both engine calls are made by the time the answer is read: the summary, then the prewarm.
    summarising, warming = engine.requests
    assert warming.sampling.max_tokens == 1
    # The next turn's prefix: the same tools, the summary, the kept screenshots.
    assert list(warming.tools) == list(summarising.tools) and len(warming.tools) == 1
    assert [m.role for m in warming.messages] == [pb.ROLE_ASSISTANT, pb.ROLE_USER]
    assert texts(warming.messages[0]) == [SUMMARY]
    assert images(warming.messages[1]) == [png_bytes(GREEN), png_bytes(BLUE)]
    (item,) = reply.json()["output"]
    after = {"model": "default", "input": [item, {"role": "user", "content": "Go on."}], "tools": TOOLS}
    await http.post("/v1/responses", json=after)
    # What the next turn sends starts with exactly what was prewarmed.
    assert list(engine.requests[-1].messages)[:2] == list(warming.messages)


async def test_store_false_keeps_it_out(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    answered = (await compact(http, store=False)).json()
    assert answered["store"] is False
    assert (await http.get(f"/v1/responses/{answered['id']}")).status_code == 404
    assert len(engine.requests) == 2  # prewarmed all the same


async def test_the_stream_says_the_same(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    reply = await compact(http, stream=True)
    events = [json.loads(event.data) for event in parse_sse(reply.text) if event.data != "[DONE]"]
    completed = events[-1]["response"]
    stored = (await http.get(f"/v1/responses/{completed['id']}")).json()
    assert stored["output"] == completed["output"] and stored["output"][0]["type"] == "compaction"


async def test_its_conversation_gets_the_item(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    conversation = (await http.post("/v1/conversations", json={})).json()["id"]
    await compact(http, conversation=conversation)
    listed = (await http.get(f"/v1/conversations/{conversation}/items?order=asc&limit=100")).json()
    kinds = [item["type"] for item in listed["data"]]
    assert kinds[-2:] == ["compaction_trigger", "compaction"] and len(kinds) == len(session()) + 2
    assert "Summarise" not in json.dumps(listed)
    body = {"model": "default", "conversation": conversation, "input": "Go on."}
    assert (await http.post("/v1/responses", json=body)).status_code == 200
    assert texts(engine.requests[-1].messages[0]) == [SUMMARY]


async def test_a_stored_turn_continues_over_websocket(server_url: str, engine: FakeEngine) -> None:
    url = server_url.replace("http", "ws") + "/v1/responses"
    async with websockets.asyncio.client.connect(url) as connection:
        create = {"type": "response.create", "model": "default", "input": [*session(), TRIGGER]}
        await connection.send(json.dumps(create))
        done = await _until_done(connection)
        compacted = done[-1]["response"]["id"]
        follow = {
            "type": "response.create",
            "model": "default",
            "previous_response_id": compacted,
            "input": "Go on.",
        }
        await connection.send(json.dumps(follow))
        assert (await _until_done(connection))[-1]["type"] == "response.completed"
    assert texts(engine.requests[-1].messages[0]) == [SUMMARY]


async def test_the_compact_endpoint_stores_nothing(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    reply = await http.post("/v1/responses/compact", json={"model": "default", "input": session()})
    assert reply.status_code == 200, reply.text
    assert (await http.get(f"/v1/responses/{reply.json()['id']}")).status_code == 404


async def _until_done(connection: Any) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while True:
        event = json.loads(await connection.recv())
        events.append(event)
        if event["type"] in ("response.completed", "response.failed", "error"):
            return events

"""WebSocket mode keeps the connection's last response in memory (issue 36, conformance round 4):
a `store: false` response is continued by `previous_response_id` on the same connection; an id
neither remembered nor stored is error code `previous_response_not_found`, as over HTTP.

Raw WebSocket messages and HTTP bodies are asserted as sent."""

from __future__ import annotations

import json
from typing import Any

import httpx
import websockets.asyncio.client

from tests.facade.fake_engine import FakeEngine
from tests.facade.helpers import until_done
from vlmserve.engine.v1 import engine_pb2 as pb


def _create(**body: Any) -> str:
    return json.dumps({"type": "response.create", "model": "default", **body})


def _texts(request: pb.GenerateRequest) -> list[tuple[int, str]]:
    return [(m.role, p.text.text) for m in request.messages for p in m.parts if p.HasField("text")]


async def test_a_store_false_response_is_continued_on_its_connection(
    server_url: str, engine: FakeEngine
) -> None:
    url = server_url.replace("http", "ws") + "/v1/responses"
    async with websockets.asyncio.client.connect(url) as connection:
        await connection.send(_create(input="first question", store=False, instructions="Be brief."))
        first = await until_done(connection)
        first_id = first[-1]["response"]["id"]
        assert first[-1]["type"] == "response.completed"
        await connection.send(_create(input="second question", store=False, previous_response_id=first_id))
        second = await until_done(connection)
        assert second[-1]["type"] == "response.completed", second[-1]
        assert second[-1]["response"]["previous_response_id"] == first_id
        await connection.send(
            _create(input="third question", store=False, previous_response_id=second[-1]["response"]["id"])
        )
        third = await until_done(connection)
        assert third[-1]["type"] == "response.completed", third[-1]
    # What the model saw: every earlier turn, the assistant's answers included, in order
    # (instructions are the request's own, as with a stored chain).
    assert _texts(engine.requests[2]) == [
        (pb.ROLE_USER, "first question"),
        (pb.ROLE_ASSISTANT, "Hello, world."),
        (pb.ROLE_USER, "second question"),
        (pb.ROLE_ASSISTANT, "Hello, world."),
        (pb.ROLE_USER, "third question"),
    ]
    # Nothing was stored.
    async with httpx.AsyncClient(base_url=server_url) as http:
        assert (await http.get(f"/v1/responses/{first_id}")).status_code == 404


async def test_an_unknown_previous_response_is_previous_response_not_found(
    server_url: str, engine: FakeEngine
) -> None:
    url = server_url.replace("http", "ws") + "/v1/responses"
    async with websockets.asyncio.client.connect(url) as connection:
        await connection.send(_create(input="hi", store=False))
        first_id = (await until_done(connection))[-1]["response"]["id"]
    # Another connection does not have it (and it was never stored).
    async with websockets.asyncio.client.connect(url) as connection:
        await connection.send(_create(input="again", previous_response_id=first_id))
        (error,) = await until_done(connection)
        assert error == {
            "type": "error",
            "status": 400,
            "error": {
                "message": f'Previous response with id "{first_id}" not found.',
                "type": "invalid_request_error",
                "param": "previous_response_id",
                "code": "previous_response_not_found",
            },
        }
        # The connection stays open and answers the next create.
        await connection.send(_create(input="fresh start", store=False))
        assert (await until_done(connection))[-1]["type"] == "response.completed"
    assert len(engine.requests) == 2


async def test_over_http_an_unknown_previous_response_is_previous_response_not_found(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    reply = await http.post(
        "/v1/responses", json={"model": "default", "input": "hi", "previous_response_id": "resp_unknown"}
    )
    assert reply.status_code == 400
    assert reply.json() == {
        "error": {
            "message": 'Previous response with id "resp_unknown" not found.',
            "type": "invalid_request_error",
            "param": "previous_response_id",
            "code": "previous_response_not_found",
        }
    }
    assert engine.requests == []


async def test_a_failed_response_is_not_continued(server_url: str, engine: FakeEngine) -> None:
    url = server_url.replace("http", "ws") + "/v1/responses"
    engine.script.finish_reason = pb.FINISH_REASON_CANCELLED
    async with websockets.asyncio.client.connect(url) as connection:
        await connection.send(_create(input="hi", store=False))
        ended = (await until_done(connection))[-1]
        assert ended["response"]["status"] not in ("completed", "incomplete")
        await connection.send(_create(input="more", previous_response_id=ended["response"]["id"]))
        (error,) = await until_done(connection)
        assert error["error"]["code"] == "previous_response_not_found"


async def test_a_compaction_turn_over_websocket(server_url: str, engine: FakeEngine) -> None:
    """compaction_trigger in WebSocket mode: the compaction's events; a `store: false` turn is not
    remembered (its item is what a later turn sends; a stored one is continued by its id:
    test_compaction_turn_store.py)."""
    url = server_url.replace("http", "ws") + "/v1/responses"
    async with websockets.asyncio.client.connect(url) as connection:
        trigger = [{"role": "user", "content": "long task"}, {"type": "compaction_trigger"}]
        await connection.send(_create(input=trigger, store=False))
        events = await until_done(connection)
        kinds = [event["type"] for event in events]
        assert "response.compaction.compacting" in kinds and kinds[-1] == "response.completed"
        (item,) = events[-1]["response"]["output"]
        assert item["type"] == "compaction"
        await connection.send(_create(input="next", previous_response_id=events[-1]["response"]["id"]))
        (error,) = await until_done(connection)
        assert error["error"]["code"] == "previous_response_not_found"
        await connection.send(_create(input=[item, {"role": "user", "content": "next"}], store=False))
        assert (await until_done(connection))[-1]["type"] == "response.completed"

"""WebSocket mode's bounds (issue 39, finding 3): while a response ran, further `response.create`
messages were read into an unbounded queue outside the body budget (one socket, 150 x 15 MiB:
facade 94 -> 2,030 MiB). A socket now reads a message only when it has room for it (the
response running and the next one), each held in the body budget from its receipt; the sockets
of one key are bounded; the parts bound of every API applies to a message too."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import websockets.asyncio.client
import websockets.exceptions
from fastapi import FastAPI
from starlette.websockets import WebSocket

from tests.facade.fake_engine import FakeEngine, Script
from tests.hardening.test_slow_clients import wait_for
from vlmserve.facade import FacadeSettings, Limits
from vlmserve.facade.cli import server_config
from vlmserve.facade.settings.api_keys import ApiKeys

KEY = "sk-websocket-limits-0000"
HEADERS = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def settings(settings: FacadeSettings) -> FacadeSettings:
    """The shared settings (tests/facade/fixtures.py) with API keys on."""
    return settings.replace(
        api_keys=ApiKeys.from_keys([KEY]), limits=Limits(max_websockets_per_key=2, max_request_parts=20)
    )


def _create(text: str) -> str:
    return json.dumps({"type": "response.create", "model": "default", "input": text, "store": False})


async def _until_done(connection: websockets.asyncio.client.ClientConnection) -> list[dict[str, Any]]:
    events = []
    while True:
        event = json.loads(await connection.recv())
        events.append(event)
        if event["type"] in ("response.completed", "response.failed", "error"):
            return events


async def test_a_socket_reads_one_create_ahead_and_holds_it_in_the_budget(
    server_url: str, app: FastAPI, engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = 0
    receive_text = WebSocket.receive_text

    async def counted(self: WebSocket) -> str:
        nonlocal reads
        reads += 1
        return await receive_text(self)

    monkeypatch.setattr(WebSocket, "receive_text", counted)
    engine.script = Script(text_chunks=["x"] * 12, delay_s=0.05)
    budget = app.state.facade.body_budget
    sent = [_create(f"{index}" + "y" * 100_000) for index in range(5)]
    url = server_url.replace("http", "ws") + "/v1/responses"
    async with websockets.asyncio.client.connect(
        url, additional_headers=HEADERS, max_size=None
    ) as connection:
        for message in sent:
            await connection.send(message)
        await wait_for(lambda: len(engine.requests) == 1)
        await asyncio.sleep(0.3)
        # The running response's message and the next one were read, both held; the other three
        # wait with the client (before: all five read, one of them held).
        assert reads == 2
        assert budget.in_flight == len(sent[0]) + len(sent[1])
        # Each is answered in turn.
        for index in range(5):
            events = await _until_done(connection)
            assert events[-1]["type"] == "response.completed"
            assert engine.requests[index].messages[-1].parts[0].text.text.startswith(f"{index}y")
        await wait_for(lambda: budget.in_flight == 0)
    assert reads <= 6


async def test_each_key_has_a_bounded_number_of_sockets(server_url: str, app: FastAPI) -> None:
    url = server_url.replace("http", "ws") + "/v1/responses"
    first = await websockets.asyncio.client.connect(url, additional_headers=HEADERS)
    second = await websockets.asyncio.client.connect(url, additional_headers=HEADERS)
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        await websockets.asyncio.client.connect(url, additional_headers=HEADERS)
    assert refused.value.response.status_code == 429
    assert refused.value.response.headers["retry-after"]
    assert json.loads(refused.value.response.body)["error"]["code"] == "rate_limit_exceeded"
    await first.close()
    await wait_for(lambda: app.state.facade.websockets[next(iter(app.state.facade.websockets))] == 1)
    third = await websockets.asyncio.client.connect(url, additional_headers=HEADERS)
    await third.close()
    await second.close()
    await wait_for(lambda: not app.state.facade.websockets)
    # The server reads no more than one message ahead of the app per socket either.
    assert server_config(app, app.state.facade.settings).ws_max_queue == 1


async def test_a_message_with_too_many_parts_is_an_error_naming_the_array(server_url: str) -> None:
    url = server_url.replace("http", "ws") + "/v1/responses"
    parts = [{"type": "input_text", "text": "a"}] * 20
    message = {"type": "response.create", "model": "default", "input": [{"role": "user", "content": parts}]}
    async with websockets.asyncio.client.connect(url, additional_headers=HEADERS) as connection:
        await connection.send(json.dumps(message))
        error = json.loads(await connection.recv())
        assert (error["type"], error["status"]) == ("error", 400)
        assert (error["error"]["param"], error["error"]["code"]) == ("input[0].content", "too_many_parts")
        # The connection stays open.
        await connection.send(_create("hi"))
        assert (await _until_done(connection))[-1]["type"] == "response.completed"

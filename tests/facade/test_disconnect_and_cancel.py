"""A client that leaves cancels the engine call; POST /cancel stops a running background
generation (real HTTP)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from fastapi import FastAPI

from tests._sse import aiter_lines
from tests.facade.fake_engine import FakeEngine, Script
from tests.facade.helpers import stream_events

WAIT_S = 5.0


async def wait_for(event: asyncio.Event) -> None:
    await asyncio.wait_for(event.wait(), WAIT_S)


async def stored_status(server_url: str, response_id: str) -> str:
    async with httpx.AsyncClient(base_url=server_url) as client:
        status: str = (await client.get(f"/v1/responses/{response_id}")).json()["status"]
        return status


async def test_stream_disconnect_cancels_the_engine_call(
    server_url: str, engine: FakeEngine, app: FastAPI
) -> None:
    engine.script = Script(text_chunks=["partial"], hang=True)
    async with (
        httpx.AsyncClient(base_url=server_url, timeout=WAIT_S) as client,
        client.stream(
            "POST", "/v1/responses", json={"model": "default", "input": "hi", "stream": True}
        ) as stream,
    ):
        async for line in aiter_lines(stream):
            if "response.output_text.delta" in line:
                break
    await wait_for(engine.cancelled)
    response_id = engine.requests[0].request_id
    for _ in range(50):
        if not app.state.facade.responses.running:
            break
        await asyncio.sleep(0.02)
    assert app.state.facade.responses.running == {}
    assert await stored_status(server_url, response_id) == "cancelled"


async def test_non_stream_disconnect_cancels_the_engine_call(server_url: str, engine: FakeEngine) -> None:
    engine.script = Script(text_chunks=["partial"], hang=True)
    client = httpx.AsyncClient(base_url=server_url, timeout=WAIT_S)
    request = asyncio.create_task(client.post("/v1/responses", json={"model": "default", "input": "hi"}))
    await wait_for(engine.started)
    response_id = engine.requests[0].request_id
    # The engine has sent its first message: the response has started and is stored.
    async with httpx.AsyncClient(base_url=server_url) as check:
        for _ in range(250):
            if (await check.get(f"/v1/responses/{response_id}")).status_code == 200:
                break
            await asyncio.sleep(0.02)
    request.cancel()
    await client.aclose()
    await wait_for(engine.cancelled)
    for _ in range(50):
        if await stored_status(server_url, response_id) != "in_progress":
            break
        await asyncio.sleep(0.02)
    assert await stored_status(server_url, response_id) == "cancelled"


async def test_non_stream_disconnect_before_the_engine_started_stores_nothing(
    server_url: str, engine: FakeEngine, app: FastAPI
) -> None:
    # No first message (a long prefill): the client leaves before the response has started.
    engine.script = Script(text_chunks=[], hang=True)
    client = httpx.AsyncClient(base_url=server_url, timeout=WAIT_S)
    request = asyncio.create_task(client.post("/v1/responses", json={"model": "default", "input": "hi"}))
    await wait_for(engine.started)
    request.cancel()
    await client.aclose()
    await wait_for(engine.cancelled)
    for _ in range(50):
        if not app.state.facade.responses.running:
            break
        await asyncio.sleep(0.02)
    assert app.state.facade.responses.running == {}
    async with httpx.AsyncClient(base_url=server_url) as check:
        assert (await check.get(f"/v1/responses/{engine.requests[0].request_id}")).status_code == 404


async def test_cancel_endpoint_stops_a_streaming_background_generation(
    server_url: str, engine: FakeEngine
) -> None:
    engine.script = Script(text_chunks=["partial"], hang=True)
    async with httpx.AsyncClient(base_url=server_url, timeout=WAIT_S) as client:
        body = {"model": "default", "input": "hi", "stream": True, "background": True}
        streaming = asyncio.create_task(client.post("/v1/responses", json=body))
        await wait_for(engine.started)
        response_id = engine.requests[0].request_id
        cancelled = await client.post(f"/v1/responses/{response_id}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["status"] == "cancelled"
        assert engine.aborts == [response_id]
        events = stream_events((await asyncio.wait_for(streaming, WAIT_S)).text)
        final = events[-1]
        assert final["type"] == "response.incomplete"
        assert final["response"]["status"] == "cancelled"
        assert final["response"]["output"][0]["content"][0]["text"] == "partial"
        # Cancelling again is idempotent; a foreground response cannot be cancelled.
        assert (await client.post(f"/v1/responses/{response_id}/cancel")).json()["status"] == "cancelled"
        engine.script = Script()
        done: dict[str, Any] = (
            await client.post("/v1/responses", json={"model": "default", "input": "x"})
        ).json()
        refused = await client.post(f"/v1/responses/{done['id']}/cancel")
        assert refused.status_code == 400
        assert (await client.post("/v1/responses/resp_unknown/cancel")).status_code == 404

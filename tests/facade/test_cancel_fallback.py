"""The cancel endpoint (a background response) against an engine that ignores Abort: the facade
closes the engine call itself, and the response still ends the normal way
(`response.incomplete`, status `cancelled`, then `[DONE]` for a stream), as when the engine
stops it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from tests.facade.fake_engine import FakeEngine, Script
from tests.facade.helpers import EVENT_SCHEMAS, assert_valid, stream_events
from vlmserve.facade import FacadeSettings, Timeouts

# The facade waits this long for the engine to end an aborted generation before closing the call.
CONTROL_S = 0.3
WAIT_S = 5.0


@pytest.fixture
def settings(tmp_path: Path) -> FacadeSettings:
    return FacadeSettings(
        store_path=tmp_path / "facade.sqlite3",
        timeouts=Timeouts(generate=30.0, control=CONTROL_S, stream_first_message=1.0),
    )


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
async def test_cancel_ends_the_response_when_the_engine_ignores_abort(
    server_url: str, engine: FakeEngine, app: FastAPI, stream: bool
) -> None:
    engine.script = Script(text_chunks=["partial"], hang=True, ignore_abort=True)
    async with httpx.AsyncClient(base_url=server_url, timeout=WAIT_S) as client:
        body = {"model": "default", "input": "hi", "stream": stream, "background": True}
        creating = asyncio.create_task(client.post("/v1/responses", json=body))
        await asyncio.wait_for(engine.started.wait(), WAIT_S)
        response_id = engine.requests[0].request_id
        started = time.monotonic()
        cancelled = await client.post(f"/v1/responses/{response_id}/cancel")
        cancel_s = time.monotonic() - started
        created = await asyncio.wait_for(creating, WAIT_S)
        stored = (await client.get(f"/v1/responses/{response_id}")).json()

    assert engine.aborts == [response_id]
    # The facade closed the engine call itself.
    await asyncio.wait_for(engine.cancelled.wait(), WAIT_S)
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    assert cancel_s < CONTROL_S + 2.0
    resource = stored
    if stream:
        events = stream_events(created.text)  # ends with `data: [DONE]`
        for event in events:
            assert_valid(event, EVENT_SCHEMAS[event["type"]])
        final = events[-1]
        assert final["type"] == "response.incomplete"
        resource = final["response"]
    else:
        assert created.status_code == 200, created.text
        assert created.json()["status"] == "queued"
    assert resource["status"] == "cancelled"
    assert resource["incomplete_details"] == {"reason": "cancelled"}
    assert resource["output"][0]["content"][0]["text"] == "partial"
    assert stored == cancelled.json() == resource
    assert app.state.facade.responses.running == {}

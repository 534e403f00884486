"""Background responses (`background: true`) against the scripted engine: answered `queued` at
once, run detached from the request, polled, cancelled, streamed and resumed from the stored
events, stopped when their events pass the bound, failed by a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from fastapi import FastAPI

from tests._sse import aiter_lines
from tests.facade.fake_engine import FakeEngine, Script
from tests.facade.helpers import EVENT_SCHEMAS, assert_valid, in_process, stream_events
from vlmserve.client import AsyncEngineClient
from vlmserve.engine.request_errors import RequestError
from vlmserve.facade import FacadeSettings, Store, create_app
from vlmserve.facade.app import INTERRUPTED_ERROR
from vlmserve.facade.http.api_keys import ANONYMOUS_OWNER
from vlmserve.facade.settings import Storage
from vlmserve.facade.store.records import ResponseRecord, StoredEvent

WAIT_S = 5.0
TERMINAL = ("completed", "failed", "cancelled", "incomplete")
BACKGROUND = {"model": "default", "input": "hi", "background": True}


async def poll(
    http: httpx.AsyncClient, response_id: str, until: tuple[str, ...] = TERMINAL
) -> dict[str, Any]:
    for _ in range(int(WAIT_S / 0.02)):
        resource: dict[str, Any] = (await http.get(f"/v1/responses/{response_id}")).json()
        if resource["status"] in until:
            return resource
        await asyncio.sleep(0.02)
    raise AssertionError(f"{response_id} still {resource['status']}")


def check_events(events: list[dict[str, Any]]) -> None:
    for event in events:
        assert_valid(event, EVENT_SCHEMAS[event["type"]])


async def resumed(
    http: httpx.AsyncClient, response_id: str, after: int | None = None
) -> list[dict[str, Any]]:
    query = "" if after is None else f"&starting_after={after}"
    answer = await http.get(f"/v1/responses/{response_id}?stream=true{query}")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/event-stream")
    events = stream_events(answer.text)
    check_events(events)
    return events


async def test_answered_queued_then_polled_to_completion(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.script = Script(text_chunks=["Hello", " there"], delay_s=0.05)
    created = await http.post("/v1/responses", json=BACKGROUND)
    assert created.status_code == 200, created.text
    queued = created.json()
    assert (queued["status"], queued["background"], queued["output"]) == ("queued", True, [])
    assert_valid(queued, "ResponseResource")
    running = await poll(http, queued["id"], until=("in_progress", *TERMINAL))
    assert running["status"] in ("in_progress", "completed")
    done = await poll(http, queued["id"])
    assert done["status"] == "completed"
    assert done["output"][0]["content"][0]["text"] == "Hello there"
    assert_valid(done, "ResponseResource")
    # Every event was stored: the whole stream replays, in order, ending with the final resource.
    events = await resumed(http, queued["id"])
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert [event["type"] for event in events[:3]] == [
        "response.created",
        "response.queued",
        "response.in_progress",
    ]
    assert [event["response"]["status"] for event in events[:3]] == ["queued", "queued", "in_progress"]
    assert events[-1]["type"] == "response.completed" and events[-1]["response"] == done
    deltas = [event["delta"] for event in events if event["type"] == "response.output_text.delta"]
    assert "".join(deltas) == "Hello there"


async def test_streamed_creation_starts_queued_and_resumes_after_n(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    answer = await http.post("/v1/responses", json={**BACKGROUND, "stream": True})
    assert answer.status_code == 200, answer.text
    events = stream_events(answer.text)
    check_events(events)
    assert events[0]["type"] == "response.created" and events[0]["response"]["status"] == "queued"
    assert events[-1]["type"] == "response.completed"
    response_id = events[0]["response"]["id"]
    for after in (0, 3, len(events) - 2, len(events) - 1, len(events) + 5):
        assert await resumed(http, response_id, after) == events[after + 1 :]


async def test_a_resumed_stream_follows_the_run_live(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.script = Script(text_chunks=["a", "b", "c", "d"], delay_s=0.2)
    queued = (await http.post("/v1/responses", json=BACKGROUND)).json()
    await asyncio.wait_for(engine.started.wait(), WAIT_S)
    events = await resumed(http, queued["id"], 0)
    # Began while the run was early, ended with its terminal event: nothing missing, in order.
    assert [event["sequence_number"] for event in events] == list(range(1, len(events) + 1))
    assert events[-1]["type"] == "response.completed"
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "abcd"


async def test_cancel_stops_the_run_and_ends_its_events(
    http: httpx.AsyncClient, engine: FakeEngine, app: FastAPI
) -> None:
    engine.script = Script(text_chunks=["partial"], hang=True)
    queued = (await http.post("/v1/responses", json=BACKGROUND)).json()
    await asyncio.wait_for(engine.started.wait(), WAIT_S)
    await poll(http, queued["id"], until=("in_progress",))
    cancelled = await http.post(f"/v1/responses/{queued['id']}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    assert engine.aborts == [queued["id"]]
    assert (await http.get(f"/v1/responses/{queued['id']}")).json() == cancelled.json()
    events = await resumed(http, queued["id"])
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "cancelled"}
    # Cancelling again returns it as it is.
    assert (await http.post(f"/v1/responses/{queued['id']}/cancel")).json() == cancelled.json()
    for _ in range(50):
        if not app.state.facade.responses.running:
            break
        await asyncio.sleep(0.02)
    assert app.state.facade.responses.running == {}


async def test_foreground_responses_cannot_be_cancelled_or_streamed_again(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    done = (await http.post("/v1/responses", json={"model": "default", "input": "hi"})).json()
    refused = await http.post(f"/v1/responses/{done['id']}/cancel")
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == "Cannot cancel a synchronous response."
    not_streamed = await http.get(f"/v1/responses/{done['id']}?stream=true")
    assert (not_streamed.status_code, not_streamed.json()["error"]["param"]) == (400, "stream")
    # Plain retrieval ignores `starting_after`.
    assert (await http.get(f"/v1/responses/{done['id']}?starting_after=3")).json() == done


async def test_running_foreground_response_cannot_be_cancelled(server_url: str, engine: FakeEngine) -> None:
    engine.script = Script(text_chunks=["partial"], hang=True)
    async with httpx.AsyncClient(base_url=server_url, timeout=WAIT_S) as client:
        creating = asyncio.create_task(client.post("/v1/responses", json={"model": "default", "input": "hi"}))
        await asyncio.wait_for(engine.started.wait(), WAIT_S)
        refused = await client.post(f"/v1/responses/{engine.requests[0].request_id}/cancel")
        assert (refused.status_code, refused.json()["error"]["param"]) == (400, "response_id")
        assert engine.aborts == []
        creating.cancel()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**BACKGROUND, "store": False}, "background"),
        ({**BACKGROUND, "background": "yes"}, "background"),
    ],
)
async def test_bad_background_requests_name_the_field(
    http: httpx.AsyncClient, body: dict[str, Any], param: str
) -> None:
    refused = await http.post("/v1/responses", json=body)
    assert (refused.status_code, refused.json()["error"]["param"]) == (400, param)


async def test_a_bad_cursor_names_it(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    queued = (await http.post("/v1/responses", json=BACKGROUND)).json()
    refused = await http.get(f"/v1/responses/{queued['id']}?stream=true&starting_after=-1")
    assert (refused.status_code, refused.json()["error"]["param"]) == (400, "starting_after")
    assert (await http.get("/v1/responses/resp_unknown?stream=true")).status_code == 404


async def test_a_client_that_leaves_does_not_stop_the_run(server_url: str, engine: FakeEngine) -> None:
    engine.script = Script(text_chunks=["one", " two", " three"], delay_s=0.1)
    async with httpx.AsyncClient(base_url=server_url, timeout=WAIT_S) as client:
        async with client.stream("POST", "/v1/responses", json={**BACKGROUND, "stream": True}) as stream:
            async for line in aiter_lines(stream):
                if line.startswith("data:"):
                    response_id = httpx.Response(200, content=line[5:]).json()["response"]["id"]
                    break
        done = await poll(client, response_id)
    assert done["status"] == "completed"
    assert done["output"][0]["content"][0]["text"] == "one two three"
    assert not engine.cancelled.is_set() and engine.aborts == []


async def test_a_run_whose_events_pass_the_bound_is_stopped(
    tmp_path: Path, engine: FakeEngine, engine_client: AsyncEngineClient, store: Store
) -> None:
    settings = FacadeSettings(
        store_path=tmp_path / "s.sqlite3", storage=Storage(max_response_event_bytes=4000)
    )
    engine.script = Script(text_chunks=["x"] * 1000, delay_s=0.01)
    app = create_app(settings, engine=engine_client, store=store)
    async with in_process(app) as http:
        queued = (await http.post("/v1/responses", json=BACKGROUND)).json()
        failed = await poll(http, queued["id"])
        events = await resumed(http, queued["id"])
    assert failed["status"] == "failed"
    assert "passed this server's limit of 4000 bytes" in failed["error"]["message"]
    assert [event["type"] for event in events[-2:]] == ["error", "response.failed"]
    await asyncio.wait_for(engine.cancelled.wait(), WAIT_S)


async def test_shutdown_and_restart_fail_unfinished_runs(
    settings: FacadeSettings, engine: FakeEngine, engine_client: AsyncEngineClient, store: Store
) -> None:
    engine.script = Script(text_chunks=["x"], hang=True)
    first = create_app(settings, engine=engine_client, store=store)
    async with (
        first.router.lifespan_context(first),
        in_process(first) as http,
    ):
        running = (await http.post("/v1/responses", json=BACKGROUND)).json()
        await poll(http, running["id"], until=("in_progress",))
    # Shutdown stopped the run: failed, its events ended.
    stored = await store.responses.get(running["id"], owner=ANONYMOUS_OWNER)
    assert stored is not None and stored.status == "failed"
    stopped = stored.resource
    assert stopped["error"]["message"] == "The server shut down before this response finished."
    # What a facade killed mid-run leaves behind: stored queued, never finished.
    left = {**stopped, "id": "resp_left", "status": "queued", "error": None}
    await store.responses.put(ResponseRecord.of(left), [], owner=ANONYMOUS_OWNER)
    created = {"type": "response.created", "sequence_number": 0, "response": left}
    await store.events.append("resp_left", [StoredEvent.of(created)], owner=ANONYMOUS_OWNER)

    restarted = create_app(settings, engine=engine_client, store=store)
    async with (
        restarted.router.lifespan_context(restarted),
        in_process(restarted) as http,
    ):
        failed = (await http.get("/v1/responses/resp_left")).json()
        assert (failed["status"], failed["error"]) == ("failed", INTERRUPTED_ERROR)
        for response_id in (running["id"], "resp_left"):
            events = await resumed(http, response_id)
            assert events[-1]["type"] == "response.failed"
        assert [event["type"] for event in await resumed(http, "resp_left")] == [
            "response.created",
            "response.failed",
        ]


async def test_a_cancel_that_reaches_another_facade_stops_the_run(
    settings: FacadeSettings, engine: FakeEngine, engine_client: AsyncEngineClient, store: Store
) -> None:
    engine.script = Script(text_chunks=["x"] * 400, delay_s=0.05)
    running_here = create_app(settings, engine=engine_client, store=store)
    other_store = Store.sqlite(settings.store_path)  # a second facade on the same store
    elsewhere = create_app(settings, engine=engine_client, store=other_store)
    try:
        async with (
            in_process(running_here) as here,
            in_process(elsewhere) as there,
        ):
            queued = (await here.post("/v1/responses", json=BACKGROUND)).json()
            await poll(there, queued["id"], until=("in_progress",))
            cancelled = await there.post(f"/v1/responses/{queued['id']}/cancel")
            assert (cancelled.status_code, cancelled.json()["status"]) == (200, "cancelled")
            await asyncio.wait_for(engine.cancelled.wait(), WAIT_S)
            for _ in range(int(WAIT_S / 0.02)):
                if not running_here.state.facade.responses.running:
                    break
                await asyncio.sleep(0.02)
            assert running_here.state.facade.responses.running == {}
            assert engine.chunks_sent < 400
            final = (await there.get(f"/v1/responses/{queued['id']}")).json()
            assert final["status"] == "cancelled"
            events = await resumed(there, queued["id"])
            assert events[-1]["type"] == "response.incomplete"
            assert events[-1]["response"] == final
    finally:
        other_store.close()


async def test_an_engine_refusal_ends_the_response_failed(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.script = Script(
        error=RequestError(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full", retry_after_s=1.0)
    )
    created = await http.post("/v1/responses", json=BACKGROUND)
    assert created.status_code == 200 and created.json()["status"] == "queued"
    failed = await poll(http, created.json()["id"])
    assert failed["status"] == "failed" and failed["error"]["code"] == "engine_overloaded"
    events = await resumed(http, failed["id"])
    assert [event["type"] for event in events[-2:]] == ["error", "response.failed"]
    assert events[-1]["response"] == failed


async def test_a_long_run_streams_whole_through_memory_and_store(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    # More events than a run keeps in memory for its followers: the rest come from the store.
    engine.script = Script(text_chunks=[f"{n} " for n in range(600)])
    answer = await http.post("/v1/responses", json={**BACKGROUND, "stream": True})
    events = stream_events(answer.text)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    text = "".join(event["delta"] for event in events if event["type"] == "response.output_text.delta")
    assert text == "".join(f"{n} " for n in range(600))
    assert await resumed(http, events[0]["response"]["id"], 100) == events[101:]


async def test_a_run_cancelled_at_once_is_answered_cancelled(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.script = Script(text_chunks=["partial"], hang=True)
    queued = (await http.post("/v1/responses", json=BACKGROUND)).json()
    cancelled = await http.post(f"/v1/responses/{queued['id']}/cancel")
    assert (cancelled.status_code, cancelled.json()["status"]) == (200, "cancelled")
    assert (await http.get(f"/v1/responses/{queued['id']}")).json() == cancelled.json()
    events = await resumed(http, queued["id"])
    assert events[-1]["type"] == "response.incomplete"

"""A request the engine refuses before it starts leaves no stored response (its id was never
shown); one that fails after the client saw its id (a stream's `response.created`) or after the
engine started it is kept as `failed`."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import grpc
import httpx
import pytest

from tests.facade.fake_engine import FakeEngine, RunningFakeEngine, Script
from tests.facade.helpers import assert_valid, stream_events
from vlmserve.engine.request_errors import RequestError
from vlmserve.facade import FacadeSettings, Timeouts

FIRST_MESSAGE_S = 0.2

REFUSALS = [
    (
        RequestError(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full", retry_after_s=1.0),
        503,
        "engine_overloaded",
    ),
    (RequestError(grpc.StatusCode.UNAVAILABLE, "engine says no"), 503, "engine_unavailable"),
    (
        RequestError(grpc.StatusCode.INVALID_ARGUMENT, "engine says no", field="messages"),
        400,
        "invalid_value",
    ),
]


@pytest.fixture
def settings(tmp_path: Path) -> FacadeSettings:
    return FacadeSettings(
        store_path=tmp_path / "facade.sqlite3",
        timeouts=Timeouts(generate=30.0, control=5.0, stream_first_message=FIRST_MESSAGE_S),
    )


def stored_ids(settings: FacadeSettings) -> list[str]:
    """Every stored response id, whoever owns it (read straight from the database)."""
    with sqlite3.connect(settings.store_path) as db:
        return [response_id for (response_id,) in db.execute("SELECT id FROM responses ORDER BY id")]


@pytest.mark.parametrize(
    ("refusal", "status", "error_code"), REFUSALS, ids=[e.code.name for e, _, _ in REFUSALS]
)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_refused_request_stores_nothing(
    http: httpx.AsyncClient,
    engine: FakeEngine,
    settings: FacadeSettings,
    refusal: RequestError,
    status: int,
    error_code: str,
    stream: bool,
) -> None:
    engine.script = Script(error=refusal)
    reply = await http.post("/v1/responses", json={"model": "default", "input": "hi", "stream": stream})
    assert (reply.status_code, reply.json()["error"]["code"]) == (status, error_code)
    (request,) = engine.requests
    assert (await http.get(f"/v1/responses/{request.request_id}")).status_code == 404
    assert stored_ids(settings) == []


async def test_an_engine_down_at_generate_stores_nothing(
    http: httpx.AsyncClient, fake_engine: RunningFakeEngine, settings: FacadeSettings
) -> None:
    # One answered request first: the model info is cached, so the refusal comes from Generate.
    kept = await http.post("/v1/responses", json={"model": "default", "input": "hi"})
    assert kept.status_code == 200
    await fake_engine.stop()
    for stream in (False, True):
        reply = await http.post("/v1/responses", json={"model": "default", "input": "hi", "stream": stream})
        assert (reply.status_code, reply.json()["error"]["code"]) == (503, "engine_unavailable")
    assert stored_ids(settings) == [kept.json()["id"]]


async def test_a_stream_refused_after_its_id_was_sent_is_stored_failed(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    # The refusal comes after the first-message window: the stream has begun.
    engine.script = Script(
        first_delay_s=FIRST_MESSAGE_S * 2,
        error=RequestError(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full", retry_after_s=1.0),
    )
    reply = await http.post("/v1/responses", json={"model": "default", "input": "hi", "stream": True})
    events = stream_events(reply.text)
    assert events[0]["type"] == "response.created"
    response_id = events[0]["response"]["id"]
    assert [event["type"] for event in events[-2:]] == ["error", "response.failed"]
    stored = (await http.get(f"/v1/responses/{response_id}")).json()
    assert stored["status"] == "failed" and stored["error"]["code"] == "engine_overloaded"
    assert stored == events[-1]["response"]
    assert_valid(stored, "ResponseResource")


async def test_a_plain_request_that_fails_after_the_engine_started_it_is_stored_failed(
    http: httpx.AsyncClient, engine: FakeEngine, settings: FacadeSettings
) -> None:
    engine.script = Script(
        text_chunks=["one", "two"], error=(grpc.StatusCode.UNAVAILABLE, "gone"), error_after=1
    )
    reply = await http.post("/v1/responses", json={"model": "default", "input": "hi"})
    assert (reply.status_code, reply.json()["error"]["code"]) == (503, "engine_unavailable")
    (request,) = engine.requests
    stored = (await http.get(f"/v1/responses/{request.request_id}")).json()
    assert stored["status"] == "failed" and stored["error"]["code"] == "engine_unavailable"
    assert stored_ids(settings) == [request.request_id]

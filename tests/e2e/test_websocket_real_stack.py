"""WebSocket mode of `/v1/responses` with the openai SDK (`client.responses.connect()`) on the
real stack: several responses on one connection, the same events as the HTTP stream, stored as
over HTTP; errors as `error` messages; API keys checked at the handshake; closing cancels."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import websockets.sync.client

from tests._openresponses import EVENT_SCHEMAS, assert_valid


@pytest.fixture(scope="module")
def sdk(facade_url: str) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{facade_url}/v1", api_key="x", max_retries=0, timeout=120)
    yield client
    client.close()


def until_done(connection: Any) -> list[Any]:
    events = []
    for event in connection:
        events.append(event)
        if event.type in ("response.completed", "response.incomplete", "response.failed", "error"):
            return events
    raise AssertionError("the connection closed first")


def test_several_responses_on_one_connection(sdk: openai.OpenAI, facade_url: str) -> None:
    with sdk.responses.connect() as connection:
        connection.response.create(model="default", input="Say hi.", max_output_tokens=8)
        first = until_done(connection)
        connection.response.create(
            model="default",
            input="And again.",
            max_output_tokens=8,
            previous_response_id=first[-1].response.id,
        )
        second = until_done(connection)
    for events in (first, second):
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert events[0].type == "response.created"
        for event in events:
            sent = event.model_dump(mode="json", exclude_none=True)
            if sent["type"] in EVENT_SCHEMAS and "response" not in sent:
                assert_valid(sent, EVENT_SCHEMAS[sent["type"]])
    final = second[-1].response
    assert final.previous_response_id == first[-1].response.id
    # Stored as over HTTP.
    stored = httpx.get(f"{facade_url}/v1/responses/{final.id}", timeout=30).json()
    assert stored["status"] == final.status and stored["output"][0]["id"] == final.output[0].id


def test_a_bad_create_is_an_error_message_and_the_connection_stays(sdk: openai.OpenAI) -> None:
    with sdk.responses.connect() as connection:
        connection.send({"type": "response.create", "model": "default", "input": "x", "background": True})  # type: ignore[typeddict-unknown-key]
        [error] = until_done(connection)
        assert error.type == "error"
        connection.response.create(model="default", input=[{"type": "nope"}])  # type: ignore[list-item]
        [error] = until_done(connection)
        assert error.type == "error"
        connection.response.create(model="default", input="Hi", max_output_tokens=4)
        assert until_done(connection)[-1].type in ("response.completed", "response.incomplete")


def test_raw_error_messages_follow_the_spec(facade_url: str) -> None:
    with websockets.sync.client.connect(facade_url.replace("http", "ws") + "/v1/responses") as ws:
        ws.send(json.dumps({"type": "response.create", "model": "default", "input": "x", "stream": True}))
        error = json.loads(ws.recv(timeout=30))
    assert_valid(error, "WebSocketErrorEvent")
    assert error["status"] == 400 and error["error"]["param"] == "stream"


def test_closing_cancels_the_response(random_facade_url: str) -> None:
    url = random_facade_url.replace("http", "ws") + "/v1/responses"
    with websockets.sync.client.connect(url) as ws:
        ws.send(
            json.dumps(
                {"type": "response.create", "model": "default", "input": "Write.", "max_output_tokens": 4000}
            )
        )
        created = json.loads(ws.recv(timeout=60))
        while json.loads(ws.recv(timeout=60))["type"] != "response.output_text.delta":
            pass
    response_id = created["response"]["id"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stored = httpx.get(f"{random_facade_url}/v1/responses/{response_id}", timeout=30).json()
        if stored["status"] != "in_progress":
            break
        time.sleep(0.2)
    assert stored["status"] == "cancelled"

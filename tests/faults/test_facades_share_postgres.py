"""Facade processes sharing one PostgreSQL (issue 15.2): `vlmserve-facade --store postgresql://…`.

Two facades in front of one (scripted) engine: a response made on one is retrieved and continued
on the other, and a conversation is shared. One is SIGKILLed mid-stream: the live one marks that
response failed once the dead one's lease runs out, while a facade starting meanwhile leaves the
live one's running stream alone (it completes)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._postgres import PostgresServer
from tests._services import ServiceProcess, start_facade, start_fake_engine
from tests.faults.stack import WAIT_S, kill, read_until, sse_events

LEASE = ("--lease-ttl", "1")

pytestmark = [pytest.mark.needs_model, pytest.mark.slow]


@pytest.fixture
def facades(tmp_path: Path, postgres_server: PostgresServer) -> Iterator[Callable[..., ServiceProcess]]:
    """Starts an engine and facades on one new database; stops them all at the end."""
    url = postgres_server.new_database()
    started: list[ServiceProcess] = []
    engines: dict[tuple[int, float], ServiceProcess] = {}

    def start(*, chunks: int = 2, delay_s: float = 0.0) -> ServiceProcess:
        if (chunks, delay_s) not in engines:
            engines[(chunks, delay_s)] = start_fake_engine(tmp_path, chunks=chunks, delay_s=delay_s)
        folder = tmp_path / f"facade{len(started)}"
        folder.mkdir()
        service = start_facade(
            folder,
            engines[(chunks, delay_s)].address,
            store_path=folder / "unused.sqlite3",
            extra=("--store", url, *LEASE),
        )
        started.append(service)
        return service

    yield start
    for service in [*started, *engines.values()]:
        service.stop()


def create(http: httpx.Client, **body: Any) -> dict[str, Any]:
    response = http.post("/v1/responses", json={"model": "default", **body})
    assert response.status_code == 200, response.text
    resource: dict[str, Any] = response.json()
    return resource


def test_two_facade_processes_share_responses_and_conversations(
    facades: Callable[..., ServiceProcess],
) -> None:
    first, second = facades(), facades()
    with (
        httpx.Client(base_url=first.address, timeout=WAIT_S) as one,
        httpx.Client(base_url=second.address, timeout=WAIT_S) as other,
    ):
        made = create(one, input="remember 42")
        assert other.get(f"/v1/responses/{made['id']}").json() == made
        continued = create(other, input="and then?", previous_response_id=made["id"])
        assert continued["previous_response_id"] == made["id"]
        conversation = other.post("/v1/conversations", json={"items": []}).json()["id"]
        in_conversation = create(one, input="hello", conversation=conversation)
        items = other.get(f"/v1/conversations/{conversation}/items", params={"order": "asc"}).json()["data"]
        assert [item["id"] for item in items][1:] == [item["id"] for item in in_conversation["output"]]
        assert not (Path(first.log_path).parent / "unused.sqlite3").exists()


def test_a_killed_facades_stream_fails_and_a_live_ones_is_left_alone(
    facades: Callable[..., ServiceProcess],
) -> None:
    # Every answer streams for about 15 s: long enough for a facade to start meanwhile.
    doomed, live = facades(chunks=60, delay_s=0.25), facades(chunks=60, delay_s=0.25)
    live_events: list[dict[str, Any]] = []
    live_started = threading.Event()

    def stream_on_live() -> None:
        body = {"model": "default", "input": "x", "stream": True}
        with (
            httpx.Client(base_url=live.address, timeout=WAIT_S) as http,
            http.stream("POST", "/v1/responses", json=body) as reply,
        ):
            for event in sse_events(reply):
                live_events.append(event)
                if event["type"] == "response.output_text.delta":
                    live_started.set()

    with httpx.Client(base_url=doomed.address, timeout=WAIT_S) as http:
        body = {"model": "default", "input": "long", "stream": True}
        with http.stream("POST", "/v1/responses", json=body) as running:
            running_id = read_until(sse_events(running), "response.output_text.delta")[0]["response"]["id"]
            kill(doomed)
    reader = threading.Thread(target=stream_on_live)
    reader.start()
    assert live_started.wait(WAIT_S)
    live_id = live_events[0]["response"]["id"]
    # A facade starting while the live one streams: its start-up sweep leaves that stream alone.
    restarted = facades(chunks=60, delay_s=0.25)
    with httpx.Client(base_url=restarted.address, timeout=WAIT_S) as http:
        assert http.get(f"/v1/responses/{live_id}").json()["status"] in ("in_progress", "completed")
        # The dead facade's: failed once its lease (1 s) ran out, by whichever facade swept first.
        deadline = time.monotonic() + WAIT_S
        while http.get(f"/v1/responses/{running_id}").json()["status"] == "in_progress":
            assert time.monotonic() < deadline, "the dead facade's response stayed in progress"
            time.sleep(0.1)
        swept = http.get(f"/v1/responses/{running_id}").json()
    assert swept["status"] == "failed" and swept["error"]["code"] == "server_error"
    reader.join(WAIT_S)
    assert [event["type"] for event in live_events[-2:]] == ["response.completed", "[DONE]"]

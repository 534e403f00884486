"""The engine dies (SIGKILL) under a running facade, then comes back on the same address.

Issue 5, Faults: mid-stream the client gets an `error` event then `response.failed`, and the stored
response says failed; a plain request gets an OpenAI-shaped 502/503; nothing hangs; the facade
recovers by itself once the engine is back (its gRPC channel reconnects), and `/readyz` follows.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._services import ServiceProcess, start_facade
from tests.facade.helpers import EVENT_SCHEMAS, assert_valid
from tests.faults.stack import (
    WAIT_S,
    assert_openai_error,
    kill,
    long_body,
    loopback_address,
    read_until,
    readyz,
    sse_events,
    start_engine_at,
    wait_until,
)

pytestmark = pytest.mark.needs_model

SHORT = {"model": "default", "input": "hi", "max_output_tokens": 4}


@dataclass
class Stack:
    """A facade whose engine the test may kill and restart on the same address."""

    log_dir: Path
    address: str
    engine: ServiceProcess
    facade: ServiceProcess
    store_path: Path

    def restart_engine(self) -> float:
        """Start the engine again; seconds until the facade reports ready again."""
        started = time.monotonic()
        self.engine = start_engine_at(self.log_dir, self.address)
        wait_until(lambda: readyz(self.facade.address) == 200, what="/readyz 200 after the restart")
        return time.monotonic() - started

    def stored_resources(self) -> list[dict[str, Any]]:
        """Every response in the facade's store, read straight from its SQLite file (read-only)."""
        with sqlite3.connect(f"file:{self.store_path}?mode=ro", uri=True) as db:
            return [json.loads(row[0]) for row in db.execute("SELECT resource FROM responses")]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir = tmp_path_factory.mktemp("engine-killed")
    address = loopback_address()
    engine = start_engine_at(log_dir, address)
    store_path = log_dir / "responses.sqlite3"
    try:
        facade = start_facade(log_dir, address, store_path=store_path)
    except BaseException:
        engine.stop()
        raise
    the_stack = Stack(log_dir, address, engine, facade, store_path)
    yield the_stack
    the_stack.facade.stop()
    the_stack.engine.stop()


def test_engine_killed_mid_stream_then_restarted(stack: Stack) -> None:
    facade_pid = stack.facade.process.pid
    with (
        httpx.Client(base_url=stack.facade.address, timeout=WAIT_S) as http,
        http.stream("POST", "/v1/responses", json=long_body(stream=True)) as response,
    ):
        assert response.status_code == 200
        events = sse_events(response)
        before = read_until(events, "response.output_text.delta", count=3)
        kill(stack.engine)
        after = list(events)  # bounded by the client's read timeout: the stream must end by itself
    response_id = before[0]["response"]["id"]
    types = [event["type"] for event in after]
    assert types[-3:] == ["error", "response.failed", "[DONE]"], types[-5:]
    assert "response.completed" not in types and "response.incomplete" not in types
    for event in before + after[:-1]:
        assert_valid(event, EVENT_SCHEMAS[event["type"]])
    error, failed = after[-3]["error"], after[-2]["response"]
    assert error["type"] == "server_error" and error["code"] in ("engine_unavailable", "engine_error")
    assert failed["status"] == "failed" and failed["error"]["code"] == error["code"]

    # The stored response says failed and keeps what was streamed.
    deltas = "".join(e["delta"] for e in before + after if e["type"] == "response.output_text.delta")
    with httpx.Client(base_url=stack.facade.address, timeout=WAIT_S) as http:
        stored = http.get(f"/v1/responses/{response_id}").json()
        assert stored["status"] == "failed"
        assert stored["output"][0]["content"][0]["text"] == deltas

        # While the engine is down: not ready, and requests fail fast with OpenAI-shaped 503s.
        wait_until(lambda: readyz(stack.facade.address) == 503, what="/readyz 503 while the engine is down")
        assert http.get("/healthz").status_code == 200
        error = assert_openai_error(http.post("/v1/responses", json=SHORT), 503)
        assert error["code"] == "engine_unavailable"
        error = assert_openai_error(http.post("/v1/responses", json={**SHORT, "stream": True}), 503)
        assert error["code"] == "engine_unavailable"

        # The engine comes back on the same address: the same facade process serves again.
        recovery_s = stack.restart_engine()
        assert recovery_s < WAIT_S
        answer = http.post("/v1/responses", json=SHORT)
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "incomplete"
        with http.stream("POST", "/v1/responses", json={**SHORT, "stream": True}) as streamed:
            assert [e["type"] for e in sse_events(streamed)][-2:] == ["response.incomplete", "[DONE]"]
    assert stack.facade.process.poll() is None and stack.facade.process.pid == facade_pid


def test_engine_killed_during_a_plain_request(stack: Stack) -> None:
    tag = f"plain-kill-{time.monotonic_ns()}"
    outcome: dict[str, Any] = {}

    def request() -> None:
        started = time.monotonic()
        with httpx.Client(base_url=stack.facade.address, timeout=WAIT_S) as http:
            outcome["response"] = http.post(
                "/v1/responses", json=long_body(stream=False, metadata={"tag": tag})
            )
        outcome["seconds"] = time.monotonic() - started

    client = threading.Thread(target=request)
    client.start()
    # Wait until the facade has stored the response as in progress: the engine call is running.
    wait_until(
        lambda: any(r.get("metadata", {}).get("tag") == tag for r in stack.stored_resources()),
        what="the response to be in progress",
    )
    kill(stack.engine)
    client.join(WAIT_S)
    assert not client.is_alive(), "the request hung after the engine died"
    error = assert_openai_error(outcome["response"], (502, 503))
    assert error["code"] in ("engine_unavailable", "engine_error")
    [stored] = [r for r in stack.stored_resources() if r.get("metadata", {}).get("tag") == tag]
    assert stored["status"] == "failed"
    stack.restart_engine()

"""Admission on the small engine (one running request, one waiting place), through the facade.

A full queue answers 503 with Retry-After at once, and the admitted requests still succeed. A
waiting request that is cancelled, or whose client leaves, gives its place back at once: it does
not hold it (nor its cancel call) until the running request ends.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from tests.faults.conftest import SmallStack
from tests.faults.stack import (
    WAIT_S,
    assert_openai_error,
    engine_report,
    long_body,
    read_until,
    sse_events,
    wait_until,
)

FLOOD = 6
# A refusal is an admission decision, not a wait: each overflow answer comes back within this.
REFUSAL_BOUND_S = 5.0
# Ending a waiting request takes one step of the running one; the facade's own fallback (cutting
# the call) would only come after its 10 s control timeout.
LEAVE_QUEUE_BOUND_S = 5.0
WAITING_TOKENS = 4


class WaitingStream(threading.Thread):
    """A streamed request that the engine queues; reads every event in the background."""

    def __init__(self, url: str, *, leave_early: bool = False, background: bool = False) -> None:
        super().__init__(daemon=True)
        self.url = url
        # A background response (cancellable): answered at once, then run; followed here.
        self.background = background
        # Leave (close the connection) once the response is in progress, while still queued.
        self.leave_early = leave_early
        self.accepted = threading.Event()
        self.status = 0
        self.events: list[dict[str, Any]] = []

    @property
    def response_id(self) -> str:
        wait_until(lambda: bool(self.events), what="response.created")
        return str(self.events[0]["response"]["id"])

    def run(self) -> None:
        body = {"model": "default", "input": "wait", "max_output_tokens": WAITING_TOKENS, "stream": True}
        if self.background:
            body["background"] = True
        with (
            httpx.Client(base_url=self.url, timeout=WAIT_S) as http,
            http.stream("POST", "/v1/responses", json=body) as response,
        ):
            self.status = response.status_code
            self.accepted.set()
            for event in sse_events(response):
                self.events.append(event)
                if self.leave_early and event["type"] == "response.in_progress":
                    return  # closes the connection: the client leaves

    def admitted(self) -> bool:
        """The facade opens a stream only once the engine admitted the request (or after a
        short wait for its first message): 200 means it holds a place; a refusal is a 503.
        A background response is answered at once: its run has begun at `response.in_progress`."""
        if not (self.accepted.wait(WAIT_S) and self.status == 200):
            return False
        if self.background:
            wait_until(lambda: "response.in_progress" in self.types(), what="response.in_progress")
        return True

    def types(self) -> list[str]:
        return [str(event["type"]) for event in self.events]


@contextlib.contextmanager
def slot_taken(stack: SmallStack) -> Iterator[Iterator[dict[str, Any]]]:
    """A long generation holds the engine's only slot until the block ends (its client leaves)."""
    with (
        stack.http() as http,
        http.stream("POST", "/v1/responses", json=long_body(stream=True)) as running,
    ):
        # The iterator is handed out, not dropped: dropping a half-read httpx stream closes the
        # connection, which would cancel the generation.
        events = sse_events(running)
        read_until(events, "response.output_text.delta")
        yield events


def waiting_stream(
    stack: SmallStack, *, leave_early: bool = False, background: bool = False
) -> WaitingStream:
    waiting = WaitingStream(stack.url, leave_early=leave_early, background=background)
    waiting.start()
    assert waiting.admitted()
    return waiting


def overflow(url: str, stream: bool) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    body = {"model": "default", "input": "one more", "max_output_tokens": 4, "stream": stream}
    with httpx.Client(base_url=url, timeout=WAIT_S) as http:
        response = http.post("/v1/responses", json=body)
    return response, time.monotonic() - started


def assert_finished(waiting: WaitingStream, reason: str) -> dict[str, Any]:
    waiting.join(WAIT_S)
    assert not waiting.is_alive(), "the waiting request never finished"
    assert waiting.types()[-2:] == ["response.incomplete", "[DONE]"], waiting.types()
    final: dict[str, Any] = waiting.events[-2]["response"]
    assert final["incomplete_details"] == {"reason": reason}
    return final


def test_full_queue_is_503_with_retry_after(idle_small_stack: SmallStack) -> None:
    stack = idle_small_stack
    with slot_taken(stack) as running:
        waiting = waiting_stream(stack)
        with ThreadPoolExecutor(FLOOD) as pool:
            answers = list(pool.map(lambda i: overflow(stack.url, stream=i % 2 == 0), range(FLOOD)))
        for response, seconds in answers:
            error = assert_openai_error(response, 503)
            assert error["code"] == "engine_overloaded"
            assert response.headers["retry-after"].isdigit()
            assert seconds < REFUSAL_BOUND_S
        assert next(running)["type"] == "response.output_text.delta"  # still generating
    # Its client left, which freed the slot: the waiting request runs and finishes normally.
    final = assert_finished(waiting, "max_output_tokens")
    assert final["usage"]["output_tokens"] == WAITING_TOKENS


def test_cancelling_a_waiting_response_gives_its_place_back(idle_small_stack: SmallStack) -> None:
    stack = idle_small_stack
    with slot_taken(stack) as running, stack.http() as control:
        waiting = waiting_stream(stack, background=True)
        started = time.monotonic()
        cancelled = control.post(f"/v1/responses/{waiting.response_id}/cancel")
        cancel_s = time.monotonic() - started
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        assert cancel_s < LEAVE_QUEUE_BOUND_S
        final = assert_finished(waiting, "cancelled")
        assert final["status"] == "cancelled"
        report = engine_report(stack.engine, waiting.response_id, timeout=1)
        assert (report.finish, report.generated) == ("FINISH_REASON_CANCELLED", 0)
        # The place is free again while the first request still runs.
        assert waiting_stream(stack).status == 200
        assert next(running)["type"] == "response.output_text.delta"


def test_a_waiting_client_that_leaves_gives_its_place_back(idle_small_stack: SmallStack) -> None:
    stack = idle_small_stack
    with slot_taken(stack) as running:
        waiting = waiting_stream(stack, leave_early=True)
        response_id = waiting.response_id
        waiting.join(WAIT_S)
        report = engine_report(stack.engine, response_id, timeout=LEAVE_QUEUE_BOUND_S)
        assert (report.finish, report.generated) == ("FINISH_REASON_CANCELLED", 0)
        assert waiting_stream(stack).status == 200
        assert next(running)["type"] == "response.output_text.delta"

"""A client that leaves mid-generation stops the engine within one decode step (docs/hardening.md, "Faults").

Evidence from the engine itself, three ways: its accounting line for the request (finish
CANCELLED, `tokens_after_cancel` within one step); Abort afterwards finds nothing to stop; and, with one
generation slot, the next request starts at once instead of waiting for the abandoned one's
remaining tokens.
"""

from __future__ import annotations

import httpx
import pytest

from tests.faults.conftest import SmallStack
from tests.faults.stack import (
    LONG_OUTPUT_TOKENS,
    EngineReport,
    engine_report,
    engine_reports,
    engine_still_has,
    long_body,
    read_until,
    sse_events,
    time_to_first_delta,
    wait_until,
)

from .stack import ONE_STEP

# An abandoned generation still running would hold the only slot for the rest of its
# LONG_OUTPUT_TOKENS (well over 10 s here); a stopped one frees it at once (~0.1 s).
NEXT_REQUEST_TTFT_BOUND_S = 5.0
# The plain request's client gives up after this long, mid-generation.
CLIENT_PATIENCE_S = 1.5


def assert_stopped_within_a_step(stack: SmallStack, report: EngineReport) -> None:
    assert report.finish == "FINISH_REASON_CANCELLED"
    assert report.tokens_after_cancel is not None and report.tokens_after_cancel <= ONE_STEP, report
    assert 0 < report.generated < LONG_OUTPUT_TOKENS
    assert not engine_still_has(stack.engine, report.request_id)
    with stack.http() as http:
        wait_until(
            lambda: http.get(f"/v1/responses/{report.request_id}").json()["status"] == "cancelled",
            what="the stored response to say cancelled",
        )


def test_stream_client_leaving_stops_the_engine(idle_small_stack: SmallStack) -> None:
    stack = idle_small_stack
    with stack.http() as http:
        with http.stream("POST", "/v1/responses", json=long_body(stream=True)) as response:
            seen = read_until(sse_events(response), "response.output_text.delta", count=3)
        # Leaving the block closed the connection mid-stream.
        next_ttft = time_to_first_delta(http)
    assert next_ttft < NEXT_REQUEST_TTFT_BOUND_S
    assert_stopped_within_a_step(stack, engine_report(stack.engine, seen[0]["response"]["id"]))


def test_plain_client_leaving_stops_the_engine(idle_small_stack: SmallStack) -> None:
    stack = idle_small_stack
    log_offset = len(stack.engine.log())
    with stack.http(timeout=CLIENT_PATIENCE_S) as impatient, pytest.raises(httpx.ReadTimeout):
        impatient.post("/v1/responses", json=long_body(stream=False))
    # The client gave up and its connection is closed; the response id is the engine's request id.
    with stack.http() as http:
        next_ttft = time_to_first_delta(http)
    assert next_ttft < NEXT_REQUEST_TTFT_BOUND_S
    cancelled: list[EngineReport] = []

    def reported() -> bool:
        reports = engine_reports(stack.engine, since=log_offset)
        cancelled[:] = [report for report in reports if report.finish == "FINISH_REASON_CANCELLED"]
        return bool(cancelled)

    wait_until(reported, what="the engine's report of the abandoned request")
    [report] = cancelled
    assert_stopped_within_a_step(stack, report)

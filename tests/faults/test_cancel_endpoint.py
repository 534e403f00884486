"""`POST /v1/responses/{id}/cancel` stops a running background generation in the engine, not only
its label."""

from __future__ import annotations

import time

from tests.facade.helpers import EVENT_SCHEMAS, assert_valid
from tests.faults.conftest import SmallStack
from tests.faults.stack import (
    LONG_OUTPUT_TOKENS,
    ONE_STEP,
    engine_report,
    engine_still_has,
    long_body,
    read_until,
    sse_events,
    time_to_first_delta,
)

# The endpoint aborts in the engine and waits for the generation to end: well under this.
CANCEL_BOUND_S = 5.0
NEXT_REQUEST_TTFT_BOUND_S = 5.0


def test_cancel_stops_a_running_stream(idle_small_stack: SmallStack) -> None:
    stack = idle_small_stack
    with stack.http() as http, stack.http() as control:
        body = long_body(stream=True, background=True)
        with http.stream("POST", "/v1/responses", json=body) as response:
            events = sse_events(response)
            seen = read_until(events, "response.output_text.delta", count=3)
            response_id = seen[0]["response"]["id"]
            started = time.monotonic()
            cancelled = control.post(f"/v1/responses/{response_id}/cancel")
            cancel_s = time.monotonic() - started
            rest = list(events)
        next_ttft = time_to_first_delta(http)
        stored = http.get(f"/v1/responses/{response_id}").json()

    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    assert cancel_s < CANCEL_BOUND_S
    # The stream ends on its own, with the cancelled response, then [DONE].
    assert [event["type"] for event in rest][-2:] == ["response.incomplete", "[DONE]"]
    final = rest[-2]["response"]
    assert final["status"] == "cancelled" and final["incomplete_details"] == {"reason": "cancelled"}
    for event in seen + rest[:-1]:
        assert_valid(event, EVENT_SCHEMAS[event["type"]])
    assert stored["status"] == "cancelled"
    assert stored["output"] == final["output"]

    report = engine_report(stack.engine, response_id)
    assert report.finish == "FINISH_REASON_CANCELLED"
    assert report.tokens_after_cancel is not None and report.tokens_after_cancel <= ONE_STEP
    assert report.generated < LONG_OUTPUT_TOKENS
    assert stored["usage"]["output_tokens"] == report.generated
    assert not engine_still_has(stack.engine, response_id)
    assert next_ttft < NEXT_REQUEST_TTFT_BOUND_S

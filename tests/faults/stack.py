"""Helpers for the fault tests: engines on a chosen address, SIGKILL, SSE reading, engine accounting.

Everything here drives real processes (`vlmserve-engine`, `vlmserve-facade`) started the way
tests/_services.py starts them; only the engine's address is ours to choose, so that a restarted
engine comes back where the facade's channel points.
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests._services import REPO, ServiceProcess, free_port, start_engine
from tests._sse import iter_lines
from vlmserve.client import EngineClient
from vlmserve.engine.config import EngineConfig

# The random-weight fixture model: it never ends a turn by itself, so a generation runs exactly as
# long as `max_output_tokens` says. Pinned: a trained model (VLMSERVE_TEST_MODEL) would answer
# briefly and stop before a test could act on its running generation.
FAULT_MODEL = REPO / "models" / "qwen2-vl-tiny"
# Long enough that a generation is still running when the test acts on it (the engine's default
# cap is 4096; ~250 tokens/s on the fixture model, so well over 10 s of decoding).
LONG_OUTPUT_TOKENS = 4000
# Every wait in these tests is bounded by this many seconds: nothing may hang.
WAIT_S = 30.0


def start_engine_at(log_dir: Path, address: str, *, extra: tuple[str, ...] = ()) -> ServiceProcess:
    """`vlmserve-engine` on `address` (FAULT_MODEL), returned once it reports SERVING."""
    return start_engine(log_dir, model=str(FAULT_MODEL), address=address, extra=extra)


def loopback_address() -> str:
    return f"127.0.0.1:{free_port()}"


def kill(service: ServiceProcess) -> None:
    """SIGKILL: no shutdown code runs (no drain, no flush, no goodbye to clients)."""
    service.process.send_signal(signal.SIGKILL)
    service.process.wait(timeout=WAIT_S)


def wait_until(condition: Callable[[], bool], *, timeout: float = WAIT_S, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def readyz(facade_url: str) -> int:
    try:
        return httpx.get(f"{facade_url}/readyz", timeout=5).status_code
    except httpx.HTTPError:
        return 0


def long_body(*, stream: bool, max_output_tokens: int = LONG_OUTPUT_TOKENS, **extra: Any) -> dict[str, Any]:
    return {
        "model": "default",
        "input": "Write a very long story.",
        "max_output_tokens": max_output_tokens,
        "stream": stream,
        **extra,
    }


def sse_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The JSON events of a Responses stream as they arrive; `{"type": "[DONE]"}` for the marker."""
    for line in iter_lines(response):
        if line.startswith("data:"):
            payload = line[len("data:") :].strip()
            yield {"type": "[DONE]"} if payload == "[DONE]" else json.loads(payload)


def read_until(events: Iterator[dict[str, Any]], event_type: str, count: int = 1) -> list[dict[str, Any]]:
    """Events up to and including the `count`-th of `event_type`."""
    seen: list[dict[str, Any]] = []
    found = 0
    for event in events:
        seen.append(event)
        if event["type"] == event_type:
            found += 1
            if found == count:
                return seen
    raise AssertionError(f"stream ended before {count} {event_type} events: {[e['type'] for e in seen]}")


def assert_openai_error(response: httpx.Response, status: int | tuple[int, ...]) -> dict[str, Any]:
    statuses = (status,) if isinstance(status, int) else status
    assert response.status_code in statuses, (response.status_code, response.text[:500])
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["type"] == ("server_error" if response.status_code >= 500 else "invalid_request_error")
    return error


# -- the engine's accounting ------------------------------------------------------------------------

_REPORT = re.compile(
    r"request (?P<id>\S+): prompt_tokens=(?P<prompt>\d+) images=(?P<images>\d+) generated=(?P<generated>\d+)"
    r" ttft=\S+ finish=(?P<finish>\w+)(?: tokens_after_cancel=(?P<after>\d+))?"
)


@dataclass(frozen=True)
class EngineReport:
    """The engine's per-request line, written when the request leaves the generation thread."""

    request_id: str
    generated: int
    finish: str
    tokens_after_cancel: int | None


def engine_reports(engine: ServiceProcess, *, since: int = 0) -> list[EngineReport]:
    """The reports in the engine's log, from character `since` of it on."""
    return [
        EngineReport(
            match["id"],
            int(match["generated"]),
            match["finish"],
            int(match["after"]) if match["after"] is not None else None,
        )
        for match in _REPORT.finditer(engine.log()[since:])
    ]


def engine_report(engine: ServiceProcess, request_id: str, *, timeout: float = WAIT_S) -> EngineReport:
    """The engine's report for `request_id`, once it has written one."""
    found: list[EngineReport] = []

    def logged() -> bool:
        found[:] = [report for report in engine_reports(engine) if report.request_id == request_id]
        return bool(found)

    wait_until(logged, timeout=timeout, what=f"the engine's report for {request_id}")
    assert len(found) == 1, found
    return found[0]


def engine_still_has(engine: ServiceProcess, request_id: str) -> bool:
    """Whether the engine still has the request queued or running (Abort's `found`).

    Asked only once the request should be gone: if it is not, Abort stops it, and the test fails.
    """
    with EngineClient(engine.address) as client:
        return client.abort(request_id)


def time_to_first_delta(http: httpx.Client, *, max_output_tokens: int = 4) -> float:
    """Seconds from sending a short streamed request to its first text delta (read to the end)."""
    started = time.monotonic()
    first: float | None = None
    body = {"model": "default", "input": "hi", "max_output_tokens": max_output_tokens, "stream": True}
    with http.stream("POST", "/v1/responses", json=body) as response:
        assert response.status_code == 200, response.read()[:500]
        for event in sse_events(response):
            if first is None and event["type"] == "response.output_text.delta":
                first = time.monotonic() - started
    assert first is not None, "no text delta"
    return first


# A cancel stops a request within one engine step: one token, or with speculation (on by
# default) a row's accepted drafts plus one.
ONE_STEP = 1 + EngineConfig().speculative_max_draft

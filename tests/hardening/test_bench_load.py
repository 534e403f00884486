"""The load script's pure parts, and one short run against an in-memory fake facade."""

from __future__ import annotations

import asyncio
import json
import os

import httpx
import pytest

from bench.load import (
    LoadConfig,
    SSEEvent,
    SSEParser,
    event_type,
    format_table,
    percentile,
    read_memory_kib,
    run_load,
)


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([], 50, None),
        ([7.0], 99, 7.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
        ([4.0, 1.0, 3.0, 2.0], 0, 1.0),
        ([4.0, 1.0, 3.0, 2.0], 100, 4.0),
        ([float(v) for v in range(1, 101)], 99, 99.01),
        ([float(v) for v in range(1, 101)], 50, 50.5),
    ],
)
def test_percentile(values: list[float], q: float, expected: float | None) -> None:
    result = percentile(values, q)
    assert result == expected if expected is None else result == pytest.approx(expected)


def test_percentile_rejects_out_of_range_q() -> None:
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def parse_all(lines: list[str]) -> list[SSEEvent]:
    parser = SSEParser()
    events = [event for line in lines if (event := parser.feed(line)) is not None]
    if (last := parser.close()) is not None:
        events.append(last)
    return events


def test_sse_parser() -> None:
    lines = [
        ": keep-alive comment",
        "event: response.created\r",
        'data: {"type": "response.created"}',
        "",
        "",  # a second blank line dispatches nothing
        "data: line one",
        "data:line two",
        "",
        "event: response.completed",
        'data: {"type": "response.completed"}',
        "",
        "data: [DONE]",
    ]
    assert parse_all(lines) == [
        SSEEvent("response.created", '{"type": "response.created"}'),
        SSEEvent("message", "line one\nline two"),
        SSEEvent("response.completed", '{"type": "response.completed"}'),
        SSEEvent("message", "[DONE]"),
    ]


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (SSEEvent("response.output_text.delta", "{}"), "response.output_text.delta"),
        (SSEEvent("message", '{"type": "response.failed"}'), "response.failed"),
        (SSEEvent("message", "[DONE]"), "[DONE]"),
        (SSEEvent("message", "[1, 2]"), "message"),
    ],
)
def test_event_type(event: SSEEvent, expected: str) -> None:
    assert event_type(event) == expected


def sse(*types: str) -> bytes:
    chunks = [f"event: {kind}\ndata: {json.dumps({'type': kind})}\n\n" for kind in types]
    return ("".join(chunks) + "data: [DONE]\n\n").encode()


COMPLETE = sse(
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.completed",
)


def test_a_short_run_against_a_fake_facade_counts_everything() -> None:
    in_flight = 0
    peak_in_flight = 0
    served = 0

    async def facade(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, peak_in_flight, served
        assert request.url.path == "/v1/responses"
        assert request.headers["authorization"] == "Bearer sk-bench"
        body = json.loads(request.content)
        assert body["stream"] is True and body["input"][0]["content"][1]["type"] == "input_image"
        in_flight += 1
        peak_in_flight = max(peak_in_flight, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        served += 1
        if served % 10 == 0:
            return httpx.Response(503, json={"error": {"message": "busy"}}, headers={"Retry-After": "1"})
        if served % 10 == 5:
            return httpx.Response(200, content=sse("response.created", "error", "response.failed"))
        if served % 10 == 7:
            return httpx.Response(200, content=sse("response.created", "response.output_text.delta")[:-14])
        return httpx.Response(200, content=COMPLETE, headers={"content-type": "text/event-stream"})

    config = LoadConfig(
        base_url="http://127.0.0.1:8000",
        requests=40,
        concurrency=4,
        image=True,
        api_key="sk-bench",
        pids=(os.getpid(),),
    )
    report = asyncio.run(run_load(config, transport=httpx.MockTransport(facade)))
    assert (report.completed, report.ok, report.not_started) == (40, 28, 0)
    assert report.errors == {"http_503": 4, "stream_failed": 4, "stream_truncated": 4}
    assert peak_in_flight <= 4
    assert report.ttft_s["p50"] is not None and report.latency_s["p99"] is not None
    assert report.ttft_s["p50"] <= report.latency_s["p50"]
    memory = report.memory[0]
    assert memory["peak_rss_kib"] >= memory["start_rss_kib"] > 0
    assert report.config["api_key"] == "***"
    table = format_table(report)
    assert "28 / 40 / 40" in table and "http_503=4" in table


def test_non_streaming_runs_check_the_response_status() -> None:
    statuses = iter(["completed", "incomplete", "failed"] * 2)

    def facade(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"object": "response", "status": next(statuses)})

    config = LoadConfig(base_url="http://localhost:8000", requests=6, concurrency=2, stream=False)
    report = asyncio.run(run_load(config, transport=httpx.MockTransport(facade)))
    assert (report.ok, report.errors) == (4, {"status_failed": 2})
    assert report.ttft_s["p50"] is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base_url": "http://10.0.0.1:8000"},
        {"base_url": "http://example.com"},
        {"base_url": "http://127.0.0.1:8000", "requests": 0},
        {"base_url": "http://127.0.0.1:8000", "concurrency": 1000},
    ],
)
def test_config_is_bounded_and_loopback_only(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        LoadConfig(**kwargs)  # type: ignore[arg-type]


def test_memory_of_this_process_is_readable() -> None:
    values = read_memory_kib(os.getpid())
    assert values["VmHWM"] >= values["VmRSS"] > 0
    assert read_memory_kib(2**22 + 12345) == {}

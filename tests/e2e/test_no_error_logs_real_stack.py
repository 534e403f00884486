"""Healthy traffic logs no ERROR line: real clients (the openai SDK, plain and streamed,
Responses and chat completions, a tool call, a background response) against a fresh engine +
facade pair of their own, whose logs are then read whole.

An operator alerting on ERROR must not be paged for requests that succeeded: the engine once
logged `Generate failed` and `Task exception was never retrieved` for calls whose client had its
answer (a context-variable token held across `yield` was reset in another context).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests._services import ServiceProcess, start_engine, start_facade

WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
CLIENTS = 3


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceProcess, ServiceProcess]]:
    logs: Path = tmp_path_factory.mktemp("healthy-traffic")
    engine = start_engine(logs)
    try:
        facade = start_facade(logs, engine.address, store_path=logs / "responses.sqlite3")
        try:
            yield engine, facade
        finally:
            facade.stop()
    finally:
        engine.stop()


def healthy_traffic(client: openai.OpenAI) -> None:
    """Each request succeeds (asserted): anything logged as an error is a false alarm."""
    plain = client.responses.create(model="default", input="Say hi.", max_output_tokens=8)
    assert plain.status in ("completed", "incomplete")
    with client.responses.stream(model="default", input="Say hi.", max_output_tokens=8) as stream:
        for _ in stream:
            pass
        assert stream.get_final_response().status in ("completed", "incomplete")
    events = list(client.responses.create(model="default", input="Hi", max_output_tokens=8, stream=True))
    assert events[-1].type in ("response.completed", "response.incomplete")
    call = client.responses.create(
        model="default",
        input="Weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=64,
    )
    assert [item.type for item in call.output] == ["function_call"]
    follow_up = client.responses.create(
        model="default",
        previous_response_id=call.id,
        input=[{"type": "function_call_output", "call_id": call.output[0].call_id, "output": "sunny"}],  # type: ignore[union-attr]
        max_output_tokens=8,
    )
    assert follow_up.status in ("completed", "incomplete")
    background = client.responses.create(model="default", input="Hi", max_output_tokens=8, background=True)
    deadline = time.monotonic() + 60
    while background.status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.1)
        background = client.responses.retrieve(background.id)
    assert background.status in ("completed", "incomplete")
    chat = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=8
    )
    assert chat.choices[0].finish_reason in ("stop", "length")
    chunks = list(
        client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=8, stream=True
        )
    )
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert client.models.list().data
    # A client that has read enough and leaves: healthy too (the engine call is cancelled).
    with client.responses.stream(model="default", input="Write a story.", max_output_tokens=64) as early:
        for event in early:
            if event.type == "response.output_text.delta":
                break


def test_healthy_traffic_logs_no_error(stack: tuple[ServiceProcess, ServiceProcess]) -> None:
    engine, facade = stack
    with (
        openai.OpenAI(base_url=f"{facade.address}/v1", api_key="x", max_retries=0, timeout=120) as client,
        concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool,
    ):
        # Several clients at once: calls end while others are being written (the race that
        # left the engine's generators to be closed by the garbage collector).
        for done in [pool.submit(healthy_traffic, client) for _ in range(CLIENTS)]:
            done.result()
    time.sleep(1.0)  # what the engine logs as a call is torn down comes just after the answer
    for process in (engine, facade):
        errors = process.error_lines()
        assert errors == [], f"{process.log_path.name}:\n" + "\n".join(errors[:20])

"""The facade dies (SIGKILL, no clean shutdown) and restarts on the same store: nothing is lost.

Issue 5, Faults: every stored response, its input items, and every conversation with its items
read back exactly as before. A (background) generation that was running when the facade died is
stopped by the engine (the facade's connection went away with it), and the restarted facade marks
its response failed (server_error) instead of leaving it in progress forever, and ends its stored
events with `response.failed`, so a resumed stream ends too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._services import ServiceProcess, start_facade
from tests.facade.helpers import SCREENSHOT_TOOL, png_data_url, screenshot_tool_input
from tests.faults.conftest import SmallStack
from tests.faults.stack import (
    WAIT_S,
    engine_report,
    kill,
    long_body,
    read_until,
    sse_events,
)

from .stack import ONE_STEP

pytestmark = pytest.mark.needs_model

SMALL = 4
# The killed facade's claim on its running response lapses after a second, not the default 30.
SHORT_LEASE = ("--lease-ttl", "1")


def when_swept(http: httpx.Client, response_id: str) -> dict[str, Any]:
    """The response once it is no longer in progress (bounded by WAIT_S)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        resource: dict[str, Any] = http.get(f"/v1/responses/{response_id}").json()
        if resource["status"] != "in_progress" or time.monotonic() > deadline:
            return resource
        time.sleep(0.1)


def user_message(text: str, image_url: str | None = None) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "input_text", "text": text}]
    if image_url is not None:
        content.append({"type": "input_image", "image_url": image_url, "detail": "low"})
    return {"type": "message", "role": "user", "content": content}


def created(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    response = http.post("/v1/responses", json={"model": "default", "max_output_tokens": SMALL, **body})
    assert response.status_code == 200, response.text
    resource: dict[str, Any] = response.json()
    return resource


def streamed(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    payload = {"model": "default", "max_output_tokens": SMALL, "stream": True, **body}
    with http.stream("POST", "/v1/responses", json=payload) as response:
        events = list(sse_events(response))
    assert events[-1]["type"] == "[DONE]", events[-2:]
    final: dict[str, Any] = events[-2]["response"]
    return final


def snapshot(
    http: httpx.Client, response_ids: list[str], conversation_id: str, deleted: str
) -> dict[str, Any]:
    """Everything the API shows about these objects."""
    shown: dict[str, Any] = {}
    for response_id in response_ids:
        shown[response_id] = http.get(f"/v1/responses/{response_id}").json()
        shown[f"{response_id}/input_items"] = http.get(
            f"/v1/responses/{response_id}/input_items", params={"order": "asc", "limit": 100}
        ).json()
    shown[conversation_id] = http.get(f"/v1/conversations/{conversation_id}").json()
    shown[f"{conversation_id}/items"] = http.get(
        f"/v1/conversations/{conversation_id}/items", params={"order": "asc", "limit": 100}
    ).json()
    shown[deleted] = http.get(f"/v1/responses/{deleted}").status_code
    return shown


@pytest.fixture
def facade_logs(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def facades(facade_logs: Path) -> Iterator[list[ServiceProcess]]:
    """Facades this test starts; whatever is still running at the end is stopped."""
    started: list[ServiceProcess] = []
    yield started
    for facade in started:
        facade.stop()


def test_facade_killed_and_restarted_keeps_every_stored_object(
    idle_small_stack: SmallStack, facade_logs: Path, facades: list[ServiceProcess]
) -> None:
    engine = idle_small_stack.engine
    store_path = facade_logs / "responses.sqlite3"
    first = start_facade(facade_logs, engine.address, store_path=store_path, extra=SHORT_LEASE)
    facades.append(first)
    with httpx.Client(base_url=first.address, timeout=WAIT_S) as http:
        seed = created(
            http, {"input": screenshot_tool_input(png_data_url((255, 0, 0))), "tools": [SCREENSHOT_TOOL]}
        )
        chained = streamed(
            http,
            {
                "previous_response_id": seed["id"],
                "input": [user_message("and now?")],
                "tools": [SCREENSHOT_TOOL],
            },
        )
        doomed = created(http, {"input": "to be deleted"})
        assert http.delete(f"/v1/responses/{doomed['id']}").status_code == 200
        conversation = http.post(
            "/v1/conversations",
            json={"items": [user_message("look", png_data_url((0, 0, 255)))], "metadata": {"k": "v"}},
        ).json()
        in_conversation = created(http, {"conversation": conversation["id"], "input": "what colour?"})
        added = http.post(
            f"/v1/conversations/{conversation['id']}/items", json={"items": [user_message("one more")]}
        )
        assert added.status_code == 200, added.text
        ids = [seed["id"], chained["id"], in_conversation["id"]]
        before = snapshot(http, ids, conversation["id"], doomed["id"])

        # A generation still running when the facade dies (a background one: its events are kept).
        body = long_body(stream=True, background=True)
        with http.stream("POST", "/v1/responses", json=body) as running:
            events = sse_events(running)
            running_id = read_until(events, "response.output_text.delta", count=2)[0]["response"]["id"]
            kill(first)

    assert [item["type"] for item in before[f"{conversation['id']}/items"]["data"]] == ["message"] * 4
    assert before[doomed["id"]] == 404

    # The engine noticed the facade's connection go and stopped that generation within a step.
    report = engine_report(engine, running_id)
    assert report.finish == "FINISH_REASON_CANCELLED"
    assert report.tokens_after_cancel is not None and report.tokens_after_cancel <= ONE_STEP

    second = start_facade(facade_logs, engine.address, store_path=store_path, extra=SHORT_LEASE)
    facades.append(second)
    with httpx.Client(base_url=second.address, timeout=WAIT_S) as http:
        assert snapshot(http, ids, conversation["id"], doomed["id"]) == before
        # The interrupted response was kept; once the dead facade's lease has run out (at start-up,
        # or at one of the restarted facade's renewals) it is marked as never to finish.
        interrupted = when_swept(http, running_id)
        assert interrupted["status"] == "failed"
        assert interrupted["error"] == {
            "code": "server_error",
            "message": "The server restarted before this response finished.",
        }
        assert http.post(f"/v1/responses/{running_id}/cancel").status_code == 400
        # Its stored events resume and end: the restart appended `response.failed`.
        resume = {"stream": "true", "starting_after": 2}
        with http.stream("GET", f"/v1/responses/{running_id}", params=resume) as resumed:
            events = list(sse_events(resumed))
        assert events[0]["sequence_number"] == 3
        assert [event["type"] for event in events[-2:]] == ["response.failed", "[DONE]"]
        assert events[-2]["response"] == interrupted
        # The restarted facade continues a stored chain (replay reads the recovered items).
        continued = created(
            http, {"previous_response_id": chained["id"], "input": "go on", "tools": [SCREENSHOT_TOOL]}
        )
        assert continued["previous_response_id"] == chained["id"]


@pytest.mark.parametrize("stream", [True, False])
def test_facade_killed_right_after_the_final_event_keeps_the_response(
    idle_small_stack: SmallStack, facade_logs: Path, facades: list[ServiceProcess], stream: bool
) -> None:
    """Issue 13.4: SIGKILL the moment the client has read the final event (`response.incomplete`:
    the random model runs to max_output_tokens) or the JSON answer: the restarted facade shows the
    response as the client saw it, and its conversation items."""
    store_path = facade_logs / "responses.sqlite3"
    for run in range(3):
        facade = start_facade(facade_logs, idle_small_stack.engine.address, store_path=store_path)
        facades.append(facade)
        with httpx.Client(base_url=facade.address, timeout=WAIT_S) as http:
            conversation = http.post("/v1/conversations", json={}).json()["id"]
            body = {"model": "default", "max_output_tokens": SMALL, "input": f"run {run}"}
            body["conversation"] = conversation
            if stream:
                with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as response:
                    final = read_until(sse_events(response), "response.incomplete")[-1]["response"]
                    kill(facade)
            else:
                final = http.post("/v1/responses", json=body).json()
                kill(facade)
        restarted = start_facade(facade_logs, idle_small_stack.engine.address, store_path=store_path)
        facades.append(restarted)
        with httpx.Client(base_url=restarted.address, timeout=WAIT_S) as http:
            shown = http.get(f"/v1/responses/{final['id']}").json()
            assert (shown["status"], shown["output"]) == (final["status"], final["output"]), run
            items = http.get(f"/v1/conversations/{conversation}/items", params={"order": "asc"}).json()
            assert [item["id"] for item in items["data"]][1:] == [item["id"] for item in final["output"]]
        restarted.stop()

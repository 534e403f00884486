"""The pinned Codex CLI against the recording server: pins what Codex sends and how it judges streams.

These are the observations docs/codex-shapes.md is built on (request shapes, the image-only
view_image output, which stream endings Codex accepts), re-checked on every run so that a Codex
upgrade that changes them is noticed. They also prove the CLI test's verdict can fail: a 400, a
failed or truncated stream are protocol problems; running out of output tokens is not.
No facade or engine here: a few seconds in all.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests._services import free_port
from tests.codex.codex_cli import (
    CODEX_PINS,
    INCOMPLETE_MAX_OUTPUT,
    CodexPin,
    CodexRun,
    codex_unavailable_reason,
    loopback_only_env,
    run_codex_exec,
    write_config,
)
from tests.codex.codex_requests import screenshot_png
from tests.codex.record_codex_requests import make_handler

CODEX_RUN_TIMEOUT_S = 60


pytestmark = pytest.mark.needs_model


@pytest.fixture(scope="module", params=CODEX_PINS, ids=lambda pin: pin.version)
def codex_pin(request: pytest.FixtureRequest) -> CodexPin:
    """Every test runs each pinned Codex CLI (the long-pinned one and the newest beside it)."""
    pin: CodexPin = request.param
    reason = codex_unavailable_reason(pin.bin)
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"Codex CLI must run in CI: {reason}")
        pytest.skip(reason)
    return pin


def _run_against_recorder(
    tmp_path: Path,
    pin: CodexPin,
    *,
    scenario: str = "ok",
    view_image: str | None = None,
    http_error: int | None = None,
    idle_timeout_ms: int = 60_000,
    stall_seconds: float = 0.0,
    stall_fill: str = "none",
) -> tuple[CodexRun, list[dict[str, Any]]]:
    log_dir = tmp_path / "requests"
    log_dir.mkdir()
    handler = make_handler(log_dir, view_image, scenario, http_error, stall_seconds, stall_fill)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        codex_home = tmp_path / "codex-home"
        base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        write_config(codex_home, base_url, model="default", idle_timeout_ms=idle_timeout_ms)
        workdir = tmp_path / "project"
        workdir.mkdir()
        (workdir / "screenshot.png").write_bytes(screenshot_png())
        env = loopback_only_env(codex_home, dead_port=free_port())
        run = run_codex_exec("Describe screenshot.png.", workdir, env, CODEX_RUN_TIMEOUT_S, codex_bin=pin.bin)
    finally:
        server.shutdown()
        server.server_close()
    requests = [json.loads(path.read_text()) for path in sorted(log_dir.glob("req_*.json"))]
    return run, requests


def _agent_messages(run: CodexRun) -> list[str]:
    return [
        str(event["item"].get("text"))
        for event in run.events
        if event.get("type") == "item.completed" and event.get("item", {}).get("type") == "agent_message"
    ]


@pytest.fixture
def view_image_round_trip(
    tmp_path: Path, codex_pin: CodexPin
) -> Iterator[tuple[CodexRun, list[dict[str, Any]], bytes]]:
    run, requests = _run_against_recorder(tmp_path, codex_pin, view_image="screenshot.png")
    yield run, requests, (tmp_path / "project" / "screenshot.png").read_bytes()


def test_codex_request_fields_and_tools(
    view_image_round_trip: tuple[CodexRun, list[dict[str, Any]], bytes],
) -> None:
    run, requests, _ = view_image_round_trip
    assert not run.protocol_problems(), run.describe()
    # Only the model endpoint is called: no plugin sync, no model list, nothing beyond loopback.
    assert [(r["method"], r["path"]) for r in requests] == [("POST", "/v1/responses")] * 2
    headers = {key.lower(): value for key, value in requests[0]["headers"].items()}
    assert headers["authorization"] == "Bearer dummy-key"
    assert headers["accept"] == "text/event-stream"
    assert "content-encoding" not in headers
    body = requests[0]["body"]
    assert set(body) == {
        "model", "stream", "input", "tools", "tool_choice", "parallel_tool_calls", "reasoning",
        "store", "include", "prompt_cache_key", "client_metadata",
    }  # fmt: skip
    assert (body["stream"], body["store"], body["tool_choice"], body["parallel_tool_calls"]) == (
        True,
        False,
        "auto",
        True,
    )
    assert body["include"] == ["reasoning.encrypted_content"]
    assert [item["role"] for item in body["input"]] == ["developer", "developer", "user", "user"]
    assert all(item["id"].startswith("msg_") for item in body["input"])
    kinds = {tool["type"] for tool in body["tools"]}
    assert {"function", "namespace", "web_search"} <= kinds
    namespace = next(tool for tool in body["tools"] if tool["type"] == "namespace")
    assert namespace["tools"] and all(tool["type"] == "function" for tool in namespace["tools"])
    assert all("strict" in tool for tool in body["tools"] if tool["type"] == "function")


def test_codex_sends_view_image_result_as_image_only_output(
    view_image_round_trip: tuple[CodexRun, list[dict[str, Any]], bytes],
) -> None:
    run, requests, png = view_image_round_trip
    turn2 = requests[1]["body"]["input"]
    call, output = turn2[-2], turn2[-1]
    assert call["type"] == "function_call" and call["name"] == "view_image" and call["status"] == "completed"
    assert output["type"] == "function_call_output" and output["call_id"] == call["call_id"]
    assert [part["type"] for part in output["output"]] == ["input_image"]
    image = output["output"][0]
    assert image["detail"] == "high"
    assert base64.b64decode(image["image_url"].removeprefix("data:image/png;base64,")) == png
    assert _agent_messages(run)


def test_running_out_of_output_tokens_is_not_a_protocol_problem(tmp_path: Path, codex_pin: CodexPin) -> None:
    run, _ = _run_against_recorder(tmp_path, codex_pin, scenario="incomplete")
    assert run.returncode == 1
    assert run.errors() and set(run.errors()) == {INCOMPLETE_MAX_OUTPUT}
    assert not run.protocol_problems(), run.describe()


@pytest.mark.parametrize(
    ("scenario", "http_error", "expected"),
    [
        ("ok", 400, "recorder: refused"),
        ("failed", None, "stream disconnected before completion: recorder: engine failed"),
        ("truncated", None, "stream closed before response.completed"),
    ],
)
def test_broken_answers_are_protocol_problems(
    tmp_path: Path, codex_pin: CodexPin, scenario: str, http_error: int | None, expected: str
) -> None:
    run, _ = _run_against_recorder(tmp_path, codex_pin, scenario=scenario, http_error=http_error)
    problems = run.protocol_problems()
    assert any(expected in problem for problem in problems), run.describe()


def test_without_output_item_done_codex_shows_nothing(tmp_path: Path, codex_pin: CodexPin) -> None:
    # Why the facade must send response.output_item.done for every item.
    run, _ = _run_against_recorder(tmp_path, codex_pin, scenario="no_item_done")
    assert not _agent_messages(run), run.describe()


@pytest.mark.parametrize(("fill", "survives"), [("comment", False), ("in_progress", True)])
def test_only_real_events_keep_codex_idle_timer_alive(
    tmp_path: Path, codex_pin: CodexPin, fill: str, survives: bool
) -> None:
    # Why the facade's prefill heartbeat is a `response.in_progress` event, not an SSE comment.
    run, _ = _run_against_recorder(
        tmp_path, codex_pin, idle_timeout_ms=2500, stall_seconds=5, stall_fill=fill
    )
    idle = [problem for problem in run.protocol_problems() if "idle timeout" in problem]
    assert (not idle) == survives, run.describe()

"""Codex-shaped requests through the real facade and engine (fixture model), streaming.

The requests are built from the shapes Codex CLI 0.169.0 was recorded sending
(docs/codex-shapes.md), plus the recorded bodies themselves. Between facade and engine sits a
recording gRPC hop, so "the engine received the image" is the engine's own `usage.image_count`.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests._engine_recorder import EngineRecorder, RecordedCall
from tests._services import ServiceProcess
from tests.codex.codex_requests import (
    RECORDED_KNOWN_MODEL_TURN1,
    RECORDED_TURN2,
    codex_headers,
    codex_view_image_turn2,
    load_recorded,
    screenshot_png,
)
from tests.codex.sse import SseStream, post_streaming
from tests.facade.helpers import EVENT_SCHEMAS, assert_valid
from vlmserve.engine.prep.lowering import IMAGE_FOLLOW_UP_MARKER, lower_messages
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade.responses.delivery import IGNORED_TOOLS_HEADER

TERMINAL_TYPES = {"response.completed", "response.incomplete"}


@pytest.fixture(scope="module")
def http(recorded_facade: ServiceProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=recorded_facade.address, timeout=httpx.Timeout(300.0, connect=10.0)) as client:
        yield client


def _replay(
    http: httpx.Client, recorder: EngineRecorder, body: dict[str, Any]
) -> tuple[SseStream, RecordedCall]:
    before = len(recorder.recording.calls)
    stream = post_streaming(http, "/v1/responses", body, headers=codex_headers())
    assert stream.status_code == 200, stream.body[:2000]
    calls = recorder.recording.calls[before:]
    assert len(calls) == 1, f"expected one engine call, got {len(calls)}"
    return stream, calls[0]


def _assert_codex_can_consume(stream: SseStream) -> None:
    """What Codex needs from a stream (observed): ordered events, item.done, a terminal event."""
    assert stream.events, "no events"
    for name, event in zip(stream.names, stream.events, strict=True):
        assert name is None or name == event["type"], (name, event["type"])
    numbers = [event["sequence_number"] for event in stream.events]
    assert numbers[0] == 0
    assert all(later > earlier for earlier, later in itertools.pairwise(numbers)), numbers
    types = stream.types()
    assert types[0] == "response.created"
    assert types[-1] in TERMINAL_TYPES, types[-3:]
    assert not {"error", "response.failed"} & set(types), types
    assert stream.done_marker
    for event in stream.events:
        assert_valid(event, EVENT_SCHEMAS[event["type"]])
    terminal = stream.terminal()["response"]
    # Codex takes output only from response.output_item.done: every output item needs one.
    done_items = [event["item"] for event in stream.events if event["type"] == "response.output_item.done"]
    assert [item["id"] for item in done_items] == [item["id"] for item in terminal["output"]]
    for item in done_items:
        if item["type"] == "function_call":
            assert item["call_id"] and item["name"] and isinstance(item["arguments"], str)
    usage = terminal["usage"]
    assert usage["input_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    if terminal["status"] == "incomplete":
        assert terminal["incomplete_details"] == {"reason": "max_output_tokens"}


def _images(message: pb.Message) -> list[pb.ImagePart]:
    return [part.image for part in message.parts if part.HasField("image")]


def _assert_image_after_tool_result(call: RecordedCall, png: bytes | None = None) -> None:
    # The engine receives the conversation as sent (the image inside the tool output) and lowers
    # it where it renders the template: the model sees the image in a following user turn.
    raw_tool = [message for message in call.request.messages if message.role == pb.ROLE_TOOL][-1]
    raw_images = [part.image for part in raw_tool.tool_output.parts.parts if part.HasField("image")]
    assert len(raw_images) == 1 and (png is None or raw_images[0].data == png)
    messages = lower_messages(call.request.messages)
    tool_index = max(i for i, message in enumerate(messages) if message.role == pb.ROLE_TOOL)
    tool = messages[tool_index]
    assert tool.tool_output.text.rstrip().endswith(IMAGE_FOLLOW_UP_MARKER)
    follow_up = messages[tool_index + 1]
    assert follow_up.role == pb.ROLE_USER
    images = _images(follow_up)
    assert len(images) == 1
    assert images[0].detail == pb.IMAGE_DETAIL_HIGH
    if png is not None:
        assert images[0].data == png
    assert sum(len(_images(message)) for message in messages) == 1
    assert call.result is not None, "the engine sent no result"
    assert call.result.usage.image_count == 1


def _served_model(http: httpx.Client) -> str:
    models = http.get("/v1/models").json()["data"]
    return str(models[0]["id"])


def test_view_image_turn_built_from_codex_shapes_reaches_the_engine(
    http: httpx.Client, engine_recorder: EngineRecorder
) -> None:
    png = screenshot_png()
    body = codex_view_image_turn2(_served_model(http), png)
    stream, call = _replay(http, engine_recorder, body)
    _assert_codex_can_consume(stream)
    _assert_image_after_tool_result(call, png)
    offered = {tool.function.name for tool in call.request.tools}
    # Namespace members are offered like top-level functions; hosted tools are left out.
    assert {"exec_command", "view_image", "spawn_agent", "close_agent"} <= offered
    assert "web_search" not in offered


def test_recorded_codex_turn2_replays_as_sent(http: httpx.Client, engine_recorder: EngineRecorder) -> None:
    # The full recorded body (~11k prompt tokens here), unchanged: no max_output_tokens, like Codex.
    body = load_recorded(RECORDED_TURN2)
    assert body["model"] == "default"  # the alias every facade serves
    stream, call = _replay(http, engine_recorder, body)
    _assert_codex_can_consume(stream)
    _assert_image_after_tool_result(call)
    offered = {tool.function.name for tool in call.request.tools}
    assert {"exec_command", "close_agent", "wait_agent", "update_goal"} <= offered
    # The hosted tool is left out of the prompt and named in a response header, never a 400.
    assert "web_search" not in offered
    assert stream.headers.get(IGNORED_TOOLS_HEADER) == "web_search", dict(stream.headers)


def test_known_model_shapes_custom_and_tool_search_are_accepted(
    http: httpx.Client, engine_recorder: EngineRecorder
) -> None:
    # Codex sends these for model slugs it knows (`custom` grammar tool, client-run `tool_search`,
    # `text.verbosity`, `reasoning.effort`); a user who names our model like that must not get a 400.
    # The long developer texts are cut and the output bounded: this test is about shapes, not size.
    body = copy.deepcopy(load_recorded(RECORDED_KNOWN_MODEL_TURN1))
    body["model"] = "default"
    body["max_output_tokens"] = 16
    for item in body["input"]:
        for part in item.get("content", []):
            part["text"] = part["text"][:1500]
    stream, call = _replay(http, engine_recorder, body)
    _assert_codex_can_consume(stream)
    assert "apply_patch" in {tool.function.name for tool in call.request.tools}
    assert set(stream.headers.get(IGNORED_TOOLS_HEADER, "").split(",")) == {"tool_search", "web_search"}
    assert call.result is not None and call.result.usage.image_count == 0

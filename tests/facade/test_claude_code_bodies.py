"""The requests Claude Code really sent (recorded in tests/claude_code/data: 2.1.328, the pinned
one, and 2.1.332, the newest on npm when recorded), replayed through the facade as sent, headers
included: a stream the anthropic SDK's event models accept, and the Read tool's image-only
tool_result reaching the engine as an image (the real-stack replay: tests/claude_code)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from anthropic.types import RawMessageStreamEvent
from pydantic import TypeAdapter

from tests.facade.fake_engine import FakeEngine
from tests.facade.helpers import parse_sse

DATA = Path(__file__).resolve().parents[1] / "claude_code" / "data"
EVENTS: TypeAdapter[RawMessageStreamEvent] = TypeAdapter(RawMessageStreamEvent)
_HEADERS = ("anthropic-version", "anthropic-beta", "x-app", "user-agent")


@pytest.mark.parametrize(
    ("name", "images"),
    [
        ("claude_code_read_turn1.json", 0),
        ("claude_code_read_image_turn2.json", 1),
        ("claude_code_2_1_332_read_turn1.json", 0),
        ("claude_code_2_1_332_read_image_turn2.json", 1),
    ],
)
async def test_recorded_claude_code_request_streams(
    http: httpx.AsyncClient, engine: FakeEngine, name: str, images: int
) -> None:
    recorded: dict[str, Any] = json.loads((DATA / name).read_text())
    headers = {key: value for key, value in recorded["headers"].items() if key in _HEADERS}
    engine.info.context_length = 262_144
    reply = await http.post(recorded["path"], json=recorded["body"], headers=headers)
    assert reply.status_code == 200, reply.text[:1000]
    assert reply.headers["request-id"] == reply.headers["x-request-id"]
    payloads = [event.json() for event in parse_sse(reply.text)]
    for payload in payloads:
        if payload["type"] != "ping":
            EVENTS.validate_python(payload)
    assert payloads[0]["type"] == "message_start" and payloads[-1]["type"] == "message_stop"
    # It asked for context_management (clear_thinking, keep all): reported, nothing cleared.
    (delta,) = [payload for payload in payloads if payload["type"] == "message_delta"]
    assert delta["context_management"] == {"applied_edits": []}
    (request,) = engine.requests
    sent = [
        part
        for message in request.messages
        for part in message.tool_output.parts.parts
        if part.HasField("image")
    ]
    assert len(sent) == images

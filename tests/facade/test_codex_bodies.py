"""The request bodies Codex CLI really sent (recorded in tests/codex/data: 0.169.0, the pinned one,
and 0.171.0, the newest on npm when recorded), through the facade."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.facade.fake_engine import FakeEngine
from tests.facade.helpers import EVENT_SCHEMAS, assert_valid, stream_events
from vlmserve.engine.prep.lowering import lower_messages
from vlmserve.engine.v1 import engine_pb2 as pb

DATA = Path(__file__).resolve().parents[1] / "codex" / "data"


def recorded(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((DATA / name).read_text())
    return body


@pytest.mark.parametrize(
    ("name", "images", "ignored"),
    [
        ("codex_request_turn2.json", 1, "web_search"),
        ("codex_request_known_model_turn1.json", 0, "tool_search,web_search"),
        ("codex_0171_request_turn2.json", 1, "web_search"),
    ],
)
async def test_recorded_codex_request_streams_to_completion(
    http: httpx.AsyncClient, engine: FakeEngine, name: str, images: int, ignored: str
) -> None:
    body = recorded(name)
    body["model"] = "default"
    # Codex's prompt (its instructions and tools) is longer than the fake model's 4096 tokens:
    # a model it fits (else it is compacted first: tests/facade/test_auto_compaction.py).
    engine.info.context_length = 262_144
    headers = {"x-codex-window-id": "w:0", "session-id": "s", "authorization": "Bearer anything"}
    response = await http.post("/v1/responses", json=body, headers=headers)
    assert response.status_code == 200, response.text[:500]
    assert response.headers["x-vlmserve-ignored-tools"] == ignored
    events = stream_events(response.text)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.completed"
    for event in events:
        assert_valid(event, EVENT_SCHEMAS[event["type"]])
    (request,) = engine.requests
    lowered = lower_messages(request.messages)  # as the engine renders them
    sent = [part for message in lowered for part in message.parts if part.WhichOneof("kind") == "image"]
    assert len(sent) == images
    if images:
        # The image-only view_image result: marker line in the tool turn, the image right after.
        tool_index = next(i for i, m in enumerate(lowered) if m.role == pb.ROLE_TOOL)
        assert lowered[tool_index + 1].parts[0].image.detail == pb.IMAGE_DETAIL_HIGH

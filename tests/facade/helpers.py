"""Shared helpers for the facade tests: images, schema validation, SSE parsing."""

from __future__ import annotations

import base64
import functools
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
from PIL import Image
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SPEC_PATH = Path(__file__).resolve().parents[3] / "shared" / "specs" / "openresponses-openapi.json"
_SPEC_URI = "urn:openresponses-openapi"

# Streaming event type -> its schema in the Open Responses spec.
EVENT_SCHEMAS = {
    "response.created": "ResponseCreatedStreamingEvent",
    "response.in_progress": "ResponseInProgressStreamingEvent",
    "response.completed": "ResponseCompletedStreamingEvent",
    "response.failed": "ResponseFailedStreamingEvent",
    "response.incomplete": "ResponseIncompleteStreamingEvent",
    "response.output_item.added": "ResponseOutputItemAddedStreamingEvent",
    "response.output_item.done": "ResponseOutputItemDoneStreamingEvent",
    "response.content_part.added": "ResponseContentPartAddedStreamingEvent",
    "response.content_part.done": "ResponseContentPartDoneStreamingEvent",
    "response.output_text.delta": "ResponseOutputTextDeltaStreamingEvent",
    "response.output_text.done": "ResponseOutputTextDoneStreamingEvent",
    "response.function_call_arguments.delta": "ResponseFunctionCallArgumentsDeltaStreamingEvent",
    "response.function_call_arguments.done": "ResponseFunctionCallArgumentsDoneStreamingEvent",
    "error": "ErrorStreamingEvent",
}


def png_bytes(color: tuple[int, int, int] = (255, 0, 0), size: tuple[int, int] = (16, 16)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


def png_data_url(color: tuple[int, int, int] = (255, 0, 0), size: tuple[int, int] = (16, 16)) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(color, size)).decode("ascii")


@functools.cache
def _registry() -> Registry:
    spec = json.loads(SPEC_PATH.read_text())
    registry: Registry = Registry().with_resource(
        _SPEC_URI, Resource.from_contents(spec, default_specification=DRAFT202012)
    )
    return registry


@functools.cache
def validator(schema_name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(
        {"$ref": f"{_SPEC_URI}#/components/schemas/{schema_name}"}, registry=_registry()
    )


def assert_valid(instance: Any, schema_name: str) -> None:
    errors = sorted(validator(schema_name).iter_errors(instance), key=lambda e: list(e.path))
    assert not errors, f"{schema_name}: " + "; ".join(
        f"{list(e.path)}: {e.message[:300]}" for e in errors[:5]
    )


@dataclass(frozen=True)
class SSEEvent:
    event: str | None
    data: str

    def json(self) -> Any:
        return json.loads(self.data)


def parse_sse(text: str) -> list[SSEEvent]:
    """Parse an event stream; every event must be one `event:` line (optional) and one `data:` line."""
    events: list[SSEEvent] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        fields: dict[str, list[str]] = {}
        for line in lines:
            name, _, value = line.partition(":")
            fields.setdefault(name, []).append(value.removeprefix(" "))
        assert set(fields) <= {"event", "data"}, block
        assert len(fields.get("data", [])) == 1, f"expected one data line: {block!r}"
        assert len(fields.get("event", [])) <= 1, block
        events.append(SSEEvent(fields.get("event", [None])[0], fields["data"][0]))
    return events


def stream_events(text: str) -> list[dict[str, Any]]:
    """The JSON events of a Responses stream, checked to end with `data: [DONE]`."""
    events = parse_sse(text)
    assert events and events[-1].data == "[DONE]" and events[-1].event is None, events[-1:]
    payloads = [event.json() for event in events[:-1]]
    for event, payload in zip(events[:-1], payloads, strict=True):
        assert event.event == payload["type"]
    return payloads


SEED_000_TOOL = {
    "type": "function",
    "name": "screenshot",
    "parameters": {"type": "object", "properties": {}},
}


def seed_000_input(image_url: str) -> list[dict[str, Any]]:
    """Seed 000's request: a screenshot tool whose output is text plus an image."""
    return [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Take a screenshot and tell me its dominant color."}],
        },
        {"type": "function_call", "call_id": "c1", "name": "screenshot", "arguments": "{}"},
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [
                {"type": "input_text", "text": "captured"},
                {"type": "input_image", "image_url": image_url},
            ],
        },
    ]

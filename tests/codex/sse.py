"""Read a Responses SSE stream the way a strict client would, keeping every event."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests._sse import iter_lines


@dataclass
class SseStream:
    status_code: int
    headers: httpx.Headers
    events: list[dict[str, Any]] = field(default_factory=list)
    # `event:` line names, in order, paired with events (None when a data line had none).
    names: list[str | None] = field(default_factory=list)
    done_marker: bool = False
    body: bytes = b""

    def types(self) -> list[str]:
        return [str(event.get("type")) for event in self.events]

    def terminal(self) -> dict[str, Any]:
        return self.events[-1]


def parse_sse_lines(lines: Iterable[str], stream: SseStream) -> None:
    """Fill `stream` from SSE lines; a `data:` payload must be one line of JSON (or `[DONE]`)."""
    name: str | None = None
    for line in lines:
        if line.startswith("event:"):
            name = line[len("event:") :].strip()
        elif line.startswith("data:"):
            payload = line[len("data:") :].strip()
            if payload == "[DONE]":
                stream.done_marker = True
            else:
                stream.events.append(json.loads(payload))
                stream.names.append(name)
            name = None
        elif line == "":
            name = None


def post_streaming(
    client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> SseStream:
    with client.stream("POST", url, json=body, headers=headers) as response:
        stream = SseStream(response.status_code, response.headers)
        if response.status_code != 200 or not response.headers.get("content-type", "").startswith(
            "text/event-stream"
        ):
            stream.body = response.read()
            return stream
        parse_sse_lines(iter_lines(response), stream)
    return stream

"""Shared helpers for the facade tests: images, schema validation, SSE parsing, apps served
in-process or on loopback."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from PIL import Image

from tests._openresponses import EVENT_SCHEMAS, assert_valid, validator
from vlmserve.client import AsyncEngineClient
from vlmserve.common import images as common_images
from vlmserve.facade import FacadeSettings, Limits, Store, create_app
from vlmserve.facade.http.server import FacadeServer
from vlmserve.facade.settings import Storage
from vlmserve.facade.settings.api_keys import ApiKeys

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

__all__ = ["EVENT_SCHEMAS", "assert_valid", "validator"]  # re-exported for the facade tests


def png_bytes(color: tuple[int, int, int] = (255, 0, 0), size: tuple[int, int] = (16, 16)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


def png_data_url(color: tuple[int, int, int] = (255, 0, 0), size: tuple[int, int] = (16, 16)) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(color, size)).decode("ascii")


@dataclass(frozen=True)
class SSEEvent:
    event: str | None
    data: str

    def json(self) -> Any:
        return json.loads(self.data)


def parse_sse(text: str) -> list[SSEEvent]:
    """Parse an event stream; every event must be one `event:` line (optional) and one `data:` line."""
    events: list[SSEEvent] = []
    assert "\r" not in text, f"CR on the wire: {text[:200]!r}"  # LF framing, as sent
    for block in text.split("\n\n"):
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


SCREENSHOT_TOOL = {
    "type": "function",
    "name": "screenshot",
    "parameters": {"type": "object", "properties": {}},
}


def screenshot_tool_input(image_url: str) -> list[dict[str, Any]]:
    """A screenshot tool whose output is text plus an image (the request of /work/shared/seeds/000)."""
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


def in_process(app: FastAPI, *, raise_app_exceptions: bool = True, **options: Any) -> httpx.AsyncClient:
    """An httpx client of `app` in this process (no socket, no lifespan) that sends and receives
    what any client does: nothing normalised. `async with in_process(app) as http:`. `options`
    go to httpx.AsyncClient (a `timeout`; a `base_url` where two apps are told apart)."""
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
    return httpx.AsyncClient(transport=transport, **{"base_url": "http://facade.test", **options})


@dataclass
class AppClients:
    """In-process clients of apps built on one engine client and store; `aclose` closes them all."""

    engine: AsyncEngineClient
    store: Store
    opened: list[httpx.AsyncClient] = field(default_factory=list)

    def open(self, settings: FacadeSettings) -> httpx.AsyncClient:
        app = create_app(settings, engine=self.engine, store=self.store)
        client = in_process(app)
        self.opened.append(client)
        return client

    async def aclose(self) -> None:
        for client in self.opened:
            await client.aclose()


# `client_for(max_tools=2)`: a client of an app with those settings (tests/facade/fixtures.py).
MakeClient = Callable[..., httpx.AsyncClient]


def with_fields(settings: FacadeSettings, **fields: Any) -> FacadeSettings:
    """`settings` with these `Limits` and `Storage` fields (each name belongs to one of them);
    the rest as it is."""
    limits = {name: value for name, value in fields.items() if name in Limits.model_fields}
    storage = {name: value for name, value in fields.items() if name in Storage.model_fields}
    unknown = set(fields) - set(limits) - set(storage)
    assert not unknown, f"neither a Limits nor a Storage field: {sorted(unknown)}"
    if limits:
        settings = settings.replace(limits=settings.limits.model_copy(update=limits))
    if storage:
        settings = settings.replace(storage=settings.storage.model_copy(update=storage))
    return settings


def loopback(app: Any, *, lifespan: str = "off") -> uvicorn.Config:
    """A uvicorn configuration serving `app` on a free loopback port."""
    return uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan=lifespan)


@asynccontextmanager
async def serving(config: uvicorn.Config, stop_timeout_s: float = 20) -> AsyncIterator[int]:
    """The facade's uvicorn server (http/server.py) on `config` while the block runs; yields its
    port."""
    server = FacadeServer(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()  # it failed to start: raise why
        await asyncio.sleep(0.01)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, stop_timeout_s)


def count_image_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry (its byte count) per image the translation checks (reads the header of)."""
    calls: list[int] = []
    original = common_images.inspect_image

    def counting(data: bytes, **kwargs: Any) -> Any:
        calls.append(len(data))
        return original(data, **kwargs)

    monkeypatch.setattr("vlmserve.responses._media.inspect_image", counting)
    return calls


def owner_id(key: str) -> str:
    """The owner an API key's stored responses are filed under, as the facade finds it."""
    owner = ApiKeys.from_keys([key]).owner_for_key(key)
    assert owner is not None
    return owner


async def until_done(connection: ClientConnection) -> list[dict[str, Any]]:
    """The messages of one Responses WebSocket turn, up to and with the one that ends it."""
    messages = []
    while True:
        message = json.loads(await connection.recv())
        messages.append(message)
        if message["type"] in ("response.completed", "response.incomplete", "response.failed", "error"):
            return messages

"""Slow and numerous clients, and many large bodies at once (docs/hardening.md), through uvicorn
as the CLI configures it, on loopback: trickling header connections get 408 at the header
deadline, connections past the cap get 503 at once, a trickled body gets an OpenAI-shaped 408,
and bodies in flight are bounded by bytes (503 + Retry-After beyond)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI

from tests.facade.helpers import serving as serving_on
from vlmserve.client import AsyncEngineClient
from vlmserve.facade import FacadeSettings, Limits, Store, create_app
from vlmserve.facade.cli import server_config
from vlmserve.facade.state import FacadeState


@asynccontextmanager
async def serving(app: FastAPI, settings: FacadeSettings) -> AsyncIterator[int]:
    config = server_config(app, settings.replace(host="127.0.0.1", port=0))
    config.lifespan = "off"
    config.log_level = "warning"
    async with serving_on(config) as port:
        yield port


async def read_all(reader: asyncio.StreamReader, timeout: float) -> bytes:
    """Everything the server sends until it closes the connection (or `timeout`).

    Read piece by piece, as an HTTP client does: a client still sending after the server closed
    gets a reset, and `reader.read(-1)` would then drop the answer it had already received."""
    received = bytearray()

    async def until_closed() -> None:
        try:
            while chunk := await reader.read(65536):
                received.extend(chunk)
        except ConnectionResetError:
            pass

    try:
        await asyncio.wait_for(until_closed(), timeout)
    except TimeoutError:
        return b"<still open>"
    return bytes(received)


async def trickle(port: int, stop: asyncio.Event, received: list[tuple[float, bytes]]) -> None:
    """A slowloris client: a request line, then one header line every 0.2 s, never finishing."""
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"POST /v1/responses HTTP/1.1\r\nhost: t\r\n")
        answer = asyncio.ensure_future(read_all(reader, 30))
        while not stop.is_set() and not answer.done():
            try:
                writer.write(b"x-slow: 1\r\n")
                await writer.drain()
            except ConnectionError:
                break
            await asyncio.wait({answer}, timeout=0.2)
        received.append((time.monotonic() - started, await asyncio.wait_for(answer, 5)))
    except ConnectionError:
        received.append((time.monotonic() - started, b"<reset>"))
    finally:
        writer.close()


async def test_trickling_clients_are_cut_at_the_header_deadline_and_capped(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store
) -> None:
    limited = settings.replace(limits=Limits(max_connections=40, header_timeout_s=1.0))
    app = create_app(limited, engine=engine_client, store=store)
    async with serving(app, limited) as port:
        stop = asyncio.Event()
        received: list[tuple[float, bytes]] = []
        clients = [asyncio.create_task(trickle(port, stop, received)) for _ in range(60)]
        await asyncio.wait_for(asyncio.gather(*clients), 15)
        stop.set()
        refused = [(at, reply) for at, reply in received if reply.startswith(b"HTTP/1.1 503")]
        timed_out = [(at, reply) for at, reply in received if reply.startswith(b"HTTP/1.1 408")]
        # Exactly the connections past the cap were refused, at once, with Retry-After.
        assert len(refused) == 20 and len(timed_out) == 40, [reply[:20] for _, reply in received]
        assert all(b"retry-after: 1" in reply.lower() for _, reply in refused)
        assert max(at for at, _ in refused) < 1.0
        # The rest were cut at the deadline (1 s), not left open while they kept sending.
        assert all(0.9 < at < 3.0 for at, _ in timed_out), sorted(at for at, _ in timed_out)
        # Nothing is left open, and the server serves as before.
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.get("/healthz")).status_code == 200


async def test_an_idle_connection_is_closed_without_an_answer(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store
) -> None:
    limited = settings.replace(limits=Limits(header_timeout_s=0.5))
    async with serving(create_app(limited, engine=engine_client, store=store), limited) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        started = time.monotonic()
        assert await read_all(reader, 5) == b""
        assert 0.4 < time.monotonic() - started < 3
        writer.close()


async def test_a_trickled_body_gets_a_408(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store
) -> None:
    limited = settings.replace(limits=Limits(body_timeout_s=1.0))
    async with serving(create_app(limited, engine=engine_client, store=store), limited) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/responses HTTP/1.1\r\nhost: t\r\ncontent-length: 100\r\n\r\n{")
        started = time.monotonic()
        answer = asyncio.ensure_future(read_all(reader, 10))
        while not answer.done() and time.monotonic() - started < 8:
            writer.write(b" ")
            await asyncio.wait({answer}, timeout=0.1)
        reply = await answer
        writer.close()
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), reply[:200]
        assert json.loads(body)["error"]["code"] == "request_timeout"
        # After the 1 s body deadline, and well before the client stopped trickling (8 s): the
        # wide upper bound is for loaded machines, where the answer can take seconds to arrive.
        assert 0.9 < time.monotonic() - started < 7.5


async def test_bodies_in_flight_are_bounded_by_bytes(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store
) -> None:
    limited = settings.replace(limits=Limits(max_request_bytes=1000, max_body_bytes_in_flight=1500))
    app = create_app(limited, engine=engine_client, store=store)
    budget = app.state.facade.body_budget
    assert isinstance(app.state.facade, FacadeState)
    body = json.dumps({"input": "x" * 900}).encode()
    assert len(body) < 1000
    async with serving(app, limited) as port, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        # A client declares 1000 bytes and sends 990 of them: what arrived is held (never
        # what is declared, tests/hardening/test_body_budget.py).
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/responses HTTP/1.1\r\nhost: t\r\ncontent-length: 1000\r\n\r\n{" + b" " * 989)
        await writer.drain()
        await wait_for(lambda: budget.in_flight == 990)
        refused = await http.post("/v1/responses", content=body, headers={"content-type": "application/json"})
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "server_busy"
        # What still fits goes through; so do the other body-reading routes' refusals.
        small = await http.post("/v1/responses", json={"input": "hi"})
        assert small.status_code == 200
        chunked = await http.post("/v1/conversations", content=_chunks(body))
        assert chunked.status_code == 503
        # The slow client leaves: its hold is given back, and a full-size body fits again.
        writer.close()
        await wait_for(lambda: budget.in_flight == 0)
        assert (await http.post("/v1/responses", content=body)).status_code == 200
        assert budget.peak <= 1500


async def _chunks(body: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(body), 100):
        yield body[start : start + 100]


async def wait_for(condition: Callable[[], Any], timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.01)

"""The facade's uvicorn server (http/server.py): idle, its main loop wakes once a second, not ten
times; the date header is still there and current; a stop (`should_exit`, a stop signal) ends it
at once, not at the next tick, and reaches its event streams (delivery.EventStream) without
sse-starlette's polling watcher."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator, Iterator
from email.utils import parsedate_to_datetime

import anyio
import httpx
import pytest
from fastapi import FastAPI
from sse_starlette import EventSourceResponse
from sse_starlette.sse import AppStatus

from tests.facade.helpers import loopback
from vlmserve.facade.http.server import TICK_S, FacadeServer
from vlmserve.facade.responses.delivery import EventStream


@pytest.fixture(autouse=True)
def _no_process_wide_stop() -> Iterator[None]:
    """A stop signal here goes through sse-starlette's patch of uvicorn's handle_exit, which sets
    the process-global `AppStatus.should_exit` that nothing resets: every stream served later in
    this test process would end at once (empty 200 bodies in other files' tests)."""
    yield
    AppStatus.should_exit = False


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/ping")
    async def ping() -> dict[str, bool]:
        return {"ok": True}

    return app


async def _started(server: FacadeServer) -> asyncio.Task[None]:
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    return task


async def test_idle_the_main_loop_ticks_once_a_second() -> None:
    server = FacadeServer(loopback(_app()))
    ticks: list[float] = []
    on_tick = server.on_tick

    async def counted(counter: int) -> bool:
        ticks.append(time.monotonic())
        return await on_tick(counter)

    server.on_tick = counted  # type: ignore[method-assign]
    task = await _started(server)
    await asyncio.sleep(2.5)
    server.should_exit = True
    await asyncio.wait_for(task, 10)
    # uvicorn's own loop: ~25 ticks in 2.5 s. Ours: the first, about two more, and the exit's.
    assert 2 <= len(ticks) <= 5, ticks


async def test_the_date_header_is_there_and_current() -> None:
    server = FacadeServer(loopback(_app()))
    task = await _started(server)
    try:
        port = server.servers[0].sockets[0].getsockname()[1]
        await asyncio.sleep(TICK_S * 1.5)  # past a tick: the header renewed by ours
        async with httpx.AsyncClient() as client:
            answer = await client.get(f"http://127.0.0.1:{port}/ping")
        sent = parsedate_to_datetime(answer.headers["date"]).timestamp()
        assert abs(sent - time.time()) <= TICK_S + 1
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


async def test_should_exit_stops_it_at_once() -> None:
    server = FacadeServer(loopback(_app()))
    task = await _started(server)
    await asyncio.sleep(0.05)  # inside a tick's wait
    stopped_at = time.monotonic()
    server.should_exit = True
    await asyncio.wait_for(task, 10)
    assert time.monotonic() - stopped_at < TICK_S / 2


async def test_a_stop_signal_stops_it_at_once() -> None:
    server = FacadeServer(loopback(_app()))
    task = await _started(server)
    await asyncio.sleep(0.05)
    stopped_at = time.monotonic()
    # What uvicorn's signal handler calls (sse-starlette wraps it to drain its streams too).
    server.handle_exit(signal.SIGTERM, None)
    # uvicorn raises the signals it caught again once it has stopped: not in the test process.
    server._captured_signals.clear()
    await asyncio.wait_for(task, 10)
    assert time.monotonic() - stopped_at < TICK_S / 2


async def test_a_stream_waits_on_the_servers_stop_not_on_a_polling_watcher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # sse-starlette's way (a shared task polling every 0.5 s), counted: the stream must not take
    # it. (Its watcher task itself may exist already: an earlier test's stream on this loop.)
    polled: list[bool] = []
    polling = EventSourceResponse._listen_for_exit_signal

    async def counted() -> None:
        polled.append(True)
        await polling()

    monkeypatch.setattr(EventSourceResponse, "_listen_for_exit_signal", staticmethod(counted))
    app = FastAPI()
    shutdown = anyio.Event()

    async def frames() -> AsyncIterator[bytes]:
        yield b"data: first\n\n"
        await shutdown.wait()  # set by the stream when the server stops
        yield b"data: bye\n\n"

    @app.get("/events")
    async def events() -> EventStream:
        return EventStream(frames(), sep="\n", shutdown_event=shutdown, shutdown_grace_period=5)

    server = FacadeServer(loopback(app))
    task = await _started(server)
    port = server.servers[0].sockets[0].getsockname()[1]
    received: list[str] = []
    async with (
        httpx.AsyncClient() as client,
        client.stream("GET", f"http://127.0.0.1:{port}/events") as answer,
    ):
        lines = answer.aiter_lines()
        while not received:
            line = await anext(lines)
            if line.startswith("data: "):
                received.append(line)
        assert polled == []
        stopped_at = time.monotonic()
        server.should_exit = True
        async for line in lines:
            if line.startswith("data: "):
                received.append(line)
        assert time.monotonic() - stopped_at < 0.4
    assert received == ["data: first", "data: bye"]
    await asyncio.wait_for(task, 10)


async def test_a_server_of_another_loop_found_by_the_signal_handler_is_not_waited_on() -> None:
    """The streams find their server through the SIGTERM handler. In a process that also ran a
    server in another loop (tests; an app served in a thread of its own, as schemathesis does)
    that handler can be that server's: waiting on its stop raised "bound to a different event
    loop" inside the stream (a 500). The stream then waits as sse-starlette does."""
    other = FacadeServer(loopback(_app()))

    async def waited_on_once() -> None:  # binds the server's stop event to that loop
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(other.exit_requested(), 0.01)

    await asyncio.to_thread(asyncio.run, waited_on_once())
    previous = signal.signal(signal.SIGTERM, other.handle_exit)
    try:
        assert not other.serves_in(asyncio.get_running_loop())
        with anyio.move_on_after(0.3) as waited:
            await EventStream._listen_for_exit_signal()
        assert waited.cancel_called  # still waiting for a stop, no error
    finally:
        signal.signal(signal.SIGTERM, previous)

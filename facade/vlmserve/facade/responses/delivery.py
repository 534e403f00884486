"""How a generation reaches its HTTP client, whatever the route: streamed or collected into one
answer (`respond`, the create skeleton of Responses, chat completions and Messages), cut off
cleanly at server shutdown, or abandoned (with its engine call) when the client leaves."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
from fastapi import Request, Response
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.sse import AppStatus
from starlette.background import BackgroundTask
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vlmserve.facade.http.api_keys import owner_of
from vlmserve.facade.http.errors import APIError
from vlmserve.facade.http.server import FacadeServer
from vlmserve.facade.responses.events import Event
from vlmserve.facade.responses.preparation import ResponsesService, Translation
from vlmserve.facade.responses.running import Generation, unclaimed_generations
from vlmserve.facade.settings import FacadeSettings
from vlmserve.responses import CreateRequest, ErrorEvent
from vlmserve.server.logs import bind_response

T = TypeVar("T")
# What splits an SSE field into lines (sse-starlette's ServerSentEvent._LINE_SEP_EXPR).
_BREAKS = re.compile(r"\r\n|\r|\n")

IGNORED_TOOLS_HEADER = "x-vlmserve-ignored-tools"
# Status for a request whose client left before the answer (nginx's convention; never seen by it).
CLIENT_CLOSED_REQUEST = 499
# Server shutdown (SIGTERM): a stream still running `shutdown_grace_s` after it began is
# cancelled (engine Abort, waiting this long), so it ends with its final events; sse-starlette
# cuts it off only STREAM_CUTOFF_AFTER_GRACE_S after the grace. The CLI gives uvicorn longer.
STREAM_CANCEL_WAIT_S = 3.0
STREAM_CUTOFF_AFTER_GRACE_S = 8.0
# Every line of our event streams ends in LF. sse-starlette's default is CR LF, and an event
# built without `sep` uses that default whatever the response's `sep`: strict parsers (the
# official Open Responses suite's) then see no events at all.
SSE_SEPARATOR = "\n"


class EventStream(EventSourceResponse):
    """sse-starlette's response, its sends without a timeout scope when there is no send timeout
    (ours: a slow client is bounded by the connection's limits, not per send). Its base opens an
    anyio cancel scope with a timer around every send, `move_on_after(None)` included: per
    streamed token that was about a tenth of the facade's CPU (bench/stack_cpu.py)."""

    @staticmethod
    async def _listen_for_exit_signal() -> None:
        """Until the server stops: under the facade's own server (http/server.py), its stop
        itself; sse-starlette's watcher, which it replaces, polls for the stop every 0.5 s for
        the life of the process once a stream has run (two wake-ups a second, idle or not).
        The server is found as sse-starlette finds it: the SIGTERM handler uvicorn installed is
        its bound method; used only while it serves in this stream's loop (`serves_in`)."""
        server = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
        if not isinstance(server, FacadeServer) or not server.serves_in(asyncio.get_running_loop()):
            await EventSourceResponse._listen_for_exit_signal()
        elif not AppStatus.should_exit:
            await server.exit_requested()

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        if self.send_timeout is not None:
            await super()._send_with_timeout(send, message)
            return
        try:
            await send(message)
        except BaseException:
            # As the base does: the response then never claims a clean end.
            self._send_interrupted = True
            raise


@dataclass(frozen=True)
class Wire:
    """How one API writes a generation: the route's part of `respond`."""

    # The frames one event becomes on the stream (often none).
    frames: Callable[[Event], Iterable[ServerSentEvent]]
    # The frames after the last event (a finish chunk, `[DONE]`).
    closing: Callable[[], Iterable[ServerSentEvent]]
    # The plain answer, from the collected resource.
    answer: Callable[[dict[str, Any]], dict[str, Any]]
    # The stream ends at an `error` event (chat, Messages) instead of going on to `response.failed`.
    ends_at_error: bool = False
    # Errors of opening and collecting, named in this API's terms (its own field names).
    errors: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext


async def respond(
    request: Request,
    generation: Generation,
    wire: Wire,
    *,
    stream: bool,
    settings: FacadeSettings,
    release: Callable[[], None],
    headers: Mapping[str, str] | None = None,
) -> Response:
    """A prepared generation as the route's answer: an event stream, or the collected answer.

    Either way the engine call starts before anything is stored: an engine that refuses the
    request at once (queue full, down, bad argument) is a plain HTTP error, and leaves no
    response whose id the client never saw. `release` (the body's hold) runs once it is over.
    """
    finish = finisher(generation, release)
    first_message_s = settings.timeouts.stream_first_message
    if not stream:
        try:
            with wire.errors():
                resource = await unless_disconnected(request, collect(generation, first_message_s))
        finally:
            await finish()
        if resource is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        return JSONResponse(wire.answer(resource), headers=headers)
    try:
        with wire.errors():
            await generation.open(first_message_s)
    except BaseException:
        await finish()
        raise
    # sse-starlette sets `shutdown` when the server begins to shut down; without an event and a
    # grace period it would cut every stream off at once.
    shutdown = anyio.Event()
    grace_s = settings.shutdown_grace_s
    # The background task runs after the stream, also when the client left before it began.
    return EventStream(
        _frames(generation, wire, shutdown, grace_s),
        headers=headers,
        sep=SSE_SEPARATOR,
        background=BackgroundTask(finish),
        shutdown_event=shutdown,
        shutdown_grace_period=grace_s + STREAM_CUTOFF_AFTER_GRACE_S,
    )


def finisher(generation: Generation, release: Callable[[], None]) -> Callable[[], Awaitable[None]]:
    """What ends a request's part in a generation: abandon it (if still running), then `release`.
    Made by whatever takes a prepared generation over, which claims it."""
    generation.claim()

    async def finish() -> None:
        try:
            await generation.abandon()
        finally:
            release()

    return finish


class AbandonUnclaimed:
    """ASGI middleware: a generation admitted while serving a request (or a WebSocket
    connection) that nothing took over (`finisher`) is abandoned when the request ends: its
    key's place, its engine slot and everything it holds are given back, whatever failed after
    the admission (issue 39: a 500 there kept all of it, and 32 of them locked the key out)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        with unclaimed_generations() as unclaimed:
            try:
                await self.app(scope, receive, send)
            finally:
                await asyncio.shield(_abandon_all(unclaimed))


async def _abandon_all(unclaimed: dict[str, Generation]) -> None:
    # A frame of its own: an exception passing through the middleware keeps no generation.
    while unclaimed:
        await unclaimed.popitem()[1].abandon_unclaimed()


async def _frames(
    generation: Generation, wire: Wire, shutdown: anyio.Event, grace_s: float
) -> AsyncIterator[bytes]:
    drain = asyncio.ensure_future(cancel_after_shutdown(generation, shutdown, grace_s))
    try:
        async for event in generation.events():
            for frame in wire.frames(event):
                yield encoded(frame)
            if wire.ends_at_error and isinstance(event, ErrorEvent):
                return
        for frame in wire.closing():
            yield encoded(frame)
    finally:
        drain.cancel()


def ignored_tools_header(generation: Generation) -> dict[str, str]:
    ignored = sorted(set(generation.translated.tools.ignored))
    return {IGNORED_TOOLS_HEADER: ",".join(ignored)} if ignored else {}


def sse_event(data: str, event: str | None = None) -> ServerSentEvent:
    return ServerSentEvent(data=data, event=event, sep=SSE_SEPARATOR)


def encoded(frame: ServerSentEvent) -> bytes:
    """`frame.encode()`'s bytes, built directly for the frames we send (an event name and one
    line of data, LF-separated): the general encoder's StringIO and line splitting cost more
    than the JSON of a token's event. Anything else goes through the general encoder."""
    data, name = frame.data, frame.event
    if (
        type(data) is str
        and frame.id is None
        and frame.retry is None
        and frame.comment is None
        and frame._sep == SSE_SEPARATOR
        and not _BREAKS.search(data)
        and (name is None or not _BREAKS.search(name))
    ):
        if name is None:
            return f"data: {data}\n\n".encode()
        return f"event: {name}\ndata: {data}\n\n".encode()
    return frame.encode()


async def cancel_after_shutdown(generation: Generation, shutdown: anyio.Event, grace_s: float) -> None:
    """On server shutdown, let the stream run for `grace_s`, then stop it cleanly."""
    await shutdown.wait()
    await asyncio.sleep(grace_s)
    await generation.cancel(STREAM_CANCEL_WAIT_S)


async def collect(generation: Generation, first_message_s: float) -> dict[str, Any]:
    await generation.open(first_message_s)
    async for _ in generation.events(raise_errors=True):
        pass
    return generation.builder.snapshot().to_json()


async def prepare_unless_disconnected(
    request: Request,
    service: ResponsesService,
    create: CreateRequest,
    *,
    release: Callable[[], None],
    translation: Translation | None = None,
) -> Generation:
    """`prepare`, stopped when the client goes away (its PDFs' worker processes are killed).
    `release` gives back what the request holds (its body's bytes): run when the generation ends
    (`finisher`), or when the request ends with the generation unclaimed."""
    generation = await unless_disconnected(
        request, service.prepare(create, owner=owner_of(request), release=release, translation=translation)
    )
    if generation is None:
        raise client_closed()
    # `prepare` ran in a task of its own: its context (the bound response id) ended with it, and
    # this request's remaining log lines (the access line too) must still name the response.
    bind_response(generation.response_id)
    return generation


def client_closed() -> APIError:
    # Never seen by the client; the status says what happened in the access log.
    return APIError(CLIENT_CLOSED_REQUEST, "The client closed the request.", code="client_closed_request")


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """Run `work`; if the client disconnects first, cancel it (and so the engine call): None."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        watcher.cancel()
    if task.cancelled():
        return None
    return task.result()


async def _disconnected(request: Request) -> None:
    # The body has been read, so the next ASGI message can only be the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass

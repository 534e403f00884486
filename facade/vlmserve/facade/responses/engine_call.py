"""One engine call of a response: opened under a fair slot, read with heartbeats, cancelled in
three stages, closed. It knows the engine and nothing of the store.

Cancelling the task that reads `messages()` (a client that disconnects) cancels the gRPC call,
so the engine stops. `cancel()` (the cancel endpoint, shutdown) asks the engine to abort; an
engine that ignores the abort has its call closed from our side, and a reader that stopped
reading has its task cancelled. Either way the reader sees `CallStopped` and ends the response
as stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from vlmserve.client import AsyncEngineClient, EngineError, NotFoundError
from vlmserve.common.wire_encode import OutgoingRequest
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade.http.errors import APIError, PartPath, from_engine_error
from vlmserve.facade.responses.key_admission import EngineSlots

logger = logging.getLogger("vlmserve.facade")


class CallStopped(Exception):
    """The call was stopped from our side: closed after Abort went unheeded, or cancelled by the
    engine because we asked it to."""


class _Handoff:
    """One message (or how the read ended) handed from a call's pump to its reader."""

    def __init__(self) -> None:
        self.ready = False
        self._message: pb.GenerateResponse | None = None
        self._error: BaseException | None = None
        # The reader's, while it waits for a message (or a heartbeat, or the close).
        self.waiter: asyncio.Future[None] | None = None
        # The pump's, while it waits for the reader to take what it holds.
        self._taken: asyncio.Future[None] | None = None
        # The pump's, after the last message: until the reader asks for more.
        self._asked: asyncio.Future[None] | None = None

    def wake(self, _: object = None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def put(self, message: pb.GenerateResponse | None, error: BaseException | None = None) -> None:
        await self.taken()
        self._message, self._error, self.ready = message, error, True
        self.wake()

    async def taken(self) -> None:
        """Until the reader took what was put (at once if it has)."""
        while self.ready:
            self._taken = asyncio.get_running_loop().create_future()
            await self._taken

    async def asked(self) -> None:
        """Until the reader comes back for more."""
        self._asked = asyncio.get_running_loop().create_future()
        await self._asked

    def ask(self) -> None:
        if self._asked is not None and not self._asked.done():
            self._asked.set_result(None)

    def take(self) -> tuple[pb.GenerateResponse | None, BaseException | None]:
        taken = self._message, self._error
        self._message, self._error, self.ready = None, None, False
        if self._taken is not None and not self._taken.done():
            self._taken.set_result(None)
        return taken


@dataclass
class EngineCall:
    # Sent with the texts it holds apart (`TranslatedRequest.outgoing`).
    request: OutgoingRequest
    engine: AsyncEngineClient
    timeout_s: float
    # A `None` message from `messages()` whenever this passes without one from the engine.
    heartbeat_s: float | None = None
    # For the engine's errors as HTTP errors (from_engine_error).
    context_length: int | None = None
    # The input's parts as the client wrote them, for the engine's errors (from_engine_error).
    part_path: PartPath | None = None
    retry_after_s: int = 1
    # This facade's engine calls, handed out fairly by owner (key_admission.py); None: unbounded.
    slots: EngineSlots | None = None
    owner: str = ""
    # When the engine says the request's model is not served there (restarted on another
    # model): the model id it serves now, under which the request is sent once more (or the
    # APIError that refuses it); None: no retry.
    refresh_model: Callable[[], Awaitable[str]] | None = None
    # Set by `close()`: the call is over (and, as its reader closes it last, the response too).
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    # perf_counter times (metrics): made, and the first output chunk from the engine.
    created_at: float = field(default_factory=time.perf_counter)
    first_output_at: float | None = None
    _slot_held: bool = False
    _stream: AsyncIterator[pb.GenerateResponse] | None = None
    _first: asyncio.Future[pb.GenerateResponse] | None = None
    # The task that reads the messages (the last stage of `cancel()` cancels it).
    _reader: asyncio.Task[Any] | None = None
    _cancel_requested: bool = False
    # Set when the engine ignored Abort (or from `close_from_here`): the reader stops.
    _close_call: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def start(self) -> None:
        """Start the call (if not started): its first message is read in the background."""
        if self._first is None:
            self._first = asyncio.ensure_future(self._start_call())

    async def open(self, wait_s: float) -> None:
        """Start the call and wait up to `wait_s` for its first message.

        An engine error within that window raises APIError, and the call is closed (the route
        answers with a plain HTTP error instead of a stream); a slower start is fine, the
        stream simply begins later.
        """
        self.start()
        assert self._first is not None
        done, _ = await asyncio.wait({self._first}, timeout=wait_s)
        error = self._first.exception() if done else None
        if isinstance(error, EngineError | APIError):
            self._release()
            raise self.api_error(error) if isinstance(error, EngineError) else error

    def read_here(self) -> None:
        """The current task is this call's reader: `cancel()` cancels it if it stops reading."""
        self._reader = asyncio.current_task()

    async def messages(self) -> AsyncIterator[pb.GenerateResponse | None]:
        """The engine's messages; None whenever `heartbeat_s` passes without one. The engine's
        errors raise APIError, a call stopped from our side CallStopped."""
        self.start()
        loop = asyncio.get_running_loop()
        handoff = _Handoff()
        # The call's messages are read by a task of their own (`_pump`), so this reader can wait
        # with a heartbeat and a close without cancelling the read (which would cancel the
        # call). The pump hands each message over itself and starts the next read at once: per
        # message one loop turn wakes the pump (gRPC's), one the reader. A read task per
        # message, woken through its done callbacks, took five (bench/stack_cpu.py).
        pump = asyncio.ensure_future(self._pump(handoff))
        close_call = asyncio.ensure_future(self._close_call.wait())
        close_call.add_done_callback(handoff.wake)
        # The heartbeat timer is armed once and re-armed only when it fires before the current
        # wait's deadline (a message came meanwhile), not per message.
        timer: asyncio.TimerHandle | None = None

        def timer_fired() -> None:
            nonlocal timer
            timer = None
            handoff.wake()

        try:
            while True:
                handoff.ask()
                deadline = None if self.heartbeat_s is None else loop.time() + self.heartbeat_s
                while not (handoff.ready or close_call.done()):
                    if deadline is not None and loop.time() >= deadline:
                        break
                    if deadline is not None and timer is None:
                        timer = loop.call_at(deadline, timer_fired)
                    handoff.waiter = loop.create_future()
                    await handoff.waiter
                # Checked first: an engine that ignores Abort may keep messages coming forever.
                if close_call.done():
                    raise CallStopped
                if not handoff.ready:
                    yield None
                    continue
                message, error = handoff.take()
                if error is not None:
                    if isinstance(error, StopAsyncIteration):
                        return
                    if isinstance(error, EngineError):
                        if self._cancel_requested and error.code == grpc.StatusCode.CANCELLED:
                            raise CallStopped from None
                        raise self.api_error(error) from None
                    raise error
                assert message is not None
                if self.first_output_at is None and message.WhichOneof("event") == "chunk":
                    self.first_output_at = time.perf_counter()
                yield message
        finally:
            if timer is not None:
                timer.cancel()
            close_call.cancel()
            # Nothing cancels what the pump waits for but this: a consumer that stops (or is
            # cancelled) must not leave the read, and so the engine call, running.
            if not pump.done():
                pump.cancel()
                with contextlib.suppress(BaseException):
                    await pump

    async def _pump(self, handoff: _Handoff) -> None:
        """Read the call's messages into `handoff`: the next read starts as soon as a message is
        handed over, and its message waits there until the reader took the one before (at most
        two messages ahead of the reader: one handed over, one read)."""
        assert self._first is not None
        try:
            message = await self._first
            while True:
                await handoff.put(message)
                if message.WhichOneof("event") == "complete":
                    # The last message: a read started now and cut short by the reader's end
                    # would cancel a call that ended well. Read on only when asked.
                    await handoff.asked()
                assert self._stream is not None  # the first message came from it
                message = await anext(self._stream)
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # StopAsyncIteration included: the reader ends there
            await handoff.put(None, error)

    async def cancel(self, wait_s: float) -> None:
        """Ask the engine to stop this call; wait up to `wait_s` (a stage) for it to end."""
        self._cancel_requested = True
        found = False
        with contextlib.suppress(EngineError):
            found = await self.engine.abort(self.request_id)
        if found:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ended.wait(), wait_s)
        if self.ended.is_set():
            return
        # The engine did not stop it, or does not know it (not arrived yet, or another engine
        # behind a balancer got the Abort): close the call from our side, which cancels the job
        # wherever it is. The reader notices and ends the response as stopped.
        logger.log(
            logging.WARNING if found else logging.INFO,
            "response %s: abort found=%s, closing the call",
            self.request_id,
            found,
        )
        self._close_call.set()
        if self._reader is None:
            return  # Not being read yet: the reader stops as soon as it starts.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.ended.wait(), wait_s)
        if not self.ended.is_set() and self._reader is not None:
            # Nobody reads the messages (a client that stopped reading): cut the reader too.
            logger.warning("response %s: events not consumed, cancelling their task", self.request_id)
            self._reader.cancel()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ended.wait(), wait_s)

    def close_from_here(self) -> None:
        """Stop without waiting: the reader closes the call and sees CallStopped."""
        self._close_call.set()

    async def close(self) -> None:
        """Close the call (whatever its state), give its slot back, and mark it ended."""
        if self._first is not None and not self._first.done():
            self._first.cancel()
            with contextlib.suppress(BaseException):
                await self._first
        aclose = getattr(self._stream, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(BaseException):
                await aclose()
        self._release()

    def api_error(self, error: EngineError) -> APIError:
        return from_engine_error(
            error,
            context_length=self.context_length,
            retry_after_s=self.retry_after_s,
            part_path=self.part_path,
        )

    # ---- internals ---------------------------------------------------------------------------

    async def _start_call(self) -> pb.GenerateResponse:
        """The call's first message, once this facade has a slot for it (waiting is heartbeats
        for a stream, `queued` for a background response)."""
        if self.slots is not None and not self._slot_held:
            await self.slots.acquire(self.owner)
            self._slot_held = True
        self._stream = self.engine.generate(self.request, timeout=self.timeout_s)
        try:
            return await anext(self._stream)
        except NotFoundError as error:
            refresh, self.refresh_model = self.refresh_model, None
            if error.field != "model" or refresh is None:
                raise
            # Its model info was cached before the engine changed models: asked again, once.
            self.request.model = await refresh()
            self._stream = self.engine.generate(self.request, timeout=self.timeout_s)
            return await anext(self._stream)

    def _release(self) -> None:
        if self._slot_held and self.slots is not None:
            self._slot_held = False
            self.slots.release(self.owner)
        self.ended.set()

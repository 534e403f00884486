"""One response being generated: the engine call, its events, and what gets stored.

A `Generation` owns the gRPC call. Cancelling the task that iterates `events()` (a client that
disconnects) cancels the call, so the engine stops; `cancel()` (the cancel endpoint) asks the
engine to abort, and the generation ends with status `cancelled`. An engine that ignores the
abort has its call closed from our side, and the events still end the normal way.

Stored responses: nothing is stored until the response has started (`open()` returned), so a
request the engine refuses at once leaves no stored response whose id the client never saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from vlmserve.client import AsyncEngineClient, EngineError
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade.http.errors import APIError, from_engine_error
from vlmserve.facade.responses.events import Event, ResponseEvents
from vlmserve.facade.responses.key_admission import EngineSlots
from vlmserve.facade.store.disk_space import is_out_of_space, out_of_space
from vlmserve.facade.store.protocol import StorageQuotaExceededError, Store, StoredItem
from vlmserve.facade.store.quotas import quota_exceeded
from vlmserve.responses import ResponseResource, TranslatedRequest

logger = logging.getLogger("vlmserve.facade")


class _CallClosed(Exception):
    """`cancel()` closed the engine call because the engine did not end it after Abort."""


@dataclass
class Generation:
    response_id: str
    translated: TranslatedRequest
    request: pb.GenerateRequest
    input_items: list[StoredItem]
    resource: ResponseResource
    engine: AsyncEngineClient
    store: Store
    timeout_s: float
    heartbeat_s: float | None = None
    context_length: int | None = None
    retry_after_s: int = 1
    conversation_id: str | None = None
    owner: str = ""
    on_finish: Callable[[Generation], None] | None = None
    # Background responses: every event but the last goes through this before it is sent (it
    # stores them); the last ones are stored with the final state (`finish_response(events=)`).
    record: Callable[[Sequence[Event]], Awaitable[None]] | None = None
    # The owner's storage quota, checked atomically with the first write.
    max_stored_bytes: int | None = None
    # This facade's engine calls, handed out fairly by owner (key_admission.py); None: unbounded.
    slots: EngineSlots | None = None
    _slot_held: bool = False
    builder: ResponseEvents = field(init=False)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    _stream: AsyncIterator[pb.GenerateResponse] | None = None
    _first: asyncio.Future[pb.GenerateResponse] | None = None
    _task: asyncio.Task[Any] | None = None
    _cancel_requested: bool = False
    # Set by `stop()`: the response ends `failed` with this error instead of `cancelled`.
    _stop_error: APIError | None = None
    _store_refused: bool = False
    # Set by `cancel()` when the engine ignored Abort: the reader stops and closes the call.
    _close_call: asyncio.Event = field(default_factory=asyncio.Event)
    # The first write of the stored response, and a final write that had to wait for it.
    _stored: asyncio.Future[None] | None = None
    _final_write: asyncio.Future[None] | None = None
    # perf_counter times (metrics): built, and the first output chunk from the engine.
    created_at: float = field(default_factory=time.perf_counter)
    first_output_at: float | None = None
    # The engine's final result, once it came (what only the engine knows: the stop sequence).
    result: pb.GenerateResult | None = None

    def __post_init__(self) -> None:
        self.builder = ResponseEvents(self.resource, offered_tools=self.translated.offered_tools)

    @property
    def store_enabled(self) -> bool:
        return self.translated.store and not self._store_refused

    async def open(self, wait_s: float) -> None:
        """Start the engine call and wait up to `wait_s` for its first message.

        An engine error within that window raises (the route answers with a plain HTTP error
        instead of a stream); a slower start is fine, the stream simply begins later.
        """
        self._first = asyncio.ensure_future(self._start_call())
        done, _ = await asyncio.wait({self._first}, timeout=wait_s)
        if done and isinstance(self._first.exception(), EngineError):
            error = self._first.exception()
            assert isinstance(error, EngineError)
            self._finished()
            raise self._api_error(error)

    async def events(self, *, raise_errors: bool = False) -> AsyncIterator[Event]:
        """All events of the response. With `raise_errors`, an engine failure raises APIError
        (non-streaming); otherwise it becomes an `error` event and `response.failed`."""
        self._task = asyncio.current_task()
        builder = self.builder
        try:
            if self._first is None and self._stream is None:
                self._first = asyncio.ensure_future(self._start_call())
            refused = None
            if self.store_enabled and self._stored is None:
                refused = await self._store_started()
            for event in await self._recorded(builder.start()):
                yield event
            if refused is not None:
                # The owner's quota was taken meanwhile (a check passed, then another request of the
                # key stored first, maybe on another facade): the response fails, nothing stored.
                failed = builder.fail(refused)
                if raise_errors:
                    raise refused
                await self._persist_final(failed)
                for event in failed:
                    yield event
                return
            # The events that end the response. They go out only after the final write: a client
            # that has read `response.completed` must find the response (and its conversation
            # items) stored, even if this process dies the next moment.
            final: list[Event] = []
            try:
                async for message in self._messages():
                    if message is None:
                        for event in await self._recorded(builder.heartbeat()):
                            yield event
                    elif message.WhichOneof("event") == "chunk":
                        if self.first_output_at is None:
                            self.first_output_at = time.perf_counter()
                        for event in await self._recorded(builder.chunk(message.chunk)):
                            yield event
                    elif message.WhichOneof("event") == "complete":
                        self.result = message.complete
                        stopped = message.complete.finish_reason == pb.FINISH_REASON_CANCELLED
                        if stopped and self._stop_error is not None:
                            final = builder.fail(self._stop_error)
                        else:
                            final = builder.complete(message.complete)
                        break
                if not builder.finished:
                    raise APIError(
                        502, "The engine ended the response without a result.", code="engine_error"
                    )
            except (EngineError, APIError, _CallClosed) as failure:
                if isinstance(failure, _CallClosed) or (
                    isinstance(failure, EngineError)
                    and self._cancel_requested
                    and (failure.code == grpc.StatusCode.CANCELLED)
                ):
                    final = self._stopped()
                else:
                    api_error = failure if isinstance(failure, APIError) else self._api_error(failure)
                    final = builder.fail(api_error)
                    if raise_errors:
                        await self._persist_final(final)
                        raise api_error from None
            await self._persist_final(final)
            for event in final:
                yield event
        except (asyncio.CancelledError, GeneratorExit):
            # The client went away: the engine call is cancelled with this task. Record the end
            # synchronously; an await here would be cancelled again.
            if not builder.finished:
                self._persist_final_after_start(self._stopped())
            raise
        finally:
            await self._close_stream()
            self._finished()

    async def cancel(self, wait_s: float) -> None:
        """Ask the engine to stop this generation; wait up to `wait_s` for it to end."""
        self._cancel_requested = True
        found = False
        with contextlib.suppress(EngineError):
            found = await self.engine.abort(self.request.request_id)
        if found:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.done.wait(), wait_s)
        if self.done.is_set():
            return
        # The engine did not stop it, or does not know it (not arrived yet, or another engine
        # behind a balancer got the Abort): close the call from our side, which cancels the job
        # wherever it is. The reader notices and ends the response as cancelled, final events
        # and all.
        logger.log(
            logging.WARNING if found else logging.INFO,
            "response %s: abort found=%s, closing the call",
            self.response_id,
            found,
        )
        self._close_call.set()
        if self._task is None:
            return  # Not being read yet: the reader ends it as cancelled as soon as it starts.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.done.wait(), wait_s)
        if not self.done.is_set() and self._task is not None:
            # Nobody reads the events (a client that stopped reading): cut the consumer too.
            logger.warning("response %s: events not consumed, cancelling their task", self.response_id)
            self._task.cancel()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.done.wait(), wait_s)

    async def stop(self, error: APIError, wait_s: float) -> None:
        """`cancel()`, but the response ends `failed` with `error` (server shutdown)."""
        self._stop_error = error
        await self.cancel(wait_s)

    def stop_now(self, error: APIError | None = None) -> None:
        """End the response from here without waiting: the reader closes the engine call and
        ends it `failed` with `error`, or `cancelled` without one."""
        self._stop_error = error
        self._close_call.set()

    async def abandon(self) -> None:
        """End a generation that was never (or not fully) iterated: close its engine call."""
        if not self.done.is_set():
            await self._close_stream()
            self._finished()
        if self._final_write is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._final_write)

    # ---- internals ---------------------------------------------------------------------------

    async def _start_call(self) -> pb.GenerateResponse:
        """The engine call's first message, once this facade has a slot for it (waiting is
        heartbeats for a stream, `queued` for a background response)."""
        if self.slots is not None and not self._slot_held:
            await self.slots.acquire(self.owner)
            self._slot_held = True
        self._stream = self.engine.generate(self.request, timeout=self.timeout_s)
        return await anext(self._stream)

    async def _messages(self) -> AsyncIterator[pb.GenerateResponse | None]:
        """The engine's messages; None whenever `heartbeat_s` passes without one."""
        pending: asyncio.Future[pb.GenerateResponse] | None = self._first
        close_call = asyncio.ensure_future(self._close_call.wait())
        try:
            while True:
                if pending is None:
                    assert self._stream is not None  # the first message came from it
                    pending = asyncio.ensure_future(anext(self._stream))
                waiting: set[asyncio.Future[Any]] = {pending, close_call}
                await asyncio.wait(waiting, timeout=self.heartbeat_s, return_when=asyncio.FIRST_COMPLETED)
                # Checked first: an engine that ignores Abort may keep messages coming forever.
                if close_call.done():
                    raise _CallClosed
                if not pending.done():
                    yield None
                    continue
                try:
                    message = pending.result()
                except StopAsyncIteration:
                    return
                pending = None
                yield message
        finally:
            close_call.cancel()
            # asyncio.wait does not cancel what it waits for: a consumer that stops (or is
            # cancelled) must not leave the read, and so the engine call, running.
            if pending is not None and not pending.done():
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending

    def _stopped(self) -> list[Event]:
        """The final events of a response stopped from our side."""
        if self._stop_error is not None:
            return self.builder.fail(self._stop_error)
        return self.builder.cancel()

    async def _recorded(self, events: list[Event]) -> list[Event]:
        if self.record is not None and events:
            await self.record(events)
        return events

    def _api_error(self, error: EngineError) -> APIError:
        return from_engine_error(error, context_length=self.context_length, retry_after_s=self.retry_after_s)

    async def enqueue(self) -> list[Event]:
        """Background: store the response `queued`, with its `response.created` event, before
        it runs; that event. The quota's APIError when the owner has no room for it."""
        created = self.builder.created()
        refused = await self._store_started()
        if refused is not None:
            raise refused
        return await self._recorded(created)

    async def _store_started(self) -> APIError | None:
        """Store the response as it starts (in progress; queued in the background); the error
        when the owner's quota has no room for it (then it is not stored at all). Shielded: a
        client that leaves meanwhile must not cancel the write, else the final write could
        come first and be overwritten."""
        self._stored = asyncio.ensure_future(
            asyncio.to_thread(
                self.store.put_response,
                self.builder.snapshot().to_json(),
                self.input_items,
                owner=self.owner,
                conversation_id=self.conversation_id,
                input_messages=self.translated.input_messages,
                max_stored_bytes=self.max_stored_bytes,
            )
        )
        try:
            await asyncio.shield(self._stored)
        except StorageQuotaExceededError as error:
            self._store_refused = True
            return quota_exceeded(error.used, error.quota, error.adding)
        except Exception as error:
            if not is_out_of_space(error):
                raise
            # A full disk: the response fails with a clear 507 (its transaction rolled back).
            self._store_refused = True
            return out_of_space("the response")
        return None

    def _persist_final_after_start(self, final: Sequence[Event]) -> None:
        """Record the end without awaiting (the task is being cancelled): now, or, while the first
        write still runs, right after it (`abandon()` waits for that)."""
        stored = self._stored
        if stored is None or stored.done():
            self._persist_final_now(final)
            return

        async def after_start() -> None:
            with contextlib.suppress(Exception):
                await stored
            await self._persist_final(final)

        self._final_write = asyncio.ensure_future(after_start())

    async def _persist_final(self, final: Sequence[Event]) -> None:
        await asyncio.to_thread(self._persist_final_now, final)

    def _persist_final_now(self, final: Sequence[Event]) -> None:
        resource = self.builder.snapshot()
        self.resource = resource
        output_messages = self.translated.output_messages(resource.output)
        conversation_items: list[StoredItem] = []
        conversation_messages: list[pb.Message] | None = None
        if self.conversation_id is not None and resource.status in ("completed", "incomplete"):
            outputs = [StoredItem(item.id, item.to_json()) for item in resource.output]
            conversation_items = [*self.input_items, *outputs]
            conversation_messages = [*self.translated.input_messages, *output_messages]
        # One transaction: the response's end and its conversation items are stored together.
        self.store.finish_response(
            resource.to_json() if self.store_enabled else None,
            owner=self.owner,
            output_messages=output_messages,
            conversation_id=self.conversation_id if conversation_items else None,
            conversation_items=conversation_items,
            conversation_messages=conversation_messages,
            events=[event.to_json() for event in final] if self.record is not None else (),
        )

    async def _close_stream(self) -> None:
        if self._first is not None and not self._first.done():
            self._first.cancel()
            with contextlib.suppress(BaseException):
                await self._first
        stream = self._stream
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(BaseException):
                await aclose()

    def _finished(self) -> None:
        if self._slot_held and self.slots is not None:
            self._slot_held = False
            self.slots.release(self.owner)
        if not self.done.is_set():
            self.done.set()
            if self.on_finish is not None:
                self.on_finish(self)

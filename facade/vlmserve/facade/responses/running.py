"""One response being generated: its engine call's messages through the `ResponseEvents` state
machine, each batch of events past the recorder, in order.

The parts: `EngineCall` (engine_call.py: open, messages, cancel, close; no store),
`ResponseRecorder` (recorder.py: the started write and its quota, the background event hook,
the final write; no engine) and `ResponseEvents` (events.py: pure). This module only orders
them: the start is stored before the first event goes out, the end before the final events do,
and a response stopped from our side ends `cancelled` (or `failed`, for a server shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

from vlmserve.common.wire_encode import OutgoingRequest
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade.http.errors import APIError
from vlmserve.facade.responses.engine_call import CallStopped, EngineCall
from vlmserve.facade.responses.events import Event, ResponseEvents
from vlmserve.facade.responses.recorder import ResponseRecorder
from vlmserve.responses import ResponseResource, TranslatedRequest


@dataclass
class Generation:
    response_id: str
    translated: TranslatedRequest
    builder: ResponseEvents
    call: EngineCall
    recorder: ResponseRecorder
    # Runs once, when the response is over (the service forgets it and counts it).
    on_finish: Callable[[Generation], None] | None = None
    # The engine's final result, once it came (what only the engine knows: the stop sequence).
    result: pb.GenerateResult | None = None
    # Set by `stop()`: the response ends `failed` with this error instead of `cancelled`.
    _stop_error: APIError | None = None
    _reported: bool = False
    # The request's unclaimed generations this one is in, until something takes it over, and
    # what abandoning it unclaimed also gives back (the request body's hold).
    _unclaimed: dict[str, Generation] | None = field(default=None, repr=False)
    _release_unclaimed: Callable[[], None] | None = field(default=None, repr=False)

    @property
    def request(self) -> OutgoingRequest:
        return self.call.request

    @property
    def owner(self) -> str:
        return self.call.owner

    @property
    def resource(self) -> ResponseResource:
        return self.builder.resource

    def claim(self) -> None:
        """Taken over by what runs it to its end (a response, a background run, a WebSocket):
        no longer abandoned with its request (`unclaimed_generations`)."""
        if self._unclaimed is not None:
            self._unclaimed.pop(self.response_id, None)
            self._unclaimed = None
        self._release_unclaimed = None

    async def abandon_unclaimed(self) -> None:
        """What nothing took over: abandoned, and what its request held given back."""
        release = self._release_unclaimed
        self.claim()
        try:
            await self.abandon()
        finally:
            if release is not None:
                release()

    @property
    def done(self) -> asyncio.Event:
        """Set when the response is over (its end stored, its engine call closed)."""
        return self.call.ended

    async def open(self, wait_s: float) -> None:
        """Start the engine call and wait up to `wait_s` for its first message: an engine error
        within that window raises APIError (the route answers with a plain HTTP error)."""
        try:
            await self.call.open(wait_s)
        except APIError:
            self._finished()
            raise

    async def enqueue(self) -> list[Event]:
        """Background: store the response `queued`, with its `response.created` event, before
        it runs; that event. The quota's APIError when the owner has no room for it."""
        created = self.builder.created()
        refused = await self.recorder.started()
        if refused is not None:
            raise refused
        return await self.recorder.events(created)

    async def events(self, *, raise_errors: bool = False) -> AsyncIterator[Event]:
        """All events of the response. With `raise_errors`, an engine failure raises APIError
        (non-streaming); otherwise it becomes an `error` event and `response.failed`."""
        self.call.read_here()
        builder, recorder = self.builder, self.recorder
        try:
            self.call.start()
            refused = None
            if recorder.enabled and not recorder.start_written:
                refused = await recorder.started()
            for event in await recorder.events(builder.start()):
                yield event
            if refused is not None:
                # The owner's quota was taken meanwhile (a check passed, then another request of the
                # key stored first, maybe on another facade): the response fails, nothing stored.
                failed = builder.fail(refused)
                if raise_errors:
                    raise refused
                await recorder.finished(failed)
                for event in failed:
                    yield event
                return
            # The events that end the response. They go out only after the final write: a client
            # that has read `response.completed` must find the response (and its conversation
            # items) stored, even if this process dies the next moment.
            final: list[Event] = []
            try:
                async for message in self.call.messages():
                    kind = message.WhichOneof("event") if message is not None else None
                    if kind == "complete":
                        assert message is not None
                        final = self._completed(message.complete)
                        break
                    if message is None:
                        events = builder.heartbeat()
                    elif kind == "chunk":
                        events = builder.chunk(message.chunk)
                    else:
                        continue
                    for event in await recorder.events(events):
                        yield event
                if not builder.finished:
                    raise APIError(
                        502, "The engine ended the response without a result.", code="engine_error"
                    )
            except CallStopped:
                final = self._stopped()
            except APIError as error:
                final = builder.fail(error)
                if raise_errors:
                    await recorder.finished(final)
                    raise error from None
            await recorder.finished(final)
            for event in final:
                yield event
        except (asyncio.CancelledError, GeneratorExit):
            # The client went away: the engine call is cancelled with this task. Record the end
            # in a task of its own; an await here would be cancelled again.
            if not builder.finished:
                recorder.finished_soon(self._stopped())
            raise
        finally:
            await self.call.close()
            self._finished()

    async def cancel(self, wait_s: float) -> None:
        """Ask the engine to stop; wait up to `wait_s` per stage (engine_call.py) for the end."""
        await self.call.cancel(wait_s)
        # A reader cancelled on the way records the end in a task of its own: that too.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.recorder.settle(), wait_s)

    async def stop(self, error: APIError, wait_s: float) -> None:
        """`cancel()`, but the response ends `failed` with `error` (server shutdown)."""
        self._stop_error = error
        await self.cancel(wait_s)

    def stop_now(self, error: APIError | None = None) -> None:
        """End the response from here without waiting: the reader closes the engine call and
        ends it `failed` with `error`, or `cancelled` without one."""
        self._stop_error = error
        self.call.close_from_here()

    async def abandon(self) -> None:
        """End a generation that was never (or not fully) iterated: close its engine call, and
        wait for a final write still running."""
        if not self.done.is_set():
            await self.call.close()
            self._finished()
        await self.recorder.settle()

    # ---- internals ---------------------------------------------------------------------------

    def _completed(self, result: pb.GenerateResult) -> list[Event]:
        self.result = result
        if result.finish_reason == pb.FINISH_REASON_CANCELLED and self._stop_error is not None:
            return self.builder.fail(self._stop_error)
        return self.builder.complete(result)

    def _stopped(self) -> list[Event]:
        """The final events of a response stopped from our side."""
        if self._stop_error is not None:
            return self.builder.fail(self._stop_error)
        return self.builder.cancel()

    def _finished(self) -> None:
        if not self._reported:
            self._reported = True
            if self.on_finish is not None:
                self.on_finish(self)


# The generations admitted while serving one request (or WebSocket connection) and not yet
# claimed: whatever fails between the admission and the hand-over, they are abandoned when the
# request ends (the one place that releases them: `delivery.AbandonUnclaimed`).
_UNCLAIMED: ContextVar[dict[str, Generation] | None] = ContextVar("unclaimed_generations", default=None)


def track_unclaimed(generation: Generation, release: Callable[[], None] | None = None) -> None:
    """Note a just admitted generation in its request's unclaimed ones (if it is in a request);
    `release`: what its request holds for it (the body's bytes), given back with it."""
    unclaimed = _UNCLAIMED.get()
    if unclaimed is not None:
        unclaimed[generation.response_id] = generation
        generation._unclaimed = unclaimed
        generation._release_unclaimed = release


@contextlib.contextmanager
def unclaimed_generations() -> Iterator[dict[str, Generation]]:
    """The generations admitted within this block (tasks started in it included) and not
    claimed; the caller abandons what is left in it."""
    unclaimed: dict[str, Generation] = {}
    token = _UNCLAIMED.set(unclaimed)
    try:
        yield unclaimed
    finally:
        _UNCLAIMED.reset(token)

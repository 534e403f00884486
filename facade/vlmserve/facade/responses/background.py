"""Background responses (`background: true`): runs detached from the request, and their events.

A background response is stored `queued` with its first events before the request is
answered; its run is a task of its own, so a client that disconnects does not stop it. Every
event is stored as it is produced (the last ones with the final state, in one transaction), so
`GET /v1/responses/{id}?stream=true&starting_after=N` replays what is stored after N and then
follows the run until its terminal event. Followers in this process are woken by each write;
they also poll, for a run in another process sharing the store. A cancel that reaches another
process marks the stored response `cancelled`; the run reads its status every `CANCEL_CHECK_S`
while it produces events, and stops.

The stored events of one response are bounded by `storage.max_response_event_bytes`: a run
whose events pass it is stopped and ends `failed` (its terminal events are stored even so, as a
response's output may pass a conversation's limit). Their bytes count in the owner's quota.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from vlmserve.facade.http.errors import APIError
from vlmserve.facade.responses.events import TERMINAL_STATUSES, Event
from vlmserve.facade.responses.running import Generation
from vlmserve.facade.store.records import ResponseRecord, StoredEvent
from vlmserve.facade.store.repositories import Store

logger = logging.getLogger("vlmserve.facade")

# The event types that end a response's events.
TERMINAL_EVENTS = frozenset({"response.completed", "response.failed", "response.incomplete"})
# How often a follower looks at the store when no write of this process woke it (a run in
# another facade process sharing the store).
POLL_S = 0.5
# How often a run reads its stored status while it produces events: a cancel that reached
# another facade process sharing the store marks it `cancelled` there, and the run stops here.
CANCEL_CHECK_S = 0.5
# Events a run keeps in memory for its followers in this process.
RECENT_EVENTS = 256
# Events read from the store at a time while replaying.
PAGE = 500

# What a background response still running says when this facade shuts down.
SHUTDOWN_ERROR = APIError(500, "The server shut down before this response finished.", code="server_error")


@dataclass
class _Run:
    generation: Generation
    task: asyncio.Task[None] | None = None
    # The stored resource says `in_progress` (it was stored `queued`).
    marked_started: bool = False
    # monotonic time the stored status was last read (a cancel by another facade process).
    checked_at: float = field(default_factory=time.monotonic)
    # The last events stored by `_record` (consecutive sequence numbers), so that followers in
    # this process need not read back what was just written.
    recent: list[StoredEvent] = field(default_factory=list)

    def remember(self, events: list[StoredEvent]) -> None:
        self.recent.extend(events)
        if len(self.recent) > RECENT_EVENTS:
            del self.recent[: len(self.recent) - RECENT_EVENTS // 2]

    def since(self, after: int | None) -> list[StoredEvent]:
        """The remembered events after `after`; empty when there are none or they do not reach
        back that far (the store has them)."""
        if not self.recent:
            return []
        start = (after + 1 if after is not None else 0) - self.recent[0].sequence_number
        return self.recent[start:] if start >= 0 else []


@dataclass
class BackgroundRuns:
    store: Store
    max_event_bytes: int | None
    control_s: float
    _runs: dict[str, _Run] = field(default_factory=dict)
    # Response id -> set (and replaced) whenever this process stores events of it.
    _signals: dict[str, asyncio.Event] = field(default_factory=dict)

    async def start(self, generation: Generation, finish: Callable[[], Awaitable[None]]) -> list[Event]:
        """Store the response `queued` and start its run; its first events (`response.created`,
        `response.queued`), stored.
        `finish` runs when the run has ended (the request body's bytes are let go then)."""
        run = _Run(generation)
        generation.recorder.on_events = lambda events: self._record(run, events)
        try:
            created = await generation.enqueue()
        except BaseException:
            await finish()
            raise
        response_id = generation.response_id
        run.task = asyncio.create_task(self._run(generation, finish), name=f"background {response_id}")
        self._runs[response_id] = run
        run.task.add_done_callback(lambda _: self._runs.pop(response_id, None))
        return created

    async def follow(self, response_id: str, *, owner: str, after: int | None) -> AsyncIterator[StoredEvent]:
        """The stored events of a response after `after`, then the new ones as they are stored,
        until its terminal event (or until it is deleted)."""
        ending = False
        try:
            while True:
                # Taken before reading: a write after the read sets it, so none is missed.
                signal = self._signals.setdefault(response_id, asyncio.Event())
                run = self._runs.get(response_id)
                events: list[StoredEvent] | None = []
                if run is not None and run.generation.owner == owner:
                    events = run.since(after)
                if not events:
                    events = await self.store.events.list(response_id, after=after, limit=PAGE, owner=owner)
                if events is None:
                    return
                for event in events:
                    yield event
                    after = event.sequence_number
                    if event.type in TERMINAL_EVENTS:
                        return
                if len(events) == PAGE:
                    continue
                if not events:
                    if ending:
                        return
                    if await self._finished(response_id, owner):
                        # Its terminal events are stored with its final state, so what is left
                        # is readable now: read it, then end (`after` may have been past them).
                        ending = True
                        continue
                # Caught up: until the next write of this process (or the next look).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(signal.wait(), POLL_S)
        finally:
            if response_id not in self._runs:
                # No run of this process will write (or wake) it: no signal to keep.
                self._signals.pop(response_id, None)

    async def _finished(self, response_id: str, owner: str) -> bool:
        stored = await self.store.responses.get(response_id, owner=owner)
        return stored is None or stored.status in TERMINAL_STATUSES

    async def stop_all(self) -> None:
        """Shutdown: end every run (`failed`, SHUTDOWN_ERROR) and wait for its final write."""
        await asyncio.gather(*(self._stop(run) for run in list(self._runs.values())), return_exceptions=True)

    # ---- internals ---------------------------------------------------------------------------

    async def _stop(self, run: _Run) -> None:
        await run.generation.stop(SHUTDOWN_ERROR, self.control_s)
        task = run.task
        if task is None:
            return
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(task), self.control_s)
        if not task.done():
            task.cancel()

    async def _run(self, generation: Generation, finish: Callable[[], Awaitable[None]]) -> None:
        try:
            async for _ in generation.events():
                pass
        except Exception:
            logger.exception("background response %s failed", generation.response_id)
        finally:
            try:
                await finish()
            finally:
                self._wake(generation.response_id)

    async def _record(self, run: _Run, events: Sequence[Event]) -> None:
        """Store events of a run as they are produced; stop a run whose events pass the bound."""
        generation = run.generation
        payloads = [StoredEvent.of(event.to_json()) for event in events]
        try:
            stored = await self.store.events.append(generation.response_id, payloads, owner=generation.owner)
            if stored is not None:
                run.remember(payloads)
            if not run.marked_started and any(event.type == "response.in_progress" for event in events):
                # Polling shows the run has started (queued -> in_progress).
                run.marked_started = True
                snapshot = ResponseRecord.of(generation.builder.snapshot().to_json())
                await self.store.responses.update(snapshot, owner=generation.owner)
        except Exception:
            logger.exception("response %s: its events could not be stored", generation.response_id)
            stored = 0
        finally:
            self._wake(generation.response_id)
        if stored is None or await self._cancelled_elsewhere(run):
            # Deleted while running (nothing is left to finish), or cancelled by another process.
            generation.stop_now()
        elif self.max_event_bytes is not None and stored > self.max_event_bytes:
            generation.stop_now(
                APIError(
                    500,
                    f"The response's stored events passed this server's limit of {self.max_event_bytes}"
                    " bytes; its run was stopped.",
                    code="server_error",
                )
            )

    async def _cancelled_elsewhere(self, run: _Run) -> bool:
        now = time.monotonic()
        if now - run.checked_at < CANCEL_CHECK_S:
            return False
        run.checked_at = now
        generation = run.generation
        try:
            stored = await self.store.responses.get(generation.response_id, owner=generation.owner)
        except Exception:
            logger.exception("response %s: its status could not be read", generation.response_id)
            return False
        return stored is not None and stored.status == "cancelled"

    def _wake(self, response_id: str) -> None:
        signal = self._signals.pop(response_id, None)
        if signal is not None:
            signal.set()

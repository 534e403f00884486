"""What the store keeps of one response: its start (quota-checked), its events (background
responses), and its end, written in order. It knows the store and nothing of the engine.

Nothing is stored until the response has started, so a request the engine refuses at once
leaves no stored response whose id the client never saw. The final write goes out before the
final events do (the driver's order, running.py): a client that has read `response.completed`
finds the response, and its conversation items, stored.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from vlmserve.common.wire_encode import HeldMessages
from vlmserve.facade.http.errors import APIError, insufficient_storage
from vlmserve.facade.responses.events import Event, ResponseEvents
from vlmserve.facade.store.disk_space import OutOfSpaceError
from vlmserve.facade.store.quotas import quota_exceeded
from vlmserve.facade.store.records import (
    ResponseRecord,
    StorageQuotaExceededError,
    StoredEvent,
    StoredItem,
)
from vlmserve.facade.store.repositories import Store
from vlmserve.responses import TranslatedRequest

# A background response's hook: every event but the last goes through it before it is sent (it
# stores them); the last ones are stored with the final state (`store.responses.finish(events=)`).
EventHook = Callable[[Sequence[Event]], Awaitable[None]]


@dataclass
class ResponseRecorder:
    store: Store
    # The response's state machine: what is written is its snapshot at the time of the write.
    builder: ResponseEvents
    translated: TranslatedRequest
    # `input` as it is stored (references replaced by what they resolved to).
    input_items: list[StoredItem]
    owner: str = ""
    conversation_id: str | None = None
    # The owner's storage quota, checked atomically with the first write.
    max_stored_bytes: int | None = None
    on_events: EventHook | None = None
    # What is stored of the resource's JSON (None: as it is): an automatically compacted
    # response's output starts with its compaction item, as its client got it (auto_compaction.py).
    stored_json: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    _refused: bool = False
    # The first write of the stored response, and a final write that had to wait for it.
    _stored: asyncio.Future[None] | None = None
    _final_write: asyncio.Future[None] | None = None

    @property
    def enabled(self) -> bool:
        """The response itself is stored (`store: true`, and its first write was not refused)."""
        return self.translated.echo.store and not self._refused

    def _json(self, resource: dict[str, Any]) -> dict[str, Any]:
        return resource if self.stored_json is None else self.stored_json(resource)

    @property
    def start_written(self) -> bool:
        return self._stored is not None

    async def started(self) -> APIError | None:
        """Store the response as it starts (in progress; queued in the background); the error
        when the owner's quota has no room for it (then it is not stored at all). Shielded: a
        client that leaves meanwhile must not cancel the write, else the final write could
        come first and be overwritten."""
        self._stored = asyncio.ensure_future(
            self.store.responses.put(
                ResponseRecord.of(self._json(self.builder.snapshot().to_json())),
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
            self._refused = True
            return quota_exceeded(error.used, error.quota, error.adding)
        except OutOfSpaceError:
            # A full disk: the response fails with a clear 507 (its transaction rolled back).
            self._refused = True
            return insufficient_storage("the response")
        return None

    async def events(self, events: list[Event]) -> list[Event]:
        """Events on their way out (stored first, in the background); the same events."""
        if self.on_events is not None and events:
            await self.on_events(events)
        return events

    def finished_soon(self, final: Sequence[Event]) -> None:
        """Store the end without awaiting (the caller is being cancelled): in a task of its own,
        right after the first write if that still runs (`settle()` waits for it)."""
        stored = self._stored

        async def after_start() -> None:
            if stored is not None:
                with contextlib.suppress(Exception):
                    await stored
            await self.finished(final)

        self._final_write = asyncio.ensure_future(after_start())

    async def settle(self) -> None:
        """Wait for a final write that `finished_soon` left running."""
        if self._final_write is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._final_write)

    async def finished(self, final: Sequence[Event]) -> None:
        """Store the response's end, with its final events (background) and conversation items."""
        resource = self.builder.snapshot()
        output_messages = self.translated.output_messages(resource.output)
        conversation_items: list[StoredItem] = []
        conversation_messages: HeldMessages | None = None
        if self.conversation_id is not None and resource.status in ("completed", "incomplete"):
            outputs = [StoredItem(item.id, item.to_json()) for item in resource.output]
            conversation_items = [*self.input_items, *outputs]
            conversation_messages = self.translated.input_messages.plus(output_messages)
        # One transaction: the response's end and its conversation items are stored together.
        await self.store.responses.finish(
            ResponseRecord.of(self._json(resource.to_json())) if self.enabled else None,
            owner=self.owner,
            output_messages=output_messages,
            conversation_id=self.conversation_id if conversation_items else None,
            conversation_items=conversation_items,
            conversation_messages=conversation_messages,
            events=[StoredEvent.of(event.to_json()) for event in final] if self.on_events is not None else (),
            # The conversation continues with the model that answered last.
            conversation_model=resource.model,
        )

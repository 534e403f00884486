"""A `compaction_trigger` turn: the conversation before the trigger summarised into a sealed
`compaction` item, answered as a response whose output is that item.

The turn is an ordinary generation (same preparation, limits, prefix cache partition and engine
call) of the conversation without the trigger, followed by a user turn asking for a summary
(`SUMMARY_INSTRUCTION`; at most `SUMMARY_MAX_OUTPUT_TOKENS`, no tool calls, no structured
format, not stored). Its events reach the client as OpenAI sends a compaction's: the lifecycle
events, `response.output_item.added` of the `compaction` item, `response.compaction.compacting`
while the summary is sampled (no summary text), `response.output_item.done` with the sealed item,
then `response.completed`. The summary is cleaned of tool-call and thinking markup; the
latest `compaction_keep_images` images of the conversation are kept in the item as images.

The turn is stored as its client sees it (`CompactionRecorder`, unless it asks `store: false`):
its input as sent (the trigger included), its output the sealed item (which a later turn
replays as the summary, `compaction_messages`), in its conversation too. Before its final events
go out, the turn after it is prefilled into the prefix cache (prewarm.py `prewarm_compacted`:
the request's instructions and tools, then the item), so the next turn starts warm.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from vlmserve.common.wire_encode import OutgoingRequest
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade.http.errors import APIError
from vlmserve.facade.responses import ids
from vlmserve.facade.responses.compaction_seal import CompactionSeal
from vlmserve.facade.responses.events import Event
from vlmserve.facade.responses.preparation import ResponsesService
from vlmserve.facade.responses.prewarm import prewarm_compacted
from vlmserve.facade.responses.recorder import ResponseRecorder
from vlmserve.facade.responses.resource import stored_items
from vlmserve.facade.responses.running import Generation
from vlmserve.facade.store.records import ResponseRecord, StoredItem
from vlmserve.responses import (
    CompactionState,
    CreateRequest,
    KeptImage,
    build_generate_request,
    clean_summary,
    compaction_item,
    opening_compactions,
    summary_body,
)

logger = logging.getLogger("vlmserve.facade")
CompactionOpener = Callable[[str], CompactionState | None]

# The summary's budget: a summary longer than this would not compact much.
SUMMARY_MAX_OUTPUT_TOKENS = 1024
_TERMINAL = ("response.completed", "response.incomplete")


def summary_budget(context_length: int | None) -> int:
    """A summary's output tokens: a sixteenth of the context, 64 to SUMMARY_MAX_OUTPUT_TOKENS
    (mlx-vlm's bound): on a small model a longer summary would take the room it was to free."""
    if not context_length:
        return SUMMARY_MAX_OUTPUT_TOKENS
    return min(SUMMARY_MAX_OUTPUT_TOKENS, max(64, context_length // 16))


def trigger_request(create: CreateRequest, *, context_length: int | None = None) -> CreateRequest | None:
    """The summarising request a `compaction_trigger` (the last input item) asks for; None when
    the input does not end with one. `context_length`: the model's, which bounds the summary."""
    summary = summary_body(create.body, max_output_tokens=summary_budget(context_length))
    return None if summary is None else CreateRequest(summary, extras=create.extras)


def summary_text(resource: dict[str, Any]) -> str:
    """The model's summary: its message text, cleaned of markup (tool calls never count)."""
    text = "".join(
        part.get("text", "")
        for item in resource["output"]
        if item["type"] == "message"
        for part in item["content"]
    )
    return clean_summary(text)


def latest_images(request: OutgoingRequest, count: int) -> tuple[KeptImage, ...]:
    """The last `count` images of the conversation (tool outputs included), oldest first."""
    found = [KeptImage(image.data, image.media_type) for image in request.images()]
    return tuple(found[-count:]) if count else ()


class CompactionEvents:
    """One compaction turn's events and answer, from its summarising generation's."""

    def __init__(self, seal: CompactionSeal, *, owner: str, images: tuple[KeptImage, ...]) -> None:
        self._seal = seal
        self._owner = owner
        self._images = images
        self._sequence = 0
        self._item_id = ids.new_id("cmp")
        self._announced = False
        # Sealed once: what is stored is what is sent.
        self._item: dict[str, Any] | None = None

    def item(self, resource: dict[str, Any]) -> dict[str, Any]:
        if self._item is not None:
            return self._item
        summary = summary_text(resource)
        if not summary:
            raise APIError(
                502, "The model wrote no summary; nothing was compacted.", code="compaction_failed"
            )
        sealed = self._seal.seal(CompactionState(summary, self._images), owner=self._owner)
        self._item = {**compaction_item(sealed), "id": self._item_id}
        return self._item

    def answer(self, resource: dict[str, Any]) -> dict[str, Any]:
        """The collected response, its output the compaction item."""
        return {
            **resource,
            "status": "completed",
            "incomplete_details": None,
            "output": [self.item(resource)],
        }

    def events(self, event: Event) -> list[dict[str, Any]]:
        """What one event of the summarising generation becomes (JSON)."""
        sent = event.to_json()
        kind = sent["type"]
        if kind in ("response.created", "response.queued", "response.in_progress"):
            return [self._next(sent)]
        if kind in _TERMINAL:
            resource = sent["response"]
            try:
                item = self.item(resource)
            except APIError as error:
                failed = {
                    **resource,
                    "status": "failed",
                    "output": [],
                    "error": {"code": error.code, "message": error.message},
                }
                return [
                    self._next({"type": "error", **error.payload().to_json()}),
                    self._next({"type": "response.failed", "response": failed}),
                ]
            done = {"type": "response.output_item.done", "output_index": 0, "item": item}
            completed = {**resource, "status": "completed", "incomplete_details": None, "output": [item]}
            return [
                *self._announce(),
                self._next(done),
                self._next({"type": "response.completed", "response": completed}),
            ]
        if kind in ("response.failed", "error"):
            if "response" in sent:
                sent = {**sent, "response": {**sent["response"], "output": []}}
            return [self._next(sent)]
        if kind.endswith(".delta"):
            compacting = {
                "type": "response.compaction.compacting",
                "item_id": self._item_id,
                "output_index": 0,
            }
            return [*self._announce(), self._next(compacting)]
        return []

    def _announce(self) -> list[dict[str, Any]]:
        if self._announced:
            return []
        self._announced = True
        opened = {"id": self._item_id, "type": "compaction", "encrypted_content": ""}
        return [self._next({"type": "response.output_item.added", "output_index": 0, "item": opened})]

    def _next(self, event: dict[str, Any]) -> dict[str, Any]:
        numbered = {**event, "sequence_number": self._sequence}
        self._sequence += 1
        return numbered


def compaction_messages(item: dict[str, Any], opener: CompactionOpener) -> list[pb.Message]:
    """What a compaction item reaches the model as (the translation's own rendering of it: the
    summary as an assistant turn, the kept images as a user turn): a stored turn's output
    messages, which later turns replay."""
    with opening_compactions(opener):
        translated = build_generate_request({"input": [item]})
    return list(translated.request.messages)


@dataclass
class CompactionRecorder(ResponseRecorder):
    """What the store keeps of a compaction turn: the response as its client gets it (its output
    the compaction item, not the summarising call's message), its input as sent; the turn after
    it prefilled (`after`) before its final events go out."""

    compaction: CompactionEvents | None = None
    # The turn's own `store` (its summarising call is never stored as itself).
    keep: bool = True
    opener: CompactionOpener | None = None
    after: Callable[[dict[str, Any]], Awaitable[None]] | None = None

    @property
    def enabled(self) -> bool:
        return self.keep and not self._refused

    async def finished(self, final: Sequence[Event]) -> None:
        resource = self.builder.snapshot().to_json()
        item: dict[str, Any] | None = None
        if resource["status"] in ("completed", "incomplete") and self.compaction is not None:
            try:
                answer = self.compaction.answer(resource)
                item = answer["output"][0]
            except APIError as error:
                answer = {
                    **resource,
                    "status": "failed",
                    "output": [],
                    "error": {"code": error.code, "message": error.message},
                }
        else:
            answer = {**resource, "output": []}
        output_messages = compaction_messages(item, self.opener) if item and self.opener else []
        conversation_items: list[StoredItem] = []
        if self.conversation_id is not None and item is not None:
            conversation_items = [*self.input_items, StoredItem(item["id"], item)]
        await self.store.responses.finish(
            ResponseRecord.of(answer) if self.enabled else None,
            owner=self.owner,
            output_messages=output_messages,
            conversation_id=self.conversation_id if conversation_items else None,
            conversation_items=conversation_items,
            conversation_messages=self.translated.input_messages.plus(output_messages)
            if conversation_items
            else None,
            conversation_model=answer.get("model"),
        )
        if item is not None and self.after is not None:
            await self.after(item)


def record_compaction(
    service: ResponsesService, generation: Generation, compaction: CompactionEvents, trigger: CreateRequest
) -> None:
    """The compaction turn's generation stored as the turn (`CompactionRecorder`), not as its
    summarising call, and the next turn prewarmed: waited for up to the control timeout, then
    left to finish on its own (a failed prewarm only costs the next turn its warm start)."""
    owner = generation.owner
    recorder = generation.recorder
    body = trigger.body
    keep = body.store is not False
    given = trigger.stored_input()
    # The summarising call's input is the turn's without its trigger, then the summary request.
    input_items = [*recorder.input_items[:-1], *stored_items([given[-1]] if isinstance(given, list) else [])]
    # Its echo is the turn's: stored unless it said not to.
    generation.builder.resource.store = keep

    async def after(item: dict[str, Any]) -> None:
        warming = prewarm_compacted(service, trigger, item, owner=owner)
        task = asyncio.ensure_future(_logged(warming, generation.response_id))
        _PREWARMS.add(task)
        task.add_done_callback(_PREWARMS.discard)
        await asyncio.wait({task}, timeout=service.settings.timeouts.control)

    generation.recorder = CompactionRecorder(
        recorder.store,
        recorder.builder,
        recorder.translated,
        input_items,
        owner=recorder.owner,
        conversation_id=recorder.conversation_id,
        max_stored_bytes=recorder.max_stored_bytes,
        compaction=compaction,
        keep=keep,
        opener=service.compaction_opener(owner),
        after=after,
    )


# Prewarms still running after their turn ended (a reference, so they are not collected).
_PREWARMS: set[asyncio.Future[None]] = set()


async def _logged(prewarm: Awaitable[None], response_id: str) -> None:
    try:
        await prewarm
    except Exception as error:  # the next turn is only colder
        logger.warning("response %s: the turn after the compaction was not prewarmed: %s", response_id, error)

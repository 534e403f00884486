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
"""

from __future__ import annotations

from typing import Any

from vlmserve.common.wire_encode import OutgoingRequest
from vlmserve.facade.http.errors import APIError
from vlmserve.facade.responses import ids
from vlmserve.facade.responses.compaction_seal import CompactionSeal
from vlmserve.facade.responses.events import Event
from vlmserve.responses import (
    CompactionState,
    CreateRequest,
    KeptImage,
    clean_summary,
    compaction_item,
    summary_body,
)

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

    def item(self, resource: dict[str, Any]) -> dict[str, Any]:
        summary = summary_text(resource)
        if not summary:
            raise APIError(
                502, "The model wrote no summary; nothing was compacted.", code="compaction_failed"
            )
        sealed = self._seal.seal(CompactionState(summary, self._images), owner=self._owner)
        return {**compaction_item(sealed), "id": self._item_id}

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

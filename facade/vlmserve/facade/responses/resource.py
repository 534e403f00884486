"""A new ResponseResource (in progress; queued in the background) for a translated request, and
stored-item helpers."""

from __future__ import annotations

import copy
import time
from typing import Any

from vlmserve.facade.responses import ids
from vlmserve.facade.store.records import StoredItem
from vlmserve.responses import ConversationRef, ResponseResource, TranslatedRequest

# Item type -> the prefix of the id the facade gives an item that came without one.
_ITEM_ID_PREFIXES = {
    "message": ids.MESSAGE,
    "function_call": ids.FUNCTION_CALL,
    "function_call_output": "fco",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
    "reasoning": "rs",
}


def new_resource(
    translated: TranslatedRequest,
    *,
    response_id: str,
    model_id: str,
    conversation_id: str | None = None,
) -> ResponseResource:
    """The response as it starts: in progress (queued in the background), no output yet, the
    request's fields echoed."""
    return ResponseResource(
        **dict(translated.echo),
        id=response_id,
        created_at=int(time.time()),
        model=model_id,
        conversation=None if conversation_id is None else ConversationRef(id=conversation_id),
        user=translated.user,
        # A background response waits for its run; a foreground one starts at once.
        status="queued" if translated.echo.background else "in_progress",
    )


def stored_items(items: list[Any]) -> list[StoredItem]:
    """Raw items with the id they are listed under: the client's own, or a fresh one."""
    result: list[StoredItem] = []
    for item in items:
        raw = dict(item)
        item_id = raw.get("id")
        if not isinstance(item_id, str) or not item_id:
            item_type = raw.get("type") or ("message" if "role" in raw else "item")
            item_id = ids.new_id(_ITEM_ID_PREFIXES.get(str(item_type), ids.ITEM))
        result.append(StoredItem(item_id, raw))
    return result


def listed_item(stored: StoredItem) -> dict[str, Any]:
    """A stored raw item with its id and `detail` on every image, otherwise exactly what the client
    sent (images included); `typed_item` adds the message normalisation that listings show."""
    item = copy.deepcopy(stored.item)
    item["id"] = stored.id
    for key in ("content", "output"):
        parts = item.get(key)
        if isinstance(parts, list):
            for part in parts:
                _default_detail(part)
    return item


def typed_item(stored: StoredItem) -> dict[str, Any]:
    """A stored item as OpenAI lists conversation items and response input items: `listed_item`,
    and a message always has `type`, `status` and its content as typed parts (a string becomes one
    text part), so clients that parse items by `type` (the openai SDK, openai-agents) read them."""
    item = listed_item(stored)
    if "role" in item and item.get("type") in (None, "message"):
        item["type"] = "message"
        item.setdefault("status", "completed")
        content = item.get("content")
        if isinstance(content, str):
            text_type = "output_text" if item["role"] == "assistant" else "input_text"
            part: dict[str, Any] = {"type": text_type, "text": content}
            if text_type == "output_text":
                part["annotations"] = []
            item["content"] = [part]
    return item


def _default_detail(part: object) -> None:
    if not isinstance(part, dict):
        return
    if part.get("type") == "input_image" and part.get("detail") is None:
        part["detail"] = "auto"
    elif part.get("type") == "image_url":
        inner = part.get("image_url")
        if isinstance(inner, dict) and inner.get("detail") is None:
            inner["detail"] = "auto"
        elif isinstance(inner, str) and part.get("detail") is None:
            part["detail"] = "auto"

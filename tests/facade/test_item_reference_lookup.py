"""`ItemReferences` looks every id up before the translation runs (the store is async; the
translation runs on a worker thread and only reads what was found), and counts the bytes every use
adds (the images every use adds are the translation's budget's: tests/responses/test_budget.py)."""

from __future__ import annotations

from typing import Any

import pytest

from vlmserve.facade.http.errors import APIError
from vlmserve.facade.responses.item_references import ItemReferences
from vlmserve.facade.store.records import StoredItem

IMAGE = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
# msg_image as JSON: what each use of it adds.
IMAGE_ITEM_BYTES = 116
STORED: dict[str, dict[str, Any]] = {
    "msg_text": {"type": "message", "role": "user", "content": "hello"},
    "msg_image": {"type": "message", "role": "user", "content": [IMAGE]},
}


def reference(item_id: str) -> dict[str, Any]:
    return {"type": "item_reference", "id": item_id}


def references(asked: list[str], *, max_bytes: int = 10_000) -> ItemReferences:
    async def find(item_id: str) -> StoredItem | None:
        asked.append(item_id)
        item = STORED.get(item_id)
        return StoredItem(item_id, item) if item is not None else None

    return ItemReferences(find, param="input", max_bytes=max_bytes)


async def test_each_id_is_looked_up_once_and_every_use_counts() -> None:
    asked: list[str] = []
    resolver = references(asked)
    await resolver.resolve_all([reference("msg_image"), reference("msg_image"), reference("msg_gone")])
    assert asked == ["msg_image", "msg_gone"]
    assert resolver.bytes == 2 * IMAGE_ITEM_BYTES
    # The translation's calls read what was found, counted up front already.
    assert resolver("msg_image") == STORED["msg_image"] and resolver("msg_gone") is None
    assert resolver.bytes == 2 * IMAGE_ITEM_BYTES and asked == ["msg_image", "msg_gone"]


async def test_a_reference_in_a_replayed_turn_is_looked_up_first_and_counted_at_its_use() -> None:
    asked: list[str] = []
    resolver = references(asked)
    await resolver.resolve_all([{"role": "user", "content": "hi"}], replayed=[reference("msg_image")])
    assert asked == ["msg_image"] and resolver.bytes == 0
    assert resolver("msg_image") == STORED["msg_image"]
    assert resolver.bytes == IMAGE_ITEM_BYTES
    resolver("msg_image")
    assert resolver.bytes == IMAGE_ITEM_BYTES and asked == ["msg_image"]


async def test_an_id_nobody_named_is_unknown_to_the_translation() -> None:
    asked: list[str] = []
    resolver = references(asked)
    await resolver.resolve_all([])
    assert resolver("msg_text") is None and asked == []


async def test_references_past_the_byte_limit_are_refused_before_the_translation() -> None:
    resolver = references([], max_bytes=2 * IMAGE_ITEM_BYTES - 1)
    with pytest.raises(APIError) as refused:
        await resolver.resolve_all([reference("msg_image"), reference("msg_image")])
    assert (refused.value.status, refused.value.code) == (400, "item_references_too_large")

"""`item_reference` resolution for one request, bounded so that references cannot amplify a body.

A reference costs the server what the item it names holds, not what the client sent (a 60-byte
reference can name an item with 16 images). So, per request (or per conversation `items` list):

* references are counted on the raw body before anything is resolved (`check_reference_count`);
* each id is looked up once, however often it is named, all before the translation starts (the
  translation runs on a worker thread and asks `__call__`, which only reads what was found);
* every use adds the item's JSON bytes to the request's total (`resolve_all`); the images of every
  use are charged by the translation to the request's budget (`vlmserve.responses._budget`),
  all before it decodes a single image.

What was resolved is stored in place of the reference (`stored_items`), under the id it names:
a stored response or conversation never holds a reference, so replaying it, or referencing the
same item again later, never depends on which stored item an id finds first.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from vlmserve.facade.http.errors import APIError
from vlmserve.facade.responses.resource import stored_items as fresh_stored_items
from vlmserve.facade.store.records import StoredItem
from vlmserve.responses import is_item_reference

Finder = Callable[[str], Awaitable[StoredItem | None]]


def count_references(value: object) -> int:
    """`item_reference` items in an `input` (or conversation `items`) array."""
    return sum(1 for item in value if is_item_reference(item)) if isinstance(value, list) else 0


def check_reference_count(value: object, allowed: int, *, param: str) -> None:
    count = count_references(value)
    if count > allowed:
        raise APIError(
            400,
            f"Invalid value for '{param}': at most {allowed} item references per request on this "
            f"server (this request has {count}).",
            param=param,
            code="too_many_item_references",
        )


class ItemReferences:
    """The `resolve_item` of one translation: looks each id up once and keeps the byte total.

    `max_bytes` bounds what the references add to the request.
    """

    def __init__(self, find: Finder, *, param: str, max_bytes: int) -> None:
        self._find = find
        self._param = param
        self._max_bytes = max_bytes
        self.bytes = 0
        # id -> (item or None, its JSON bytes)
        self._found: dict[str, tuple[dict[str, Any] | None, int]] = {}
        # Ids counted at least once (a reference in a replayed turn counts at its first use).
        self._used: set[str] = set()
        self._counted_up_front = False

    async def resolve_all(self, items: object, *, replayed: Sequence[Any] = ()) -> None:
        """Look up every reference among `items` (a request's `input`) and among `replayed`
        (raw turns stored by older versions, which may hold references), and count the uses in
        `items` up front; the others are counted when the translation uses them.

        Unknown ids are left for the translation to refuse with the reference's own path.
        """
        named = _reference_ids(items)
        for item_id in [*named, *_reference_ids(replayed)]:
            if item_id not in self._found:
                found = await self._find(item_id)
                item = found.item if found is not None else None
                size = len(json.dumps(item, ensure_ascii=False)) if item is not None else 0
                self._found[item_id] = (item, size)
        for item_id in named:
            self._use(item_id)
        self._counted_up_front = True

    def __call__(self, item_id: str) -> Mapping[str, Any] | None:
        """The translation's `resolve_item`. References counted by `resolve_all` are served from
        what it found; others (in replayed turns stored by older versions) are counted here."""
        if self._counted_up_front and item_id in self._used:
            return self.resolved(item_id)
        return self._use(item_id)

    def _use(self, item_id: str) -> dict[str, Any] | None:
        self._used.add(item_id)
        # An id `resolve_all` did not look up is unknown here (the translation refuses it).
        item, size = self._found.get(item_id, (None, 0))
        if item is None:
            return None
        self.bytes += size
        if self.bytes > self._max_bytes:
            raise APIError(
                400,
                f"Invalid value for '{self._param}': the items it references add more than "
                f"{self._max_bytes} bytes to the request.",
                param=self._param,
                code="item_references_too_large",
            )
        return item

    def resolved(self, item_id: str) -> dict[str, Any] | None:
        found = self._found.get(item_id)
        return found[0] if found is not None else None

    def stored_items(self, items: Sequence[Any]) -> list[StoredItem]:
        """`items` as they are stored: each reference replaced by the item it resolved to."""
        stored: list[StoredItem] = []
        for item in items:
            if is_item_reference(item):
                item_id = str(item["id"])
                target = self.resolved(item_id)
                if target is not None:
                    stored.append(StoredItem(item_id, copy.deepcopy(target)))
                    continue
            stored.extend(fresh_stored_items([item]))
        return stored


def _reference_ids(items: object) -> list[str]:
    """The ids `item_reference` items among `items` name, in order (repeats kept)."""
    if not isinstance(items, list):
        return []
    ids = (
        item.get("id") if isinstance(item, Mapping) else item.id for item in items if is_item_reference(item)
    )
    return [item_id for item_id in ids if isinstance(item_id, str)]

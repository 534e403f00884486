"""Stored items as OpenAI lists: a response's input items and a conversation's items, paged alike."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol

from fastapi import Query

from vlmserve.facade.http.errors import APIError, not_found
from vlmserve.facade.responses.resource import listed_item
from vlmserve.facade.store.records import ItemPage, Order, StoredItem, UnknownCursorError
from vlmserve.responses import IncludeValue


class ItemPages(Protocol):
    """A repository's page of items: `ResponseRepository.list_input_items` (a response's input
    items) or `ConversationRepository.list_items`; None when the object is unknown."""

    def __call__(
        self, object_id: str, /, *, after: str | None, limit: int, order: Order, owner: str
    ) -> Awaitable[ItemPage | None]: ...


@dataclass(frozen=True)
class PageQuery:
    after: str | None = None
    limit: int = 20
    order: Literal["asc", "desc"] = "desc"


def page_query(
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
    # Validated (400 naming include[i]); listed items already carry what each value asks for.
    include: Annotated[list[IncludeValue] | None, Query(alias="include[]")] = None,
) -> PageQuery:
    """The query of an item listing, OpenAI's (a FastAPI dependency of both listing routes)."""
    return PageQuery(after, limit, order)


async def item_page(
    fetch: ItemPages,
    kind: str,
    object_id: str,
    owner: str,
    query: PageQuery,
    *,
    listed: Callable[[StoredItem], dict[str, Any]] = listed_item,
) -> dict[str, Any]:
    """One page of a response's input items or a conversation's items, as an OpenAI list."""
    try:
        page = await fetch(object_id, after=query.after, limit=query.limit, order=query.order, owner=owner)
    except UnknownCursorError:
        noun = "input item" if kind == "response" else "item"
        raise APIError(400, f"Invalid value for 'after': no {noun} has this id.", param="after") from None
    if page is None:
        raise not_found(kind, object_id)
    return item_list(page, listed)


def item_list(page: ItemPage, listed: Callable[[StoredItem], dict[str, Any]] = listed_item) -> dict[str, Any]:
    data = [listed(entry) for entry in page.items]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": page.has_more,
    }

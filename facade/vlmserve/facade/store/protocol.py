"""What the facade needs from a store of responses and conversations, whatever keeps them.

`store.ResponseStore` (SQLite) and `postgres_store.PostgresStore` implement `Store`, both on
`sql_store.SQLStore`; the routes and the service only use this interface. Every method is synchronous and
thread-safe (the app calls them through `asyncio.to_thread`), and every query is filtered on
`owner` (the API key's identity; "" without keys), so stored objects never leak between keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from vlmserve.engine.v1 import engine_pb2 as pb

Order = Literal["asc", "desc"]


@dataclass(frozen=True, slots=True)
class StoredItem:
    """One item and the id it is listed under (the client's `id`, or one the facade assigned)."""

    id: str
    item: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ItemPage:
    items: list[StoredItem]
    has_more: bool


@dataclass(frozen=True, slots=True)
class Replay:
    """Earlier turns, oldest first: as the raw contract messages they were translated to
    (`messages`), or, where any of them was stored before messages were kept, as raw items."""

    messages: list[pb.Message] = field(default_factory=list)
    items: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Maintenance:
    """What one `maintain()` run did."""

    expired_responses: int
    freed_images: int
    freed_pages: int


class StorageQuotaExceededError(Exception):
    """A write would take its owner past `max_stored_bytes`; nothing was written."""

    def __init__(self, *, used: int, quota: int, adding: int) -> None:
        super().__init__(f"{used} + {adding} bytes > {quota}")
        self.used = used
        self.quota = quota
        self.adding = adding


class UnknownCursorError(LookupError):
    """`after` names no item of the listed object."""


class MissingChainLinkError(LookupError):
    """A response in a `previous_response_id` chain no longer exists."""

    def __init__(self, response_id: str) -> None:
        super().__init__(response_id)
        self.response_id = response_id


class Store(Protocol):
    # ---- responses ----
    def put_response(
        self,
        resource: dict[str, Any],
        input_items: Sequence[StoredItem],
        *,
        owner: str = "",
        conversation_id: str | None = None,
        input_messages: Sequence[pb.Message] | None = None,
        max_stored_bytes: int | None = None,
    ) -> None: ...

    def update_response(self, resource: dict[str, Any], *, owner: str = "") -> bool: ...

    def finish_response(
        self,
        resource: dict[str, Any] | None,
        *,
        owner: str = "",
        output_messages: Sequence[pb.Message] | None = None,
        conversation_id: str | None = None,
        conversation_items: Sequence[StoredItem] = (),
        conversation_messages: Sequence[pb.Message] | None = None,
        events: Sequence[dict[str, Any]] = (),
        conversation_model: str | None = None,
    ) -> None: ...

    # ---- facade instances: each holds a lease while it runs (several may share a store) ----
    def start_lease(self, ttl_s: float) -> str: ...

    def renew_lease(self) -> None: ...

    def release_lease(self) -> None: ...

    def fail_unfinished(self, error: dict[str, str]) -> list[str]: ...

    # ---- streaming events of background responses (stream resume) ----
    def append_events(
        self, response_id: str, events: Sequence[dict[str, Any]], *, owner: str = ""
    ) -> int | None: ...

    def list_events(
        self, response_id: str, *, after: int | None = None, limit: int = 1000, owner: str = ""
    ) -> list[dict[str, Any]] | None: ...

    def get_response(self, response_id: str, *, owner: str = "") -> dict[str, Any] | None: ...

    def delete_response(self, response_id: str, *, owner: str = "") -> bool: ...

    def list_input_items(
        self,
        response_id: str,
        *,
        after: str | None = None,
        limit: int = 20,
        order: Order = "desc",
        owner: str = "",
    ) -> ItemPage | None: ...

    def replay(self, response_id: str, *, owner: str = "", max_depth: int = 256) -> Replay | None: ...

    def find_item(self, item_id: str, *, owner: str = "") -> dict[str, Any] | None: ...

    # ---- conversations ----
    def create_conversation(
        self,
        conversation_id: str,
        *,
        metadata: dict[str, str],
        items: Sequence[StoredItem] = (),
        messages: Sequence[pb.Message] | None = None,
        owner: str = "",
        max_stored_bytes: int | None = None,
        model: str | None = None,
    ) -> dict[str, Any]: ...

    def get_conversation(self, conversation_id: str, *, owner: str = "") -> dict[str, Any] | None: ...

    def delete_conversation(self, conversation_id: str, *, owner: str = "") -> bool: ...

    def update_conversation(
        self, conversation_id: str, *, metadata: dict[str, str], owner: str = ""
    ) -> dict[str, Any] | None: ...

    def get_conversation_item(
        self, conversation_id: str, item_id: str, *, owner: str = ""
    ) -> StoredItem | None: ...

    def delete_conversation_item(self, conversation_id: str, item_id: str, *, owner: str = "") -> bool: ...

    def list_conversation_items(
        self,
        conversation_id: str,
        *,
        after: str | None = None,
        limit: int = 20,
        order: Order = "desc",
        owner: str = "",
    ) -> ItemPage | None: ...

    def append_conversation_items(
        self,
        conversation_id: str,
        items: Sequence[StoredItem],
        *,
        messages: Sequence[pb.Message] | None = None,
        owner: str = "",
        max_stored_bytes: int | None = None,
    ) -> bool: ...

    def conversation_replay(self, conversation_id: str, *, owner: str = "") -> Replay | None: ...

    # ---- quotas and upkeep ----
    def stored_bytes(self, owner: str) -> int: ...

    def conversation_bytes(self, conversation_id: str, *, owner: str = "") -> int | None: ...

    def maintain(self, *, expire_before: int | None = None) -> Maintenance: ...

    def close(self) -> None: ...

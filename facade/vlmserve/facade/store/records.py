"""What the store's repositories take and give back, whatever database keeps it: typed records
of responses, items and conversations (each read from its row by `from_row`), pages of items,
replays, what upkeep did, and the errors a write or a read can raise.

The API's JSON for a record is made at the edge (the routes), not here; a record keeps only what
was stored: an item's and a response's JSON as they were written, byte for byte when answered.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from vlmserve.engine.v1 import engine_pb2 as pb

Order = Literal["asc", "desc"]


@dataclass(frozen=True, slots=True)
class StoredItem:
    """One stored item: the id it is listed under (the client's `id`, or one the facade assigned)
    and its JSON, exactly as the client sent it or the response gave it (a listing adds its id
    and defaults at the edge: `responses.resource.listed_item`)."""

    id: str
    item: dict[str, Any]

    @classmethod
    def from_row(cls, item_id: str, item: str | bytes) -> StoredItem:
        """The record of an item row (`item_id`, `item`: the JSON text `database.json_value`
        wrote)."""
        return cls(str(item_id), json.loads(item))

    @property
    def role(self) -> str | None:
        """A message's role (None for an item without one: a tool call, its output, reasoning)."""
        role = self.item.get("role")
        return role if isinstance(role, str) else None


# A response not over yet: queued, or running (here or in another facade sharing the store).
UNFINISHED_STATUSES = ("queued", "in_progress")


@dataclass(frozen=True, slots=True)
class ResponseRecord:
    """A stored response, as the repository takes it (`put`, `update`, `finish`) and gives it
    back (`get`, `cancel`): the fields the store reads of it, and its resource (the API's JSON,
    as it was stored: what retrieving it answers, byte for byte)."""

    id: str
    status: str
    background: bool
    # The model that answered (a later turn without `model` continues with it); None: not stored.
    model: str | None
    resource: dict[str, Any]
    created_at: int = 0
    previous_response_id: str | None = None

    @classmethod
    def from_row(cls, resource: str | bytes) -> ResponseRecord:
        """The record of a response row's `resource` column (its other columns repeat fields
        of it, for queries: `resource_text` and `status` are what a write puts there)."""
        return cls.of(json.loads(resource))

    def resource_text(self) -> str:
        """The `resource` column: the resource's JSON, its fields in their order."""
        return json.dumps(self.resource)

    @classmethod
    def of(cls, resource: dict[str, Any]) -> ResponseRecord:
        """The record of a resource (`ResponseResource.to_json()`, or as it was stored)."""
        model = resource.get("model")
        previous = resource.get("previous_response_id")
        return cls(
            id=str(resource["id"]),
            status=str(resource.get("status")),
            background=bool(resource.get("background")),
            model=model if isinstance(model, str) else None,
            resource=resource,
            created_at=int(resource.get("created_at") or 0),
            previous_response_id=previous if isinstance(previous, str) else None,
        )

    @property
    def unfinished(self) -> bool:
        return self.status in UNFINISHED_STATUSES

    @property
    def cancellable(self) -> bool:
        """A background response not over yet (a foreground one ends with its client)."""
        return self.background and self.unfinished

    def ended(self, status: str, *, error: dict[str, str] | None = None) -> ResponseRecord:
        """This response ended with `status` (and `error`): a new record, its resource's other
        fields, and their order, unchanged."""
        resource = {**self.resource, "status": status}
        if error is not None:
            resource["error"] = dict(error)
        return ResponseRecord.of(resource)

    def output_items(self) -> list[StoredItem]:
        """Its output items, each under its own id ("" for one without)."""
        return [StoredItem(str(item.get("id", "")), item) for item in self.resource.get("output") or []]


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One streaming event of a background response, kept for stream resume: its number, its
    type and its JSON (the API's event: what a resumed stream sends, as it was)."""

    sequence_number: int
    type: str
    event: dict[str, Any]

    @classmethod
    def of(cls, event: dict[str, Any]) -> StoredEvent:
        """The record of an event (`ResponseStreamEvent.to_json()`, or as it was stored)."""
        return cls(int(event["sequence_number"]), str(event["type"]), event)

    @classmethod
    def from_row(cls, event: str | bytes) -> StoredEvent:
        """The record of an event row's `event` column."""
        return cls.of(json.loads(event))

    def event_text(self) -> str:
        """The `event` column, compact (what the event's bytes count), and a resumed stream's
        `data:` line."""
        return json.dumps(self.event, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class ConversationRecord:
    """A stored conversation (its items are listed apart)."""

    id: str
    created_at: int
    metadata: dict[str, str]
    # An extension: the model its responses continue with when they name none (the model of its
    # latest response, else the one it was created with); None until it has one.
    model: str | None = None

    @classmethod
    def from_row(
        cls, conversation_id: str, created_at: int, metadata: str | bytes, model: str | None
    ) -> ConversationRecord:
        """The record of a conversation row (`created_at`, `metadata` as JSON text, `model`)."""
        return cls(str(conversation_id), int(created_at), json.loads(metadata), model)

    def metadata_text(self) -> str:
        """The `metadata` column: what `from_row` reads back (and what its size counts)."""
        return json.dumps(self.metadata)


@dataclass(frozen=True, slots=True)
class ItemPage:
    items: list[StoredItem]
    has_more: bool


@dataclass(frozen=True, slots=True)
class Replay:
    """Earlier turns, oldest first: as the raw contract messages they were translated to
    (`messages`), or, where any of them was stored before messages were kept, as raw items."""

    messages: list[pb.Message] = field(default_factory=list)
    items: list[StoredItem] = field(default_factory=list)

    def raw_items(self) -> list[dict[str, Any]]:
        """`items`' JSON, for the translation (which takes items as a client sends them)."""
        return [stored.item for stored in self.items]


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

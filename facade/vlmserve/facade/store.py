"""Durable store for responses, their raw input items, and conversations (SQLite, WAL).

Input items are kept exactly as the client sent them (images included) so that a replay through
`previous_response_id` or `conversation` re-applies the same translation and lowering and the model
sees the same request. Every row has an `owner` (the API key's identity once authentication exists;
"" until then) and every query filters on it, so stored objects never leak between keys.

The methods are synchronous and thread-safe; the app calls them through `asyncio.to_thread`.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    previous_response_id TEXT,
    conversation_id TEXT,
    resource TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS response_items (
    response_id TEXT NOT NULL REFERENCES responses(id) ON DELETE CASCADE,
    kind TEXT NOT NULL CHECK (kind IN ('input', 'output')),
    position INTEGER NOT NULL,
    item_id TEXT NOT NULL,
    item TEXT NOT NULL,
    PRIMARY KEY (response_id, kind, position)
);
CREATE INDEX IF NOT EXISTS response_items_by_item_id ON response_items(item_id);
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    metadata TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS conversation_items (
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    item_id TEXT NOT NULL,
    item TEXT NOT NULL,
    PRIMARY KEY (conversation_id, position)
);
"""

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


class UnknownCursorError(LookupError):
    """`after` names no item of the listed object."""


class MissingChainLinkError(LookupError):
    """A response in a `previous_response_id` chain no longer exists."""

    def __init__(self, response_id: str) -> None:
        super().__init__(response_id)
        self.response_id = response_id


class ResponseStore:
    def __init__(self, path: Path | str) -> None:
        path_text = str(path)
        if path_text != ":memory:":
            Path(path_text).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path_text, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # In WAL mode NORMAL loses nothing on a process crash (only on an OS crash or power loss).
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _query(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    # ---- responses -------------------------------------------------------------------------

    def put_response(
        self,
        resource: dict[str, Any],
        input_items: Sequence[StoredItem],
        *,
        owner: str = "",
        conversation_id: str | None = None,
    ) -> None:
        """Store a new response (any status) with its raw input items."""
        with self._transaction() as db:
            db.execute(
                "INSERT INTO responses"
                " (id, owner, created_at, previous_response_id, conversation_id, resource)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (
                    resource["id"],
                    owner,
                    int(resource["created_at"]),
                    resource.get("previous_response_id"),
                    conversation_id,
                    json.dumps(resource),
                ),
            )
            db.executemany(
                "INSERT INTO response_items (response_id, kind, position, item_id, item)"
                " VALUES (?, 'input', ?, ?, ?)",
                [(resource["id"], i, s.id, json.dumps(s.item)) for i, s in enumerate(input_items)],
            )
            self._write_outputs(db, resource)

    def update_response(self, resource: dict[str, Any], *, owner: str = "") -> bool:
        """Replace a stored response's resource (its status, output, usage); False if it is gone."""
        with self._transaction() as db:
            return self._update_response(db, resource, owner)

    def finish_response(
        self,
        resource: dict[str, Any] | None,
        *,
        owner: str = "",
        conversation_id: str | None = None,
        conversation_items: Sequence[StoredItem] = (),
    ) -> None:
        """In one transaction: a response's final state (None: not stored) and the items it adds
        to its conversation (a conversation deleted meanwhile gets nothing)."""
        with self._transaction() as db:
            if resource is not None:
                self._update_response(db, resource, owner)
            if conversation_id is not None and self._owns_conversation(db, conversation_id, owner):
                self._append_at_end(db, conversation_id, conversation_items)

    def _update_response(self, db: sqlite3.Connection, resource: dict[str, Any], owner: str) -> bool:
        cursor = db.execute(
            "UPDATE responses SET resource = ? WHERE id = ? AND owner = ?",
            (json.dumps(resource), resource["id"], owner),
        )
        if cursor.rowcount == 0:
            return False
        db.execute("DELETE FROM response_items WHERE response_id = ? AND kind = 'output'", (resource["id"],))
        self._write_outputs(db, resource)
        return True

    def fail_unfinished(self, error: dict[str, str]) -> list[str]:
        """Mark every response still `queued` or `in_progress`, whoever owns it, `failed` with
        `error`; their ids. Only for start-up: it assumes no generation of this store runs, which
        holds while one facade process owns the store."""
        with self._transaction() as db:
            rows = db.execute(
                "SELECT id, resource FROM responses"
                " WHERE json_extract(resource, '$.status') IN ('queued', 'in_progress')"
            ).fetchall()
            for response_id, text in rows:
                resource = json.loads(text)
                resource["status"] = "failed"
                resource["error"] = dict(error)
                db.execute(
                    "UPDATE responses SET resource = ? WHERE id = ?", (json.dumps(resource), response_id)
                )
        return [response_id for response_id, _ in rows]

    @staticmethod
    def _write_outputs(db: sqlite3.Connection, resource: dict[str, Any]) -> None:
        db.executemany(
            "INSERT INTO response_items (response_id, kind, position, item_id, item)"
            " VALUES (?, 'output', ?, ?, ?)",
            [
                (resource["id"], i, str(item.get("id", "")), json.dumps(item))
                for i, item in enumerate(resource.get("output") or [])
            ],
        )

    def get_response(self, response_id: str, *, owner: str = "") -> dict[str, Any] | None:
        rows = self._query("SELECT resource FROM responses WHERE id = ? AND owner = ?", (response_id, owner))
        return json.loads(rows[0][0]) if rows else None

    def delete_response(self, response_id: str, *, owner: str = "") -> bool:
        with self._transaction() as db:
            cursor = db.execute("DELETE FROM responses WHERE id = ? AND owner = ?", (response_id, owner))
            return cursor.rowcount > 0

    def list_input_items(
        self,
        response_id: str,
        *,
        after: str | None = None,
        limit: int = 20,
        order: Order = "desc",
        owner: str = "",
    ) -> ItemPage | None:
        """A page of a response's input items; None when the response is unknown."""
        if self.get_response(response_id, owner=owner) is None:
            return None
        rows = self._query(
            "SELECT position, item_id, item FROM response_items WHERE response_id = ? AND kind = 'input'"
            " ORDER BY position",
            (response_id,),
        )
        items = [StoredItem(item_id, json.loads(item)) for _, item_id, item in rows]
        return _page(items, after=after, limit=limit, order=order)

    def replay_items(
        self, response_id: str, *, owner: str = "", max_depth: int = 256
    ) -> list[dict[str, Any]] | None:
        """Everything the model saw and said up to and including `response_id`, oldest first.

        None when `response_id` is unknown; MissingChainLinkError when an older link was deleted.
        """
        chain: list[str] = []
        current: str | None = response_id
        while current is not None and len(chain) < max_depth:
            rows = self._query(
                "SELECT previous_response_id FROM responses WHERE id = ? AND owner = ?", (current, owner)
            )
            if not rows:
                if not chain:
                    return None
                raise MissingChainLinkError(current)
            chain.append(current)
            current = rows[0][0]
        items: list[dict[str, Any]] = []
        for link in reversed(chain):
            rows = self._query(
                "SELECT item FROM response_items WHERE response_id = ?"
                " ORDER BY CASE kind WHEN 'input' THEN 0 ELSE 1 END, position",
                (link,),
            )
            items.extend(json.loads(item) for (item,) in rows)
        return items

    def find_item(self, item_id: str, *, owner: str = "") -> dict[str, Any] | None:
        """The most recently stored item with this id (for `item_reference`): the last one written
        to a response, else to a conversation (rowids grow with every insert)."""
        rows = self._query(
            "SELECT i.item FROM response_items i JOIN responses r ON r.id = i.response_id"
            " WHERE i.item_id = ? AND r.owner = ? ORDER BY i.rowid DESC LIMIT 1",
            (item_id, owner),
        )
        if rows:
            found: dict[str, Any] = json.loads(rows[0][0])
            return found
        rows = self._query(
            "SELECT i.item FROM conversation_items i JOIN conversations c ON c.id = i.conversation_id"
            " WHERE i.item_id = ? AND c.owner = ? ORDER BY i.rowid DESC LIMIT 1",
            (item_id, owner),
        )
        return json.loads(rows[0][0]) if rows else None

    # ---- conversations ---------------------------------------------------------------------

    def create_conversation(
        self,
        conversation_id: str,
        *,
        metadata: dict[str, str],
        items: Sequence[StoredItem] = (),
        owner: str = "",
    ) -> dict[str, Any]:
        created_at = int(time.time())
        with self._transaction() as db:
            db.execute(
                "INSERT INTO conversations (id, owner, created_at, metadata) VALUES (?, ?, ?, ?)",
                (conversation_id, owner, created_at, json.dumps(metadata)),
            )
            self._append(db, conversation_id, items, start=0)
        return _conversation_object(conversation_id, created_at, metadata)

    def get_conversation(self, conversation_id: str, *, owner: str = "") -> dict[str, Any] | None:
        rows = self._query(
            "SELECT created_at, metadata FROM conversations WHERE id = ? AND owner = ?",
            (conversation_id, owner),
        )
        return _conversation_object(conversation_id, rows[0][0], json.loads(rows[0][1])) if rows else None

    def delete_conversation(self, conversation_id: str, *, owner: str = "") -> bool:
        with self._transaction() as db:
            cursor = db.execute(
                "DELETE FROM conversations WHERE id = ? AND owner = ?", (conversation_id, owner)
            )
            return cursor.rowcount > 0

    def conversation_items(self, conversation_id: str, *, owner: str = "") -> list[StoredItem] | None:
        """All items of a conversation, oldest first; None when the conversation is unknown."""
        if self.get_conversation(conversation_id, owner=owner) is None:
            return None
        rows = self._query(
            "SELECT item_id, item FROM conversation_items WHERE conversation_id = ? ORDER BY position",
            (conversation_id,),
        )
        return [StoredItem(item_id, json.loads(item)) for item_id, item in rows]

    def list_conversation_items(
        self,
        conversation_id: str,
        *,
        after: str | None = None,
        limit: int = 20,
        order: Order = "desc",
        owner: str = "",
    ) -> ItemPage | None:
        items = self.conversation_items(conversation_id, owner=owner)
        return None if items is None else _page(items, after=after, limit=limit, order=order)

    def append_conversation_items(
        self, conversation_id: str, items: Sequence[StoredItem], *, owner: str = ""
    ) -> bool:
        """Add items at the end of a conversation; False when it is gone."""
        with self._transaction() as db:
            if not self._owns_conversation(db, conversation_id, owner):
                return False
            self._append_at_end(db, conversation_id, items)
            return True

    @staticmethod
    def _owns_conversation(db: sqlite3.Connection, conversation_id: str, owner: str) -> bool:
        return bool(
            db.execute(
                "SELECT 1 FROM conversations WHERE id = ? AND owner = ?", (conversation_id, owner)
            ).fetchall()
        )

    def _append_at_end(
        self, db: sqlite3.Connection, conversation_id: str, items: Sequence[StoredItem]
    ) -> None:
        (count,) = db.execute(
            "SELECT COUNT(*) FROM conversation_items WHERE conversation_id = ?", (conversation_id,)
        ).fetchone()
        self._append(db, conversation_id, items, start=int(count))

    @staticmethod
    def _append(
        db: sqlite3.Connection, conversation_id: str, items: Sequence[StoredItem], *, start: int
    ) -> None:
        db.executemany(
            "INSERT INTO conversation_items (conversation_id, position, item_id, item) VALUES (?, ?, ?, ?)",
            [(conversation_id, start + i, s.id, json.dumps(s.item)) for i, s in enumerate(items)],
        )


def _conversation_object(conversation_id: str, created_at: int, metadata: dict[str, str]) -> dict[str, Any]:
    return {"id": conversation_id, "object": "conversation", "created_at": created_at, "metadata": metadata}


def _page(items: list[StoredItem], *, after: str | None, limit: int, order: Order) -> ItemPage:
    ordered = items if order == "asc" else list(reversed(items))
    if after is not None:
        index = next((i for i, s in enumerate(ordered) if s.id == after), None)
        if index is None:
            raise UnknownCursorError(after)
        ordered = ordered[index + 1 :]
    return ItemPage(items=ordered[:limit], has_more=len(ordered) > limit)

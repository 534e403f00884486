"""The SQLite store (WAL): responses, their items, conversations; all the facade's SQL is here.

Kept per response: its resource, its raw input items exactly as the client sent them (for
`input_items`, images included) and its output items; and, for replays, the raw contract
messages its input and its output were translated to (`message_codec`), images by content hash
in `images`. A later turn replays those messages instead of translating the items (and
decoding their images) again, so a turn costs its own items, not the whole chain's. Responses
stored before messages were kept replay from their raw items.

Space: every response and conversation carries its `size` in bytes (JSON, messages, and the
bytes of the images it uses), summed per owner in `usage` for quotas. Deleting frees images no
longer used and returns the pages to the file system (auto_vacuum INCREMENTAL).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vlmserve.engine.v1 import engine_pb2 as pb

from .message_codec import EncodedMessages, MessageCache, decode_messages, encode_messages
from .storage import (
    ItemPage,
    Maintenance,
    MissingChainLinkError,
    Order,
    Replay,
    StoredItem,
    UnknownCursorError,
)

__all__ = [
    "ItemPage",
    "MissingChainLinkError",
    "Order",
    "Replay",
    "ResponseStore",
    "StoredItem",
    "UnknownCursorError",
]

SCHEMA_VERSION = 2

_TABLES = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    previous_response_id TEXT,
    conversation_id TEXT,
    resource TEXT NOT NULL,
    input_size INTEGER NOT NULL DEFAULT 0,
    size INTEGER NOT NULL DEFAULT 0,
    events_size INTEGER NOT NULL DEFAULT 0
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
    metadata TEXT NOT NULL,
    size INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS conversation_items (
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    item_id TEXT NOT NULL,
    item TEXT NOT NULL,
    PRIMARY KEY (conversation_id, position)
);
"""

# Added in schema version 1 (also to stores made before it).
_TABLES_V1 = """
CREATE INDEX IF NOT EXISTS responses_by_created_at ON responses(created_at);
CREATE INDEX IF NOT EXISTS conversation_items_by_item_id ON conversation_items(item_id);
CREATE INDEX IF NOT EXISTS conversation_items_cursor
    ON conversation_items(conversation_id, item_id, position);
CREATE INDEX IF NOT EXISTS response_items_cursor ON response_items(response_id, kind, item_id, position);
CREATE TABLE IF NOT EXISTS usage (owner TEXT PRIMARY KEY, bytes INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS images (hash TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS response_messages (
    response_id TEXT NOT NULL REFERENCES responses(id) ON DELETE CASCADE,
    kind TEXT NOT NULL CHECK (kind IN ('input', 'output')),
    messages BLOB NOT NULL,
    images TEXT NOT NULL,
    PRIMARY KEY (response_id, kind)
);
CREATE TABLE IF NOT EXISTS response_images (
    response_id TEXT NOT NULL REFERENCES responses(id) ON DELETE CASCADE,
    hash TEXT NOT NULL,
    PRIMARY KEY (response_id, hash)
);
CREATE INDEX IF NOT EXISTS response_images_by_hash ON response_images(hash);
CREATE TABLE IF NOT EXISTS conversation_messages (
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    item_count INTEGER NOT NULL,
    messages BLOB NOT NULL,
    images TEXT NOT NULL,
    PRIMARY KEY (conversation_id, position)
);
CREATE TABLE IF NOT EXISTS conversation_images (
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    hash TEXT NOT NULL,
    PRIMARY KEY (conversation_id, hash)
);
CREATE INDEX IF NOT EXISTS conversation_images_by_hash ON conversation_images(hash);
"""

# Added in schema version 2: the streaming events of background responses, for stream resume.
# Their bytes count in the response's size (`events_size`), so in its owner's quota.
_TABLES_V2 = """
CREATE TABLE IF NOT EXISTS response_events (
    response_id TEXT NOT NULL REFERENCES responses(id) ON DELETE CASCADE,
    sequence_number INTEGER NOT NULL,
    event TEXT NOT NULL,
    PRIMARY KEY (response_id, sequence_number)
);
"""

# SQLite's bound on `?` parameters per statement is 32766 since 3.32; stay well below.
_BATCH = 500


# Decoded messages kept in memory for the next turns of recent chains and conversations.
DEFAULT_CACHE_BYTES = 256 * 1024 * 1024


class ResponseStore:
    def __init__(self, path: Path | str, *, cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self._cache = MessageCache(cache_bytes)
        self._appended: list[tuple[tuple[str, str], Sequence[pb.Message]]] = []
        path_text = str(path)
        if path_text != ":memory:":
            Path(path_text).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path_text, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA busy_timeout=5000")
        # Takes effect on a new file (before any table exists); an older one is switched over
        # by a VACUUM in _migrate.
        self._db.execute("PRAGMA auto_vacuum=INCREMENTAL")
        self._db.execute("PRAGMA journal_mode=WAL")
        # In WAL mode NORMAL loses nothing on a process crash (only on an OS crash or power loss).
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._migrate()

    def _migrate(self) -> None:
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        if version >= SCHEMA_VERSION:
            return
        existed = bool(self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'responses'").fetchall())
        with self._transaction() as db:
            _run_script(db, _TABLES)
            if existed:
                _add_missing_columns(db)
            _run_script(db, _TABLES_V1)
            if existed and version < 1:
                _backfill_sizes(db)
            _run_script(db, _TABLES_V2)
            if existed:
                _add_column(db, "responses", "events_size")
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        (auto_vacuum,) = self._db.execute("PRAGMA auto_vacuum").fetchone()
        if auto_vacuum != _AUTO_VACUUM_INCREMENTAL:
            self._db.execute("VACUUM")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._appended.clear()
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            # Conversation messages appended by this transaction: cached only now it holds.
            for key, messages in self._appended:
                self._cache.put(key, messages)

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
        input_messages: Sequence[pb.Message] | None = None,
    ) -> None:
        """Store a new response (any status) with its raw input items and, for replays, the
        contract messages they were translated to (None: replays translate the items again)."""
        response_id = resource["id"]
        resource_text = json.dumps(resource)
        items = [(s.id, json.dumps(s.item)) for s in input_items]
        encoded = encode_messages(input_messages) if input_messages is not None else None
        input_size = sum(len(text) for _, text in items) + (_encoded_size(encoded) if encoded else 0)
        with self._transaction() as db:
            db.execute(
                "INSERT INTO responses (id, owner, created_at, previous_response_id, conversation_id,"
                " resource, input_size, size) VALUES (?, ?, ?, ?, ?, ?, ?, 0)",
                (
                    response_id,
                    owner,
                    int(resource["created_at"]),
                    resource.get("previous_response_id"),
                    conversation_id,
                    resource_text,
                    input_size,
                ),
            )
            db.executemany(
                "INSERT INTO response_items (response_id, kind, position, item_id, item)"
                " VALUES (?, 'input', ?, ?, ?)",
                [(response_id, i, item_id, text) for i, (item_id, text) in enumerate(items)],
            )
            output_size = self._write_outputs(db, resource)
            if encoded is not None:
                # An empty output until the response finishes: the response replays either way.
                self._write_response_messages(db, response_id, "input", encoded)
                output_size += self._write_response_messages(db, response_id, "output", encode_messages([]))
            self._set_response_size(db, response_id, owner, input_size + len(resource_text) + output_size)
        if input_messages is not None:
            self._cache.put((response_id, "input"), input_messages)
            self._cache.put((response_id, "output"), [])

    def update_response(self, resource: dict[str, Any], *, owner: str = "") -> bool:
        """Replace a stored response's resource (its status, output, usage); False if it is gone.
        Its output messages are dropped: replays then translate its output items."""
        with self._transaction() as db:
            updated = self._update_response(db, resource, owner, None)
        self._cache.drop((resource["id"], "output"))
        return updated

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
    ) -> None:
        """In one transaction: a response's final state (None: not stored) with the messages
        its output was translated to, its last streaming `events` (background responses: see
        `append_events`), and the items (and messages) it adds to its conversation (a
        conversation deleted meanwhile gets nothing)."""
        encoded = encode_messages(output_messages) if output_messages is not None else None
        with self._transaction() as db:
            if resource is not None and events:
                self._append_events(db, resource["id"], owner, events)
            updated = resource is not None and self._update_response(db, resource, owner, encoded)
            if conversation_id is not None and conversation_items:
                self._append(db, conversation_id, owner, conversation_items, conversation_messages)
        if resource is not None:
            if updated and output_messages is not None:
                self._cache.put((resource["id"], "output"), output_messages)
            else:
                self._cache.drop((resource["id"], "output"))

    def _update_response(
        self, db: sqlite3.Connection, resource: dict[str, Any], owner: str, output: EncodedMessages | None
    ) -> bool:
        response_id = resource["id"]
        rows = db.execute(
            "SELECT input_size + events_size FROM responses WHERE id = ? AND owner = ?", (response_id, owner)
        ).fetchall()
        if not rows:
            return False
        resource_text = json.dumps(resource)
        db.execute("UPDATE responses SET resource = ? WHERE id = ?", (resource_text, response_id))
        db.execute("DELETE FROM response_items WHERE response_id = ? AND kind = 'output'", (response_id,))
        size = rows[0][0] + len(resource_text) + self._write_outputs(db, resource)
        if output is not None:
            size += self._write_response_messages(db, response_id, "output", output)
        else:
            db.execute(
                "DELETE FROM response_messages WHERE response_id = ? AND kind = 'output'", (response_id,)
            )
        self._set_response_size(db, response_id, owner, size)
        return True

    def fail_unfinished(self, error: dict[str, str]) -> list[str]:
        """Mark every response still `queued` or `in_progress`, whoever owns it, `failed` with
        `error`; their ids. A background response also gets its terminal `response.failed`
        event, so a stream resumed after the restart ends. Only for start-up: it assumes no
        generation of this store runs, which holds while one facade process owns the store."""
        with self._transaction() as db:
            rows = db.execute(
                "SELECT id, owner, resource FROM responses"
                " WHERE json_extract(resource, '$.status') IN ('queued', 'in_progress')"
            ).fetchall()
            for response_id, owner, text in rows:
                resource = json.loads(text)
                resource["status"] = "failed"
                resource["error"] = dict(error)
                if resource.get("background"):
                    self._append_events(db, response_id, owner, [_failed_event(db, response_id, resource)])
                db.execute(
                    "UPDATE responses SET resource = ? WHERE id = ?", (json.dumps(resource), response_id)
                )
        return [response_id for response_id, _, _ in rows]

    def append_events(
        self, response_id: str, events: Sequence[dict[str, Any]], *, owner: str = ""
    ) -> int | None:
        """Store streaming events of a response (each with its `sequence_number`; one already
        stored is kept as it was); the bytes its events now take, None when the response is
        not stored (deleted meanwhile). The bytes count in its size and its owner's usage."""
        with self._transaction() as db:
            return self._append_events(db, response_id, owner, events)

    @staticmethod
    def _append_events(
        db: sqlite3.Connection, response_id: str, owner: str, events: Sequence[dict[str, Any]]
    ) -> int | None:
        rows = db.execute(
            "SELECT events_size FROM responses WHERE id = ? AND owner = ?", (response_id, owner)
        ).fetchall()
        if not rows:
            return None
        added = 0
        for event in events:
            text = json.dumps(event, separators=(",", ":"))
            inserted = db.execute(
                "INSERT OR IGNORE INTO response_events (response_id, sequence_number, event)"
                " VALUES (?, ?, ?)",
                (response_id, int(event["sequence_number"]), text),
            ).rowcount
            added += len(text) if inserted else 0
        if added:
            db.execute(
                "UPDATE responses SET events_size = events_size + ?, size = size + ? WHERE id = ?",
                (added, added, response_id),
            )
            _add_usage(db, owner, added)
        return int(rows[0][0]) + added

    def list_events(
        self, response_id: str, *, after: int | None = None, limit: int = 1000, owner: str = ""
    ) -> list[dict[str, Any]] | None:
        """Up to `limit` stored events of a response with a sequence number above `after`
        (None: from the first), in order; None when the response is not stored."""
        if not self._query("SELECT 1 FROM responses WHERE id = ? AND owner = ?", (response_id, owner)):
            return None
        rows = self._query(
            "SELECT event FROM response_events WHERE response_id = ? AND sequence_number > ?"
            " ORDER BY sequence_number LIMIT ?",
            (response_id, -1 if after is None else after, limit),
        )
        return [json.loads(event) for (event,) in rows]

    @staticmethod
    def _write_outputs(db: sqlite3.Connection, resource: dict[str, Any]) -> int:
        rows = [
            (resource["id"], i, str(item.get("id", "")), json.dumps(item))
            for i, item in enumerate(resource.get("output") or [])
        ]
        db.executemany(
            "INSERT INTO response_items (response_id, kind, position, item_id, item)"
            " VALUES (?, 'output', ?, ?, ?)",
            rows,
        )
        return sum(len(row[3]) for row in rows)

    @staticmethod
    def _write_response_messages(
        db: sqlite3.Connection, response_id: str, kind: str, encoded: EncodedMessages
    ) -> int:
        db.execute(
            "INSERT OR REPLACE INTO response_messages (response_id, kind, messages, images)"
            " VALUES (?, ?, ?, ?)",
            (response_id, kind, encoded.blob, json.dumps(encoded.image_hashes)),
        )
        _put_images(db, encoded.images)
        db.executemany(
            "INSERT OR IGNORE INTO response_images (response_id, hash) VALUES (?, ?)",
            [(response_id, digest) for digest in encoded.images],
        )
        return _encoded_size(encoded)

    @staticmethod
    def _set_response_size(db: sqlite3.Connection, response_id: str, owner: str, size: int) -> None:
        (old,) = db.execute("SELECT size FROM responses WHERE id = ?", (response_id,)).fetchone()
        db.execute("UPDATE responses SET size = ? WHERE id = ?", (size, response_id))
        _add_usage(db, owner, size - old)

    def get_response(self, response_id: str, *, owner: str = "") -> dict[str, Any] | None:
        rows = self._query("SELECT resource FROM responses WHERE id = ? AND owner = ?", (response_id, owner))
        return json.loads(rows[0][0]) if rows else None

    def delete_response(self, response_id: str, *, owner: str = "") -> bool:
        with self._transaction() as db:
            deleted = self._delete_responses(db, [(response_id, owner)])
        if deleted:
            self._vacuum()
        return deleted > 0

    def _delete_responses(self, db: sqlite3.Connection, keys: Iterable[tuple[str, str]]) -> int:
        """Delete responses by (id, owner), keeping `usage` right and freeing unused images."""
        deleted = 0
        hashes: set[str] = set()
        for response_id, owner in keys:
            used = db.execute("SELECT hash FROM response_images WHERE response_id = ?", (response_id,))
            hashes.update(digest for (digest,) in used)
            rows = db.execute(
                "DELETE FROM responses WHERE id = ? AND owner = ? RETURNING size", (response_id, owner)
            ).fetchall()
            if rows:
                deleted += 1
                _add_usage(db, owner, -int(rows[0][0]))
                self._cache.forget(response_id)
        # The cascade removed their response_images rows: free what nothing else uses.
        _free_unused_images(db, hashes)
        return deleted

    def list_input_items(
        self,
        response_id: str,
        *,
        after: str | None = None,
        limit: int = 20,
        order: Order = "desc",
        owner: str = "",
    ) -> ItemPage | None:
        """A page of a response's input items; None when the response is unknown. Reads only
        the page (and its cursor), however many items the response has."""
        if self.get_response(response_id, owner=owner) is None:
            return None
        return self._page(
            "response_items", "response_id = ? AND kind = 'input'", (response_id,), after, limit, order
        )

    def _page(
        self, table: str, where: str, key: tuple[Any, ...], after: str | None, limit: int, order: Order
    ) -> ItemPage:
        direction, compare = ("ASC", ">") if order == "asc" else ("DESC", "<")
        condition, params = where, list(key)
        if after is not None:
            rows = self._query(
                f"SELECT position FROM {table} WHERE {where} AND item_id = ?"
                f" ORDER BY position {direction} LIMIT 1",
                (*key, after),
            )
            if not rows:
                raise UnknownCursorError(after)
            condition += f" AND position {compare} ?"
            params.append(rows[0][0])
        rows = self._query(
            f"SELECT item_id, item FROM {table} WHERE {condition} ORDER BY position {direction} LIMIT ?",
            (*params, limit + 1),
        )
        items = [StoredItem(item_id, json.loads(item)) for item_id, item in rows[:limit]]
        return ItemPage(items=items, has_more=len(rows) > limit)

    def _chain(self, response_id: str, owner: str, max_depth: int) -> list[str] | None:
        """The ids of a `previous_response_id` chain, newest first (at most `max_depth`)."""
        rows = self._query(
            "WITH RECURSIVE chain(id, previous, depth) AS ("
            " SELECT id, previous_response_id, 1 FROM responses WHERE id = ? AND owner = ?"
            " UNION ALL"
            " SELECT r.id, r.previous_response_id, c.depth + 1 FROM responses r"
            " JOIN chain c ON r.id = c.previous AND r.owner = ? WHERE c.depth < ?"
            ") SELECT id, previous, depth FROM chain ORDER BY depth",
            (response_id, owner, owner, max_depth),
        )
        if not rows:
            return None
        _, previous, depth = rows[-1]
        if previous is not None and depth < max_depth:
            raise MissingChainLinkError(previous)
        return [row[0] for row in rows]

    def replay(self, response_id: str, *, owner: str = "", max_depth: int = 256) -> Replay | None:
        """Everything the model saw and said up to and including `response_id`, oldest first.

        None when `response_id` is unknown; MissingChainLinkError when an older link was deleted.
        """
        chain = self._chain(response_id, owner, max_depth)
        if chain is None:
            return None
        links = list(reversed(chain))
        keys = [(link, kind) for link in links for kind in ("input", "output")]
        found: dict[tuple[str, str], list[pb.Message]] = {}
        for key in keys:
            cached = self._cache.get(key)
            if cached is not None:
                found[key] = cached
        missing = sorted(
            {link for link, _ in keys if (link, "input") not in found or (link, "output") not in found}
        )
        stored: dict[tuple[str, str], tuple[bytes, list[str]]] = {}
        for batch in _batches(missing):
            marks = ",".join("?" * len(batch))
            for link, kind, blob, hashes in self._query(
                f"SELECT response_id, kind, messages, images FROM response_messages"
                f" WHERE response_id IN ({marks})",
                batch,
            ):
                stored[(link, kind)] = (blob, json.loads(hashes))
        wanted = [key for key in keys if key not in found]
        if any(key not in stored for key in wanted):
            return Replay(items=self._replay_items(links))
        for key, messages in zip(wanted, self._decode([stored[key] for key in wanted]), strict=True):
            self._cache.put(key, messages)
            found[key] = messages
        return Replay(messages=[message for key in keys for message in found[key]])

    def replay_items(
        self, response_id: str, *, owner: str = "", max_depth: int = 256
    ) -> list[dict[str, Any]] | None:
        """The raw items of a chain, oldest first (what `replay` falls back to)."""
        chain = self._chain(response_id, owner, max_depth)
        return None if chain is None else self._replay_items(list(reversed(chain)))

    def _replay_items(self, links: Sequence[str]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        for link in links:
            rows = self._query(
                "SELECT item FROM response_items WHERE response_id = ?"
                " ORDER BY CASE kind WHEN 'input' THEN 0 ELSE 1 END, position",
                (link,),
            )
            items.extend(json.loads(item) for (item,) in rows)
        return items

    def _decode(self, stored: Sequence[tuple[bytes, list[str]]]) -> list[list[pb.Message]]:
        """Each stored (blob, image hashes) as its messages, images read in one go."""
        wanted = sorted({digest for _, hashes in stored for digest in hashes})
        images: dict[str, bytes] = {}
        for batch in _batches(wanted):
            marks = ",".join("?" * len(batch))
            images.update(self._query(f"SELECT hash, data FROM images WHERE hash IN ({marks})", batch))
        return [decode_messages(blob, hashes, images) for blob, hashes in stored]

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
        messages: Sequence[pb.Message] | None = None,
        owner: str = "",
    ) -> dict[str, Any]:
        created_at = int(time.time())
        metadata_text = json.dumps(metadata)
        with self._transaction() as db:
            db.execute(
                "INSERT INTO conversations (id, owner, created_at, metadata, size) VALUES (?, ?, ?, ?, ?)",
                (conversation_id, owner, created_at, metadata_text, len(metadata_text)),
            )
            _add_usage(db, owner, len(metadata_text))
            if items:
                self._append(db, conversation_id, owner, items, messages)
        return _conversation_object(conversation_id, created_at, metadata)

    def get_conversation(self, conversation_id: str, *, owner: str = "") -> dict[str, Any] | None:
        rows = self._query(
            "SELECT created_at, metadata FROM conversations WHERE id = ? AND owner = ?",
            (conversation_id, owner),
        )
        return _conversation_object(conversation_id, rows[0][0], json.loads(rows[0][1])) if rows else None

    def delete_conversation(self, conversation_id: str, *, owner: str = "") -> bool:
        with self._transaction() as db:
            used = db.execute(
                "SELECT hash FROM conversation_images WHERE conversation_id = ?", (conversation_id,)
            )
            hashes = {digest for (digest,) in used}
            rows = db.execute(
                "DELETE FROM conversations WHERE id = ? AND owner = ? RETURNING size",
                (conversation_id, owner),
            ).fetchall()
            if rows:
                _add_usage(db, owner, -int(rows[0][0]))
                _free_unused_images(db, hashes)
        self._cache.forget(conversation_id)
        if rows:
            self._vacuum()
        return bool(rows)

    def update_conversation(
        self, conversation_id: str, *, metadata: dict[str, str], owner: str = ""
    ) -> dict[str, Any] | None:
        """Replace a conversation's metadata; None when it is gone."""
        metadata_text = json.dumps(metadata)
        with self._transaction() as db:
            rows = db.execute(
                "SELECT created_at, metadata FROM conversations WHERE id = ? AND owner = ?",
                (conversation_id, owner),
            ).fetchall()
            if not rows:
                return None
            change = len(metadata_text) - len(rows[0][1])
            db.execute(
                "UPDATE conversations SET metadata = ?, size = size + ? WHERE id = ?",
                (metadata_text, change, conversation_id),
            )
            _add_usage(db, owner, change)
        return _conversation_object(conversation_id, rows[0][0], metadata)

    def get_conversation_item(
        self, conversation_id: str, item_id: str, *, owner: str = ""
    ) -> StoredItem | None:
        rows = self._query(
            "SELECT i.item FROM conversation_items i JOIN conversations c ON c.id = i.conversation_id"
            " WHERE i.conversation_id = ? AND i.item_id = ? AND c.owner = ? ORDER BY i.position LIMIT 1",
            (conversation_id, item_id, owner),
        )
        return StoredItem(item_id, json.loads(rows[0][0])) if rows else None

    def delete_conversation_item(self, conversation_id: str, item_id: str, *, owner: str = "") -> bool:
        """Remove one item. The stored contract messages of the batch it was added with go too:
        the conversation then replays by translating its raw items (see conversation_replay)."""
        with self._transaction() as db:
            rows = db.execute(
                "SELECT i.position, length(i.item) FROM conversation_items i"
                " JOIN conversations c ON c.id = i.conversation_id"
                " WHERE i.conversation_id = ? AND i.item_id = ? AND c.owner = ? ORDER BY i.position LIMIT 1",
                (conversation_id, item_id, owner),
            ).fetchall()
            if not rows:
                return False
            position, size = rows[0]
            db.execute(
                "DELETE FROM conversation_items WHERE conversation_id = ? AND position = ?",
                (conversation_id, position),
            )
            chunks = db.execute(
                "DELETE FROM conversation_messages WHERE conversation_id = ? AND position <= ?"
                " AND position + item_count > ? RETURNING length(messages)",
                (conversation_id, position, position),
            ).fetchall()
            size += sum(int(length) for (length,) in chunks)
            db.execute(
                "UPDATE conversations SET size = MAX(size - ?, 0) WHERE id = ?", (size, conversation_id)
            )
            _add_usage(db, owner, -size)
        self._cache.forget(conversation_id)
        return True

    def list_conversation_items(
        self,
        conversation_id: str,
        *,
        after: str | None = None,
        limit: int = 20,
        order: Order = "desc",
        owner: str = "",
    ) -> ItemPage | None:
        """A page of a conversation's items; reads only that page (and its cursor)."""
        if self.get_conversation(conversation_id, owner=owner) is None:
            return None
        return self._page(
            "conversation_items", "conversation_id = ?", (conversation_id,), after, limit, order
        )

    def append_conversation_items(
        self,
        conversation_id: str,
        items: Sequence[StoredItem],
        *,
        messages: Sequence[pb.Message] | None = None,
        owner: str = "",
    ) -> bool:
        """Add items (and the contract messages they were translated to) at the end of a
        conversation; False when it is gone."""
        with self._transaction() as db:
            return self._append(db, conversation_id, owner, items, messages)

    def _append(
        self,
        db: sqlite3.Connection,
        conversation_id: str,
        owner: str,
        items: Sequence[StoredItem],
        messages: Sequence[pb.Message] | None,
    ) -> bool:
        if not db.execute(
            "SELECT 1 FROM conversations WHERE id = ? AND owner = ?", (conversation_id, owner)
        ).fetchall():
            return False
        # After the last position, not the count: deleted items leave gaps.
        (start,) = db.execute(
            "SELECT COALESCE(MAX(position) + 1, 0) FROM conversation_items WHERE conversation_id = ?",
            (conversation_id,),
        ).fetchone()
        rows = [(conversation_id, start + i, s.id, json.dumps(s.item)) for i, s in enumerate(items)]
        db.executemany(
            "INSERT INTO conversation_items (conversation_id, position, item_id, item) VALUES (?, ?, ?, ?)",
            rows,
        )
        size = sum(len(row[3]) for row in rows)
        if messages is not None:
            encoded = encode_messages(messages)
            db.execute(
                "INSERT INTO conversation_messages (conversation_id, position, item_count, messages, images)"
                " VALUES (?, ?, ?, ?, ?)",
                (conversation_id, start, len(items), encoded.blob, json.dumps(encoded.image_hashes)),
            )
            _put_images(db, encoded.images)
            db.executemany(
                "INSERT OR IGNORE INTO conversation_images (conversation_id, hash) VALUES (?, ?)",
                [(conversation_id, digest) for digest in encoded.images],
            )
            size += _encoded_size(encoded)
        db.execute("UPDATE conversations SET size = size + ? WHERE id = ?", (size, conversation_id))
        if messages is not None:
            # For the cache, once the transaction has committed (see _cache_appended).
            self._appended.append(((conversation_id, str(start)), messages))
        _add_usage(db, owner, size)
        return True

    def conversation_replay(self, conversation_id: str, *, owner: str = "") -> Replay | None:
        """A conversation's items, oldest first: as contract messages when every item has them
        (items added by older versions have not), else as raw items."""
        if self.get_conversation(conversation_id, owner=owner) is None:
            return None
        chunks = self._query(
            "SELECT position, item_count FROM conversation_messages"
            " WHERE conversation_id = ? ORDER BY position",
            (conversation_id,),
        )
        (count,) = self._query(
            "SELECT COUNT(*) FROM conversation_items WHERE conversation_id = ?", (conversation_id,)
        )[0]
        if sum(item_count for _, item_count in chunks) != count:
            items = self._query(
                "SELECT item FROM conversation_items WHERE conversation_id = ? ORDER BY position",
                (conversation_id,),
            )
            return Replay(items=[json.loads(item) for (item,) in items])
        keys = [(conversation_id, str(position)) for position, _ in chunks]
        found = {key: cached for key in keys if (cached := self._cache.get(key)) is not None}
        wanted = [key for key in keys if key not in found]
        stored: dict[tuple[str, str], tuple[bytes, list[str]]] = {}
        if wanted:
            rows = self._query(
                "SELECT position, messages, images FROM conversation_messages"
                " WHERE conversation_id = ? AND position >= ?",
                (conversation_id, min(int(position) for _, position in wanted)),
            )
            stored = {
                (conversation_id, str(position)): (blob, json.loads(hashes))
                for position, blob, hashes in rows
            }
        for key, messages in zip(wanted, self._decode([stored[key] for key in wanted]), strict=True):
            self._cache.put(key, messages)
            found[key] = messages
        return Replay(messages=[message for key in keys for message in found[key]])

    # ---- quotas and upkeep -----------------------------------------------------------------

    def stored_bytes(self, owner: str) -> int:
        """Bytes `owner`'s responses and conversations take (JSON, messages, images they use)."""
        rows = self._query("SELECT bytes FROM usage WHERE owner = ?", (owner,))
        return int(rows[0][0]) if rows else 0

    def conversation_bytes(self, conversation_id: str, *, owner: str = "") -> int | None:
        rows = self._query(
            "SELECT size FROM conversations WHERE id = ? AND owner = ?", (conversation_id, owner)
        )
        return int(rows[0][0]) if rows else None

    def maintain(self, *, expire_before: int | None = None) -> Maintenance:
        """Delete responses created before `expire_before` (unix seconds; None: none), free the
        images nothing uses any more, and return free pages to the file system."""
        expired = 0
        while expire_before is not None:
            with self._transaction() as db:
                keys = db.execute(
                    "SELECT id, owner FROM responses WHERE created_at < ? LIMIT ?", (expire_before, _BATCH)
                ).fetchall()
                expired += self._delete_responses(db, keys)
            if len(keys) < _BATCH:
                break
        with self._transaction() as db:
            freed_images = _free_unused_images(db, None)
        return Maintenance(expired, freed_images, self._vacuum())

    def _vacuum(self) -> int:
        """Give free pages back to the file system; how many there were."""
        with self._lock:
            (free,) = self._db.execute("PRAGMA freelist_count").fetchone()
            if free:
                # executescript steps the pragma to its end (execute() frees one page a call).
                self._db.executescript("PRAGMA incremental_vacuum;")
                # The file only shrinks once the WAL is written back into it.
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        return int(free)


_AUTO_VACUUM_INCREMENTAL = 2


def _run_script(db: sqlite3.Connection, script: str) -> None:
    # executescript() would COMMIT the open transaction first; run the statements one by one.
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


def _add_missing_columns(db: sqlite3.Connection) -> None:
    """Columns schema version 1 added to tables of older stores."""
    for table, column in (("responses", "input_size"), ("responses", "size"), ("conversations", "size")):
        _add_column(db, table, column)


def _add_column(db: sqlite3.Connection, table: str, column: str) -> None:
    """An integer column (default 0) added to a table of an older store, unless it has it."""
    columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
    if column not in columns:
        db.execute(f"ALTER TABLE {table} ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0")


def _backfill_sizes(db: sqlite3.Connection) -> None:
    """Sizes and usage of the objects an older store already holds."""
    db.execute(
        "UPDATE responses SET input_size = (SELECT COALESCE(SUM(length(item)), 0) FROM response_items"
        " WHERE response_id = responses.id AND kind = 'input')"
    )
    db.execute(
        "UPDATE responses SET size = input_size + length(resource) + (SELECT COALESCE(SUM(length(item)), 0)"
        " FROM response_items WHERE response_id = responses.id AND kind = 'output')"
    )
    db.execute(
        "UPDATE conversations SET size = length(metadata) + (SELECT COALESCE(SUM(length(item)), 0)"
        " FROM conversation_items WHERE conversation_id = conversations.id)"
    )
    db.execute("DELETE FROM usage")
    db.execute(
        "INSERT INTO usage (owner, bytes) SELECT owner, SUM(size) FROM"
        " (SELECT owner, size FROM responses UNION ALL SELECT owner, size FROM conversations)"
        " GROUP BY owner"
    )


def _failed_event(db: sqlite3.Connection, response_id: str, resource: dict[str, Any]) -> dict[str, Any]:
    """The `response.failed` event that ends a response's stored events, numbered after them."""
    (last,) = db.execute(
        "SELECT MAX(sequence_number) FROM response_events WHERE response_id = ?", (response_id,)
    ).fetchone()
    sequence = 0 if last is None else int(last) + 1
    return {"type": "response.failed", "sequence_number": sequence, "response": resource}


def _add_usage(db: sqlite3.Connection, owner: str, delta: int) -> None:
    if delta:
        db.execute(
            "INSERT INTO usage (owner, bytes) VALUES (?, ?)"
            " ON CONFLICT (owner) DO UPDATE SET bytes = bytes + excluded.bytes",
            (owner, delta),
        )


def _put_images(db: sqlite3.Connection, images: dict[str, bytes]) -> None:
    db.executemany("INSERT OR IGNORE INTO images (hash, data) VALUES (?, ?)", list(images.items()))


def _free_unused_images(db: sqlite3.Connection, candidates: Iterable[str] | None) -> int:
    """Delete the images (among `candidates`; None: all) that no response or conversation uses."""
    unused = (
        "NOT EXISTS (SELECT 1 FROM response_images u WHERE u.hash = images.hash)"
        " AND NOT EXISTS (SELECT 1 FROM conversation_images u WHERE u.hash = images.hash)"
    )
    if candidates is None:
        return db.execute(f"DELETE FROM images WHERE {unused}").rowcount
    freed = 0
    for batch in _batches(sorted(candidates)):
        marks = ",".join("?" * len(batch))
        freed += db.execute(f"DELETE FROM images WHERE hash IN ({marks}) AND {unused}", batch).rowcount
    return freed


def _encoded_size(encoded: EncodedMessages) -> int:
    """Bytes an object is charged for its messages: the blob, and every image it uses, as if
    it were its own copy (shared storage is the store's saving, not the owner's)."""
    return len(encoded.blob) + sum(len(encoded.images[digest]) for digest in encoded.image_hashes)


def _batches(values: Sequence[str]) -> Iterator[list[str]]:
    for start in range(0, len(values), _BATCH):
        yield list(values[start : start + _BATCH])


def _conversation_object(conversation_id: str, created_at: int, metadata: dict[str, str]) -> dict[str, Any]:
    return {"id": conversation_id, "object": "conversation", "created_at": created_at, "metadata": metadata}

"""The SQLite database (WAL), the store's embedded default: one file, its schema and its
migrations; the queries are the repositories', shared with PostgreSQL.

Write transactions are exclusive (BEGIN IMMEDIATE). Deleting returns the freed pages to the
file system (auto_vacuum INCREMENTAL). Responses stored before messages were kept (schema 0)
replay from their raw items.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vlmserve.facade.store.database import DEFAULT_CACHE_BYTES, Connection, Database, LargeValue

__all__ = ["SCHEMA_VERSION", "SQLiteDatabase"]

SCHEMA_VERSION = 5

# Values this large are written in place, in pieces (incremental blob I/O), not bound whole.
LARGE_VALUE_BYTES = 1 << 20

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

# Added in schema version 3: what a response's status is and which facade instance runs it
# (leases: several facades may share a store), and conversation positions that are never reused.
_TABLES_V3 = """
UPDATE responses SET status = json_extract(resource, '$.status');
CREATE INDEX IF NOT EXISTS responses_unfinished ON responses(status)
    WHERE status IN ('queued', 'in_progress');
UPDATE conversations SET next_position = (SELECT COALESCE(MAX(position) + 1, 0) FROM conversation_items
    WHERE conversation_id = conversations.id);
CREATE TABLE IF NOT EXISTS facades (id TEXT PRIMARY KEY, expires_at REAL NOT NULL);
"""

# Added in schema version 4: a conversation's model (that of its latest response, or the one it
# was created with), so that a response continuing it without `model` keeps it. Filled in for an
# older store from each conversation's latest response, found by the index added with it.
_TABLES_V4 = """
CREATE INDEX IF NOT EXISTS responses_by_conversation ON responses(conversation_id, created_at)
    WHERE conversation_id IS NOT NULL;
UPDATE conversations SET model = (SELECT json_extract(resource, '$.model') FROM responses
    WHERE conversation_id = conversations.id ORDER BY created_at DESC, rowid DESC LIMIT 1)
"""


# Added in schema version 5: the messages tables rebuilt with their blob as the last column, where
# SQLite writes a zeroblob without making it (`insert_large`); the rows are copied as they are.
_TABLES_V5 = """
CREATE TABLE response_messages_v5 (
    response_id TEXT NOT NULL REFERENCES responses(id) ON DELETE CASCADE,
    kind TEXT NOT NULL CHECK (kind IN ('input', 'output')),
    images TEXT NOT NULL,
    messages BLOB NOT NULL,
    PRIMARY KEY (response_id, kind)
);
INSERT INTO response_messages_v5 (response_id, kind, images, messages)
    SELECT response_id, kind, images, messages FROM response_messages;
DROP TABLE response_messages;
ALTER TABLE response_messages_v5 RENAME TO response_messages;
CREATE TABLE conversation_messages_v5 (
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    item_count INTEGER NOT NULL,
    images TEXT NOT NULL,
    messages BLOB NOT NULL,
    PRIMARY KEY (conversation_id, position)
);
INSERT INTO conversation_messages_v5 (conversation_id, position, item_count, images, messages)
    SELECT conversation_id, position, item_count, images, messages FROM conversation_messages;
DROP TABLE conversation_messages;
ALTER TABLE conversation_messages_v5 RENAME TO conversation_messages
"""


class SQLiteDatabase(Database):
    def __init__(self, path: Path | str, *, cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        super().__init__(cache_bytes=cache_bytes)
        path_text = str(path)
        if path_text != ":memory:":
            Path(path_text).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # No statement cache: a cached statement keeps its last bound values (sqlite3 resets it
        # but never clears its bindings), so SQLite's copy of a stored 30 MiB input stayed alive
        # after the write, until that statement ran again (docs/hardening.md, "Memory per
        # request byte"). Preparing each statement again costs microseconds.
        self._db = sqlite3.connect(
            path_text, check_same_thread=False, isolation_level=None, cached_statements=0
        )
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
        with self.begin(frees_images=False) as db:
            # Each version's step, in order, from the one after the file's; all or none.
            for step in _MIGRATIONS[version:]:
                step(db, existed)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        (auto_vacuum,) = self._db.execute("PRAGMA auto_vacuum").fetchone()
        if auto_vacuum != _AUTO_VACUUM_INCREMENTAL:
            self._db.execute("VACUUM")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def begin(self, *, frees_images: bool) -> Iterator[Connection]:
        # Every write transaction is exclusive here, so freeing images needs nothing more.
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def insert_large(
        self, db: Connection, sql: str, params: Sequence[Any], value: LargeValue, *, table: str, column: str
    ) -> None:
        """A large value written in place: the row is inserted with a zeroblob of its size (the
        last column: SQLite writes its zeros to the pages without making them), then filled
        piece by piece. Bound whole, SQLite copies the value and then builds the row from the
        copy: twice the value beside the caller's own. The row reads back the same bytes; its
        type is BLOB (a text value's readers take either)."""
        if value.size < LARGE_VALUE_BYTES:
            super().insert_large(db, sql, params, value, table=table, column=column)
            return
        (rowid,) = db.execute(
            sql.format(value="zeroblob(?)") + " RETURNING rowid", (*params, value.size)
        ).fetchone()
        written = 0
        with self._db.blobopen(table, column, rowid) as blob:
            for piece in value.byte_pieces():
                blob.write(piece)
                written += len(piece)
        if written != value.size:
            raise ValueError(f"{table}.{column}: {written} bytes written of {value.size}")

    def query(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    @contextmanager
    def upkeep_turn(self) -> Iterator[bool]:
        # Each of maintain()'s transactions is exclusive; two runs side by side only repeat work.
        yield True

    def vacuum(self) -> int:
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


def _run_script(db: Connection, script: str) -> None:
    # executescript() would COMMIT the open transaction first; run the statements one by one.
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


def _add_missing_columns(db: Connection) -> None:
    """Columns schema version 1 added to tables of older stores."""
    for table, column in (("responses", "input_size"), ("responses", "size"), ("conversations", "size")):
        _add_column(db, table, column)


def _add_column(db: Connection, table: str, column: str, kind: str = "INTEGER NOT NULL DEFAULT 0") -> None:
    """A column (an integer, default 0, unless `kind` says) added to a table of an older store,
    unless it has it."""
    columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})").fetchall()}
    if column not in columns:
        db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")


def _backfill_sizes(db: Connection) -> None:
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


def _to_v1(db: Connection, existed: bool) -> None:
    _run_script(db, _TABLES)
    if existed:
        _add_missing_columns(db)
    _run_script(db, _TABLES_V1)
    if existed:
        _backfill_sizes(db)


def _to_v2(db: Connection, existed: bool) -> None:
    _run_script(db, _TABLES_V2)
    if existed:
        _add_column(db, "responses", "events_size")


def _to_v3(db: Connection, existed: bool) -> None:
    _add_column(db, "responses", "status", "TEXT")
    _add_column(db, "responses", "facade_id", "TEXT")
    _add_column(db, "conversations", "next_position")
    _run_script(db, _TABLES_V3)


def _to_v4(db: Connection, existed: bool) -> None:
    _add_column(db, "conversations", "model", "TEXT")
    _run_script(db, _TABLES_V4)


def _to_v5(db: Connection, existed: bool) -> None:
    _run_script(db, _TABLES_V5)


# _MIGRATIONS[n] takes a file at version n to n + 1.
_MIGRATIONS: list[Callable[[Connection, bool], None]] = [_to_v1, _to_v2, _to_v3, _to_v4, _to_v5]

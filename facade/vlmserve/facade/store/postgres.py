"""The PostgreSQL database: several facades share one store (`--store postgresql://…`).

Connections come from a psycopg pool; the queries are the repositories' (their `?` placeholders
become psycopg's `%s` here). The schema is a versioned list of migrations applied in one
transaction under an advisory lock, so facades starting together migrate once.

Concurrency between facades: rows a transaction changes are locked (SELECT … FOR UPDATE, and
the `usage` row a quota is checked on); a transaction that may delete images holds an
advisory lock exclusively, the ones that add uses of images hold it shared, so an image cannot
be freed while another facade is about to use it; `maintain` runs in one facade at a time
(a session advisory lock, skipped while another holds it). Free space is PostgreSQL's own
autovacuum's business.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from vlmserve.facade.store.database import DEFAULT_CACHE_BYTES, Database, Rows

# Advisory lock keys (one 64-bit namespace per database): "vlms" and a number.
_LOCK_BASE = 0x766C6D73 << 8
MIGRATION_LOCK = _LOCK_BASE + 1
IMAGES_LOCK = _LOCK_BASE + 2
UPKEEP_LOCK = _LOCK_BASE + 3

# MIGRATIONS[n] takes a database at version n to n + 1; append, never edit.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE responses (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        previous_response_id TEXT,
        conversation_id TEXT,
        resource TEXT NOT NULL,
        input_size BIGINT NOT NULL DEFAULT 0,
        size BIGINT NOT NULL DEFAULT 0,
        events_size BIGINT NOT NULL DEFAULT 0,
        status TEXT,
        facade_id TEXT
    );
    CREATE INDEX responses_by_created_at ON responses(created_at);
    CREATE INDEX responses_unfinished ON responses(status) WHERE status IN ('queued', 'in_progress');
    CREATE TABLE response_items (
        response_id TEXT NOT NULL REFERENCES responses(id) ON DELETE CASCADE,
        kind TEXT NOT NULL CHECK (kind IN ('input', 'output')),
        position INTEGER NOT NULL,
        item_id TEXT NOT NULL,
        item TEXT NOT NULL,
        seq BIGINT GENERATED ALWAYS AS IDENTITY,
        PRIMARY KEY (response_id, kind, position)
    );
    CREATE INDEX response_items_by_item_id ON response_items(item_id, seq);
    CREATE INDEX response_items_cursor ON response_items(response_id, kind, item_id, position);
    CREATE TABLE conversations (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        metadata TEXT NOT NULL,
        size BIGINT NOT NULL DEFAULT 0,
        next_position INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE conversation_items (
        conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        item_id TEXT NOT NULL,
        item TEXT NOT NULL,
        seq BIGINT GENERATED ALWAYS AS IDENTITY,
        PRIMARY KEY (conversation_id, position)
    );
    CREATE INDEX conversation_items_by_item_id ON conversation_items(item_id, seq);
    CREATE INDEX conversation_items_cursor ON conversation_items(conversation_id, item_id, position);
    CREATE TABLE response_events (
        response_id TEXT NOT NULL REFERENCES responses(id) ON DELETE CASCADE,
        sequence_number INTEGER NOT NULL,
        event TEXT NOT NULL,
        PRIMARY KEY (response_id, sequence_number)
    );
    CREATE TABLE usage (owner TEXT PRIMARY KEY, bytes BIGINT NOT NULL);
    CREATE TABLE images (hash TEXT PRIMARY KEY, data BYTEA NOT NULL);
    CREATE TABLE response_messages (
        response_id TEXT NOT NULL REFERENCES responses(id) ON DELETE CASCADE,
        kind TEXT NOT NULL CHECK (kind IN ('input', 'output')),
        messages BYTEA NOT NULL,
        images TEXT NOT NULL,
        PRIMARY KEY (response_id, kind)
    );
    CREATE TABLE response_images (
        response_id TEXT NOT NULL REFERENCES responses(id) ON DELETE CASCADE,
        hash TEXT NOT NULL,
        PRIMARY KEY (response_id, hash)
    );
    CREATE INDEX response_images_by_hash ON response_images(hash);
    CREATE TABLE conversation_messages (
        conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        item_count INTEGER NOT NULL,
        messages BYTEA NOT NULL,
        images TEXT NOT NULL,
        PRIMARY KEY (conversation_id, position)
    );
    CREATE TABLE conversation_images (
        conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        hash TEXT NOT NULL,
        PRIMARY KEY (conversation_id, hash)
    );
    CREATE INDEX conversation_images_by_hash ON conversation_images(hash);
    CREATE TABLE facades (id TEXT PRIMARY KEY, expires_at DOUBLE PRECISION NOT NULL);
    """,
    # A conversation's model (that of its latest response, or the one it was created with),
    # filled in from each conversation's latest response.
    """
    ALTER TABLE conversations ADD COLUMN model TEXT;
    CREATE INDEX responses_by_conversation ON responses(conversation_id, created_at)
        WHERE conversation_id IS NOT NULL;
    UPDATE conversations SET model = (SELECT CAST(resource AS json)->>'model' FROM responses
        WHERE responses.conversation_id = conversations.id ORDER BY created_at DESC LIMIT 1);
    """,
]

SCHEMA_VERSION = len(MIGRATIONS)


@functools.lru_cache(maxsize=512)
def _placeholders(sql: str) -> str:
    # The shared SQL has no other `?` or `%` than its placeholders.
    return sql.replace("?", "%s")


class _Adapted:
    """A psycopg connection speaking the repositories' dialect (`?` placeholders)."""

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self._connection = connection

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> Rows:
        return self._connection.execute(_placeholders(sql), params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], /) -> None:
        with self._connection.cursor() as cursor:
            cursor.executemany(_placeholders(sql), rows)


class PostgresDatabase(Database):
    FOR_UPDATE = " FOR UPDATE"
    INSERT_ORDER = "seq"
    NOW = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"

    def __init__(
        self,
        url: str,
        *,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        min_connections: int = 1,
        max_connections: int = 10,
        open_timeout_s: float = 30.0,
    ) -> None:
        super().__init__(cache_bytes=cache_bytes)
        self._pool = ConnectionPool(
            url,
            min_size=min_connections,
            max_size=max_connections,
            kwargs={"autocommit": True},
            # A connection the server dropped (restart, failover) is replaced, not handed out.
            check=ConnectionPool.check_connection,
            open=False,
            name="vlmserve-store",
        )
        # Fails here (not on the first request) when the database cannot be reached.
        self._pool.open(wait=True, timeout=open_timeout_s)
        try:
            self._migrate()
        except BaseException:
            self._pool.close()
            raise

    def _migrate(self) -> None:
        with self._pool.connection() as connection, connection.transaction():
            connection.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            connection.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY)")
            row = connection.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()
            version = int(row[0]) if row else 0
            if version > SCHEMA_VERSION:
                raise RuntimeError(
                    f"the database's schema is version {version}, newer than this facade's "
                    f"{SCHEMA_VERSION}: upgrade the facade"
                )
            for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
                connection.execute(script)
                connection.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (number,))

    def close(self) -> None:
        self._pool.close()

    @contextmanager
    def begin(self, *, frees_images: bool) -> Iterator[_Adapted]:
        with self._pool.connection() as connection, connection.transaction():
            # Taken first, before any row lock, in every write transaction: no lock-order cycle.
            lock = "pg_advisory_xact_lock" if frees_images else "pg_advisory_xact_lock_shared"
            connection.execute(f"SELECT {lock}(%s)", (IMAGES_LOCK,))
            yield _Adapted(connection)

    def query(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self._pool.connection() as connection:
            return connection.execute(_placeholders(sql), params).fetchall()

    @contextmanager
    def upkeep_turn(self) -> Iterator[bool]:
        with self._pool.connection() as connection:
            row = connection.execute("SELECT pg_try_advisory_lock(%s)", (UPKEEP_LOCK,)).fetchone()
            mine = bool(row and row[0])
            try:
                yield mine
            finally:
                if mine:
                    connection.execute("SELECT pg_advisory_unlock(%s)", (UPKEEP_LOCK,))

    def vacuum(self) -> int:
        # autovacuum reuses and returns the space of deleted rows.
        return 0

"""The database under the store's repositories: SQLite (`sqlite.SQLiteDatabase`) or PostgreSQL
(`postgres.PostgresDatabase`). A backend supplies connections, transactions, its schema, its
dialect and its way of giving space back; the queries are the repositories' (`responses`,
`conversations`, `events`, `leases`), written once for both.

`run` is the one place the store leaves the event loop: a repository's async method runs its
blocking SQL there, in a worker thread, once per call. It is also where a database's disk-full
error becomes the store's `disk_space.OutOfSpaceError` (the transaction rolled back), so callers
know no driver's errors.

The SQL is the dialect both understand (`?` placeholders, which the PostgreSQL backend rewrites;
ON CONFLICT, RETURNING, WITH RECURSIVE); the few differences are class attributes.

Space: every response and conversation carries its `size` in bytes (JSON, messages, and the
bytes of the images it uses), summed per owner in `usage` for quotas. A transaction applies its
changes to `usage` last, in owner order, checking the quota it was given there: the row lock
that update takes makes the check and the write one step for every facade sharing the store.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, ParamSpec, Protocol, TypeVar

from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade.store.disk_space import OutOfSpaceError, is_out_of_space
from vlmserve.facade.store.json_text import json_pieces, json_size
from vlmserve.facade.store.message_codec import EncodedMessages, MessageCache, decode_messages, detached
from vlmserve.facade.store.records import (
    ItemPage,
    Order,
    StorageQuotaExceededError,
    StoredItem,
    UnknownCursorError,
)

# Bound on `?` parameters of one IN (...) list and rows per expiry batch.
BATCH = 500

# Decoded messages kept in memory for the next turns of recent chains and conversations.
DEFAULT_CACHE_BYTES = 256 * 1024 * 1024

P = ParamSpec("P")
T = TypeVar("T")


class Rows(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Connection(Protocol):
    """One backend connection inside a transaction (sqlite3's, or psycopg's adapted)."""

    def execute(self, sql: str, params: Sequence[Any] = ..., /) -> Rows: ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], /) -> Any: ...


@dataclass(frozen=True, slots=True)
class LargeValue:
    """A column value made in pieces (an input's JSON, its serialized messages): `size` bytes,
    `pieces()` makes them anew each time (text pieces are UTF-8 when written as bytes). A backend
    writes it without joining it where it can (`Database.insert_large`)."""

    size: int
    pieces: Callable[[], Iterable[str | bytes]]
    text: bool = False

    def whole(self) -> str | bytes:
        """The value joined, for a backend that binds it whole."""
        if self.text:
            return "".join(piece for piece in self.pieces() if isinstance(piece, str))
        return b"".join(piece for piece in self.pieces() if isinstance(piece, bytes))

    def byte_pieces(self) -> Iterator[bytes]:
        for piece in self.pieces():
            yield piece.encode("utf-8") if isinstance(piece, str) else piece


def json_value(value: Any) -> LargeValue:
    """`json.dumps(value)` as a text column, in pieces (ASCII: its size in characters is its
    size in bytes)."""
    return LargeValue(json_size(value), lambda: json_pieces(value), text=True)


def messages_value(encoded: EncodedMessages) -> LargeValue:
    return LargeValue(encoded.size, lambda: encoded.pieces)


class Transaction:
    """A write transaction: statements, the `usage` changes to apply at its end (with the quotas
    they must respect) and the conversation messages to cache once it has committed."""

    def __init__(self, db: Connection, database: Database) -> None:
        self.db = db
        self._database = database
        self._usage: dict[str, int] = {}
        self._quotas: dict[str, int] = {}
        # (cache key, messages, their stored size).
        self.appended: list[tuple[tuple[str, str], Sequence[pb.Message], int]] = []

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        return self.db.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        if rows:
            self.db.executemany(sql, rows)

    def insert_large(
        self, sql: str, params: Sequence[Any], value: LargeValue, *, table: str, column: str
    ) -> None:
        """An INSERT whose last value, `{value}` in `sql`, is `value`, the last column of `table`
        (SQLite writes a large one in place only there)."""
        self._database.insert_large(self.db, sql, params, value, table=table, column=column)

    def add_usage(self, owner: str, delta: int, *, max_bytes: int | None = None) -> None:
        self._usage[owner] = self._usage.get(owner, 0) + delta
        if max_bytes is not None:
            self._quotas[owner] = min(max_bytes, self._quotas.get(owner, max_bytes))

    def settle_usage(self) -> None:
        """Apply the usage changes (owner order: no two transactions wait on each other here);
        StorageQuotaExceededError, and so a rollback, when one passes its quota."""
        for owner in sorted(self._usage):
            delta = self._usage[owner]
            if not delta:
                continue
            (total,) = self.db.execute(
                "INSERT INTO usage (owner, bytes) VALUES (?, ?)"
                " ON CONFLICT (owner) DO UPDATE SET bytes = usage.bytes + excluded.bytes RETURNING bytes",
                (owner, delta),
            ).fetchone()
            quota = self._quotas.get(owner)
            if quota is not None and delta > 0 and int(total) > quota:
                raise StorageQuotaExceededError(used=int(total) - delta, quota=quota, adding=delta)


class Database(ABC):
    """Connections, transactions and reads of one database, and the decoded messages of recent
    replays (`cache`), shared by every repository on it. Thread-safe."""

    # Dialect: a row lock on SELECT (PostgreSQL; SQLite's write transactions are exclusive),
    # the column that orders rows as inserted, and the time now in unix seconds.
    FOR_UPDATE: ClassVar[str] = ""
    INSERT_ORDER: ClassVar[str] = "rowid"
    NOW: ClassVar[str] = "((julianday('now') - 2440587.5) * 86400.0)"

    def __init__(self, *, cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.cache = MessageCache(cache_bytes)

    async def run(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`function` (blocking work on this database) in a worker thread, off the event loop.
        OutOfSpaceError (its cause kept) when the disk had no room for what it wrote."""
        try:
            return await asyncio.to_thread(function, *args, **kwargs)
        except OutOfSpaceError:
            raise
        except Exception as error:
            if is_out_of_space(error):
                raise OutOfSpaceError() from error
            raise

    # ---- what a backend supplies -------------------------------------------------------------

    @abstractmethod
    def begin(self, *, frees_images: bool) -> AbstractContextManager[Connection]:
        """A write transaction, committed when the block ends, rolled back when it raises.
        `frees_images`: it may delete images, so no transaction adding uses may run beside it."""

    @abstractmethod
    def query(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Rows of one read."""

    @abstractmethod
    def vacuum(self) -> int:
        """Give free space back; how many pages that was (0 where the database does it itself)."""

    @abstractmethod
    def upkeep_turn(self) -> AbstractContextManager[bool]:
        """Whether this store may run `maintain` now (one facade at a time): held for the block."""

    @abstractmethod
    def close(self) -> None: ...

    def insert_large(
        self, db: Connection, sql: str, params: Sequence[Any], value: LargeValue, *, table: str, column: str
    ) -> None:
        """`Transaction.insert_large`: here the value bound whole (PostgreSQL: the driver sends
        it as it is; a backend that can write it in pieces does so)."""
        db.execute(sql.format(value="?"), (*params, value.whole()))

    @contextmanager
    def transaction(self, *, frees_images: bool = False) -> Iterator[Transaction]:
        """A write transaction that settles `usage` (and its quotas) as its last step."""
        with self.begin(frees_images=frees_images) as db:
            tx = Transaction(db, self)
            yield tx
            tx.settle_usage()
        # Conversation messages appended by this transaction: cached only now it holds, as
        # copies (a new response's input messages are its request's own, see `detached`).
        for key, messages, size in tx.appended:
            self.cache.put(key, detached(messages), size=size)

    def page(
        self, table: str, where: str, key: tuple[Any, ...], after: str | None, limit: int, order: Order
    ) -> ItemPage:
        direction, compare = ("ASC", ">") if order == "asc" else ("DESC", "<")
        condition, params = where, list(key)
        if after is not None:
            rows = self.query(
                f"SELECT position FROM {table} WHERE {where} AND item_id = ?"
                f" ORDER BY position {direction} LIMIT 1",
                (*key, after),
            )
            if not rows:
                raise UnknownCursorError(after)
            condition += f" AND position {compare} ?"
            params.append(rows[0][0])
        rows = self.query(
            f"SELECT item_id, item FROM {table} WHERE {condition} ORDER BY position {direction} LIMIT ?",
            (*params, limit + 1),
        )
        items = [StoredItem.from_row(item_id, item) for item_id, item in rows[:limit]]
        return ItemPage(items=items, has_more=len(rows) > limit)

    def decode(self, stored: Sequence[tuple[bytes, list[str]]]) -> list[list[pb.Message]]:
        """Each stored (blob, image hashes) as its messages, images read in one go."""
        wanted = sorted({digest for _, hashes in stored for digest in hashes})
        images: dict[str, bytes] = {}
        for batch in batches(wanted):
            marks = ",".join("?" * len(batch))
            rows = self.query(f"SELECT hash, data FROM images WHERE hash IN ({marks})", batch)
            images.update((digest, bytes(data)) for digest, data in rows)
        return [decode_messages(blob, hashes, images) for blob, hashes in stored]


def put_images(tx: Transaction, images: dict[str, bytes]) -> None:
    tx.executemany(
        "INSERT INTO images (hash, data) VALUES (?, ?) ON CONFLICT DO NOTHING", list(images.items())
    )


def free_unused_images(tx: Transaction, candidates: Iterable[str] | None) -> int:
    """Delete the images (among `candidates`; None: all) that no response or conversation uses."""
    unused = (
        "NOT EXISTS (SELECT 1 FROM response_images u WHERE u.hash = images.hash)"
        " AND NOT EXISTS (SELECT 1 FROM conversation_images u WHERE u.hash = images.hash)"
    )
    if candidates is None:
        return tx.execute(f"DELETE FROM images WHERE {unused}").rowcount
    freed = 0
    for batch in batches(sorted(candidates)):
        marks = ",".join("?" * len(batch))
        freed += tx.execute(f"DELETE FROM images WHERE hash IN ({marks}) AND {unused}", batch).rowcount
    return freed


def encoded_size(encoded: EncodedMessages) -> int:
    """Bytes an object is charged for its messages: the blob, and every image it uses, as if
    it were its own copy (shared storage is the store's saving, not the owner's)."""
    return encoded.size + sum(len(encoded.images[digest]) for digest in encoded.image_hashes)


def batches(values: Sequence[str]) -> Iterator[list[str]]:
    for start in range(0, len(values), BATCH):
        yield list(values[start : start + BATCH])

"""The store: one database (SQLite or PostgreSQL) and an async repository per aggregate on it.

Every method of a repository is a coroutine that runs its blocking SQL in a worker thread once,
inside (`Database.run`); callers just await it. Every query is filtered on `owner` (the API key's
identity; "" without keys), so stored objects never leak between keys. Uploaded files are kept
apart, on disk (`files.FileRepository`).
"""

from __future__ import annotations

from pathlib import Path

from vlmserve.facade.store.conversations import ConversationRepository
from vlmserve.facade.store.database import BATCH, DEFAULT_CACHE_BYTES, Database, free_unused_images
from vlmserve.facade.store.events import EventRepository
from vlmserve.facade.store.leases import LeaseRepository
from vlmserve.facade.store.records import Maintenance
from vlmserve.facade.store.responses import ResponseRepository, delete_responses


class Store:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.leases = LeaseRepository(db)
        self.responses = ResponseRepository(db, self.leases)
        self.conversations = ConversationRepository(db)
        self.events = EventRepository(db)

    @classmethod
    def sqlite(cls, path: Path | str, *, cache_bytes: int = DEFAULT_CACHE_BYTES) -> Store:
        """The SQLite file at `path` (made, with its folder, when missing; ":memory:" too)."""
        from vlmserve.facade.store.sqlite import SQLiteDatabase

        return cls(SQLiteDatabase(path, cache_bytes=cache_bytes))

    @classmethod
    def postgres(
        cls, url: str, *, cache_bytes: int = DEFAULT_CACHE_BYTES, max_connections: int = 10
    ) -> Store:
        """The PostgreSQL database at `url`, migrated to this facade's schema."""
        # psycopg only where PostgreSQL is used.
        from vlmserve.facade.store.postgres import PostgresDatabase

        return cls(PostgresDatabase(url, cache_bytes=cache_bytes, max_connections=max_connections))

    async def stored_bytes(self, owner: str) -> int:
        """Bytes `owner`'s responses and conversations take (JSON, messages, images they use)."""
        return await self.db.run(self._stored_bytes, owner)

    async def maintain(self, *, expire_before: int | None = None) -> Maintenance:
        """Delete responses created before `expire_before` (unix seconds; None: none), free the
        images nothing uses any more, and give free space back. One facade at a time: while
        another sharing the store runs it, this does nothing."""
        return await self.db.run(self._maintain, expire_before)

    def close(self) -> None:
        self.db.close()

    def _stored_bytes(self, owner: str) -> int:
        rows = self.db.query("SELECT bytes FROM usage WHERE owner = ?", (owner,))
        return int(rows[0][0]) if rows else 0

    def _maintain(self, expire_before: int | None) -> Maintenance:
        db = self.db
        with db.upkeep_turn() as mine:
            if not mine:
                return Maintenance(0, 0, 0)
            expired = 0
            while expire_before is not None:
                with db.transaction(frees_images=True) as tx:
                    keys = tx.execute(
                        "SELECT id, owner FROM responses WHERE created_at < ? LIMIT ?", (expire_before, BATCH)
                    ).fetchall()
                    expired += delete_responses(tx, db.cache, [(key, owner) for key, owner in keys])
                if len(keys) < BATCH:
                    break
            with db.transaction(frees_images=True) as tx:
                freed_images = free_unused_images(tx, None)
            return Maintenance(expired, freed_images, db.vacuum())

"""Facade instances sharing a store: each holds a lease while it runs, and the responses it
left unfinished when it died are swept to `failed` by a live one.

A response records the instance generating it (`instance_id` when it was stored); only responses
whose instance's lease expired are swept (`fail_unfinished`), so several facades may share one
store (PostgreSQL) without failing each other's runs.
"""

from __future__ import annotations

import secrets

from vlmserve.facade.store.database import Database
from vlmserve.facade.store.events import append_events, failed_event
from vlmserve.facade.store.records import UNFINISHED_STATUSES, ResponseRecord


class LeaseRepository:
    def __init__(self, db: Database) -> None:
        self._db = db
        # Responses stored meanwhile belong to this instance; it holds no lease until `start`,
        # so what it leaves unfinished counts as abandoned.
        self._instance_id = _new_instance_id()
        self._ttl_s: float | None = None

    @property
    def instance_id(self) -> str:
        """The facade instance the responses stored now belong to."""
        return self._instance_id

    async def start(self, ttl_s: float) -> None:
        """From now on this store is a new facade instance, alive while it renews its lease
        (every fraction of `ttl_s`); the responses it starts are its own."""
        self._instance_id = _new_instance_id()
        self._ttl_s = ttl_s
        await self.renew()

    async def renew(self) -> None:
        if self._ttl_s is not None:
            await self._db.run(self._renew, self._instance_id, self._ttl_s)

    async def release(self) -> None:
        """A clean stop: this instance is gone (what it left unfinished may be swept at once)."""
        if self._ttl_s is not None:
            self._ttl_s = None
            await self._db.run(self._release, self._instance_id)

    async def fail_unfinished(self, error: dict[str, str]) -> list[str]:
        """Mark `failed` with `error` every response still `queued` or `in_progress`, whoever owns
        it, whose facade instance holds no live lease (it died: nothing will finish them); their
        ids. Live facades' responses, this one's included, are left alone. A background
        response also gets its terminal `response.failed` event, so a resumed stream ends."""
        return await self._db.run(self._fail_unfinished, error)

    def _renew(self, instance_id: str, ttl_s: float) -> None:
        with self._db.transaction() as tx:
            tx.execute(
                f"INSERT INTO facades (id, expires_at) VALUES (?, {self._db.NOW} + ?)"
                " ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at",
                (instance_id, float(ttl_s)),
            )

    def _release(self, instance_id: str) -> None:
        with self._db.transaction() as tx:
            tx.execute("DELETE FROM facades WHERE id = ?", (instance_id,))

    def _fail_unfinished(self, error: dict[str, str]) -> list[str]:
        db = self._db
        with db.transaction() as tx:
            rows = tx.execute(
                "SELECT id, owner, resource FROM responses r WHERE status IN (?, ?) AND NOT EXISTS"
                f" (SELECT 1 FROM facades f WHERE f.id = r.facade_id AND f.expires_at > {db.NOW})"
                f"{db.FOR_UPDATE}",
                UNFINISHED_STATUSES,
            ).fetchall()
            for response_id, owner, text in rows:
                failed = ResponseRecord.from_row(text).ended("failed", error=error)
                if failed.background:
                    append_events(db, tx, response_id, owner, [failed_event(tx, failed)])
                tx.execute(
                    "UPDATE responses SET resource = ?, status = 'failed' WHERE id = ?",
                    (failed.resource_text(), response_id),
                )
            tx.execute(f"DELETE FROM facades WHERE expires_at <= {db.NOW}")
        return [response_id for response_id, _, _ in rows]


def _new_instance_id() -> str:
    return "facade_" + secrets.token_hex(12)

"""The streaming events of background responses, kept for stream resume (`GET …?stream=true`).

Each event is stored under its response and its `sequence_number`; its bytes count in the
response's size (`events_size`), so in its owner's quota. A response's last events are written
with its final state (`responses.ResponseRepository.finish`), in the same transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

from vlmserve.facade.store.database import Database, Transaction
from vlmserve.facade.store.records import ResponseRecord, StoredEvent

# Named here: inside the repository `list` is its method.
Events = list[StoredEvent]


class EventRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def append(self, response_id: str, events: Sequence[StoredEvent], *, owner: str = "") -> int | None:
        """Store streaming events of a response (each with its `sequence_number`; one already
        stored is kept as it was); the bytes its events now take, None when the response is
        not stored (deleted meanwhile). The bytes count in its size and its owner's usage."""
        return await self._db.run(self._append, response_id, events, owner)

    async def list(
        self, response_id: str, *, after: int | None = None, limit: int = 1000, owner: str = ""
    ) -> Events | None:
        """Up to `limit` stored events of a response with a sequence number above `after`
        (None: from the first), in order; None when the response is not stored."""
        return await self._db.run(self._list, response_id, after, limit, owner)

    def _append(self, response_id: str, events: Sequence[StoredEvent], owner: str) -> int | None:
        with self._db.transaction() as tx:
            return append_events(self._db, tx, response_id, owner, events)

    def _list(self, response_id: str, after: int | None, limit: int, owner: str) -> Events | None:
        if not self._db.query("SELECT 1 FROM responses WHERE id = ? AND owner = ?", (response_id, owner)):
            return None
        rows = self._db.query(
            "SELECT event FROM response_events WHERE response_id = ? AND sequence_number > ?"
            " ORDER BY sequence_number LIMIT ?",
            (response_id, -1 if after is None else after, limit),
        )
        return [StoredEvent.from_row(event) for (event,) in rows]


def append_events(
    db: Database, tx: Transaction, response_id: str, owner: str, events: Sequence[StoredEvent]
) -> int | None:
    """`EventRepository.append` inside a transaction of another write (a response's end)."""
    rows = tx.execute(
        f"SELECT events_size FROM responses WHERE id = ? AND owner = ?{db.FOR_UPDATE}",
        (response_id, owner),
    ).fetchall()
    if not rows:
        return None
    added = 0
    for event in events:
        text = event.event_text()
        inserted = tx.execute(
            "INSERT INTO response_events (response_id, sequence_number, event) VALUES (?, ?, ?)"
            " ON CONFLICT DO NOTHING",
            (response_id, event.sequence_number, text),
        ).rowcount
        added += len(text) if inserted else 0
    if added:
        tx.execute(
            "UPDATE responses SET events_size = events_size + ?, size = size + ? WHERE id = ?",
            (added, added, response_id),
        )
        tx.add_usage(owner, added)
    return int(rows[0][0]) + added


def failed_event(tx: Transaction, failed: ResponseRecord) -> StoredEvent:
    """The `response.failed` event that ends a response's stored events, numbered after them."""
    (last,) = tx.execute(
        "SELECT MAX(sequence_number) FROM response_events WHERE response_id = ?", (failed.id,)
    ).fetchone()
    sequence = 0 if last is None else int(last) + 1
    return StoredEvent.of(
        {"type": "response.failed", "sequence_number": sequence, "response": failed.resource}
    )

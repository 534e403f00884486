"""The store's event log of background responses: append, read after a sequence number, sizes,
the start-up sweep's terminal event, and the upgrade of a schema-1 store."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.facade.both_stores import on_both_store_backends  # noqa: F401
from vlmserve.facade.store.records import ResponseRecord, StoredEvent
from vlmserve.facade.store.repositories import Store
from vlmserve.facade.store.sqlite import SCHEMA_VERSION

ERROR = {"code": "server_error", "message": "restarted"}


def resource(response_id: str, status: str = "in_progress", background: bool = True) -> dict[str, Any]:
    return {"id": response_id, "created_at": 1, "status": status, "background": background, "output": []}


def delta(sequence: int, text: str = "x") -> StoredEvent:
    return StoredEvent.of({"type": "response.output_text.delta", "sequence_number": sequence, "delta": text})


def size_of(events: list[StoredEvent]) -> int:
    return sum(len(json.dumps(stored.event, separators=(",", ":"))) for stored in events)


@pytest.fixture
def store(store: Store) -> Store:
    """The shared `store` fixture, here on SQLite and on PostgreSQL."""
    return store


async def test_events_are_read_back_after_a_sequence_number(store: Store) -> None:
    await store.responses.put(ResponseRecord.of(resource("resp_1")), [], owner="alice")
    events = [delta(n, str(n)) for n in range(5)]
    assert await store.events.append("resp_1", events[:3], owner="alice") == size_of(events[:3])
    assert await store.events.append("resp_1", events[3:], owner="alice") == size_of(events)
    assert await store.events.list("resp_1", owner="alice") == events
    assert await store.events.list("resp_1", after=2, owner="alice") == events[3:]
    assert await store.events.list("resp_1", after=0, limit=2, owner="alice") == events[1:3]
    assert await store.events.list("resp_1", after=4, owner="alice") == []
    # Appending again is harmless: what is stored stays, nothing is counted twice.
    assert await store.events.append("resp_1", events[4:], owner="alice") == size_of(events)


async def test_events_belong_to_their_owner_and_go_with_their_response(store: Store) -> None:
    await store.responses.put(ResponseRecord.of(resource("resp_1")), [], owner="alice")
    assert await store.events.append("resp_1", [delta(0)], owner="bob") is None
    assert await store.events.list("resp_1", owner="bob") is None
    assert await store.events.append("resp_gone", [delta(0)], owner="alice") is None
    assert await store.events.list("resp_gone", owner="alice") is None
    before = await store.stored_bytes("alice")
    await store.events.append("resp_1", [delta(0)], owner="alice")
    assert await store.stored_bytes("alice") == before + size_of([delta(0)])
    assert await store.responses.delete("resp_1", owner="alice")
    assert await store.stored_bytes("alice") == 0
    assert await store.events.list("resp_1", owner="alice") is None


async def test_the_final_write_keeps_the_events_in_the_size(store: Store) -> None:
    await store.responses.put(ResponseRecord.of(resource("resp_1")), [], owner="alice")
    await store.events.append("resp_1", [delta(0)], owner="alice")
    final = {**resource("resp_1", "completed")}
    last = StoredEvent.of({"type": "response.completed", "sequence_number": 1, "response": final})
    await store.responses.finish(ResponseRecord.of(final), owner="alice", events=[last])
    assert await store.events.list("resp_1", owner="alice") == [delta(0), last]
    expected = len(json.dumps(final)) + size_of([delta(0), last])
    assert await store.stored_bytes("alice") == expected


async def test_the_start_up_sweep_ends_a_background_response_s_events(store: Store) -> None:
    await store.responses.put(ResponseRecord.of(resource("resp_bg")), [], owner="alice")
    await store.events.append("resp_bg", [delta(0), delta(1)], owner="alice")
    await store.responses.put(ResponseRecord.of(resource("resp_queued")), [], owner="bob")
    await store.responses.put(ResponseRecord.of(resource("resp_fg", background=False)), [], owner="alice")
    assert sorted(await store.leases.fail_unfinished(ERROR)) == ["resp_bg", "resp_fg", "resp_queued"]
    failed = {**resource("resp_bg", "failed"), "error": ERROR}
    assert await store.events.list("resp_bg", after=1, owner="alice") == [
        StoredEvent(
            2, "response.failed", {"type": "response.failed", "sequence_number": 2, "response": failed}
        )
    ]
    queued = await store.events.list("resp_queued", owner="bob")
    assert queued is not None
    assert [(event.type, event.sequence_number) for event in queued] == [("response.failed", 0)]
    assert await store.events.list("resp_fg", owner="alice") == []


async def test_a_schema_1_store_is_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "v1.sqlite3"
    old = Store.sqlite(path)
    await old.responses.put(ResponseRecord.of(resource("resp_old", "completed")), [], owner="alice")
    old.close()
    with sqlite3.connect(path) as db:
        # What schema version 1 had: no event table, no events_size column.
        db.execute("DROP TABLE response_events")
        db.execute("ALTER TABLE responses DROP COLUMN events_size")
        db.execute("PRAGMA user_version = 1")
    store = Store.sqlite(path)
    used = await store.stored_bytes("alice")
    assert used == len(json.dumps(resource("resp_old", "completed")))
    assert await store.events.list("resp_old", owner="alice") == []
    assert await store.events.append("resp_old", [delta(0)], owner="alice") == size_of([delta(0)])
    assert await store.stored_bytes("alice") == used + size_of([delta(0)])
    store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)

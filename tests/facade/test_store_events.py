"""The store's event log of background responses: append, read after a sequence number, sizes,
the start-up sweep's terminal event, and the upgrade of a schema-1 store."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.facade.both_stores import on_both_store_backends  # noqa: F401
from vlmserve.facade.store.sql_responses import SQLStore
from vlmserve.facade.store.sqlite import SCHEMA_VERSION, ResponseStore

ERROR = {"code": "server_error", "message": "restarted"}


def resource(response_id: str, status: str = "in_progress", background: bool = True) -> dict[str, Any]:
    return {"id": response_id, "created_at": 1, "status": status, "background": background, "output": []}


def delta(sequence: int, text: str = "x") -> dict[str, Any]:
    return {"type": "response.output_text.delta", "sequence_number": sequence, "delta": text}


def size_of(events: list[dict[str, Any]]) -> int:
    return sum(len(json.dumps(event, separators=(",", ":"))) for event in events)


@pytest.fixture
def store(store: SQLStore) -> SQLStore:
    """The shared `store` fixture, here on SQLite and on PostgreSQL."""
    return store


def test_events_are_read_back_after_a_sequence_number(store: SQLStore) -> None:
    store.put_response(resource("resp_1"), [], owner="alice")
    events = [delta(n, str(n)) for n in range(5)]
    assert store.append_events("resp_1", events[:3], owner="alice") == size_of(events[:3])
    assert store.append_events("resp_1", events[3:], owner="alice") == size_of(events)
    assert store.list_events("resp_1", owner="alice") == events
    assert store.list_events("resp_1", after=2, owner="alice") == events[3:]
    assert store.list_events("resp_1", after=0, limit=2, owner="alice") == events[1:3]
    assert store.list_events("resp_1", after=4, owner="alice") == []
    # Appending again is harmless: what is stored stays, nothing is counted twice.
    assert store.append_events("resp_1", events[4:], owner="alice") == size_of(events)


def test_events_belong_to_their_owner_and_go_with_their_response(store: SQLStore) -> None:
    store.put_response(resource("resp_1"), [], owner="alice")
    assert store.append_events("resp_1", [delta(0)], owner="bob") is None
    assert store.list_events("resp_1", owner="bob") is None
    assert store.append_events("resp_gone", [delta(0)], owner="alice") is None
    assert store.list_events("resp_gone", owner="alice") is None
    before = store.stored_bytes("alice")
    store.append_events("resp_1", [delta(0)], owner="alice")
    assert store.stored_bytes("alice") == before + size_of([delta(0)])
    assert store.delete_response("resp_1", owner="alice")
    assert store.stored_bytes("alice") == 0
    assert store.list_events("resp_1", owner="alice") is None


def test_the_final_write_keeps_the_events_in_the_size(store: SQLStore) -> None:
    store.put_response(resource("resp_1"), [], owner="alice")
    store.append_events("resp_1", [delta(0)], owner="alice")
    final = {**resource("resp_1", "completed")}
    last = {"type": "response.completed", "sequence_number": 1, "response": final}
    store.finish_response(final, owner="alice", events=[last])
    assert store.list_events("resp_1", owner="alice") == [delta(0), last]
    expected = len(json.dumps(final)) + size_of([delta(0), last])
    assert store.stored_bytes("alice") == expected


def test_the_start_up_sweep_ends_a_background_response_s_events(store: SQLStore) -> None:
    store.put_response(resource("resp_bg"), [], owner="alice")
    store.append_events("resp_bg", [delta(0), delta(1)], owner="alice")
    store.put_response(resource("resp_queued"), [], owner="bob")
    store.put_response(resource("resp_fg", background=False), [], owner="alice")
    assert sorted(store.fail_unfinished(ERROR)) == ["resp_bg", "resp_fg", "resp_queued"]
    failed = {**resource("resp_bg", "failed"), "error": ERROR}
    assert store.list_events("resp_bg", after=1, owner="alice") == [
        {"type": "response.failed", "sequence_number": 2, "response": failed}
    ]
    queued = store.list_events("resp_queued", owner="bob")
    assert queued is not None
    assert [(event["type"], event["sequence_number"]) for event in queued] == [("response.failed", 0)]
    assert store.list_events("resp_fg", owner="alice") == []


def test_a_schema_1_store_is_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "v1.sqlite3"
    old = ResponseStore(path)
    old.put_response(resource("resp_old", "completed"), [], owner="alice")
    old.close()
    with sqlite3.connect(path) as db:
        # What schema version 1 had: no event table, no events_size column.
        db.execute("DROP TABLE response_events")
        db.execute("ALTER TABLE responses DROP COLUMN events_size")
        db.execute("PRAGMA user_version = 1")
    store = ResponseStore(path)
    used = store.stored_bytes("alice")
    assert used == len(json.dumps(resource("resp_old", "completed")))
    assert store.list_events("resp_old", owner="alice") == []
    assert store.append_events("resp_old", [delta(0)], owner="alice") == size_of([delta(0)])
    assert store.stored_bytes("alice") == used + size_of([delta(0)])
    store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)

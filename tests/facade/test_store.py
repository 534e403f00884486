"""The store on its own, SQLite and PostgreSQL alike: owners, chains, paging, durability."""

from __future__ import annotations

import errno
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vlmserve.facade.routes.conversations import conversation_resource
from vlmserve.facade.store.disk_space import OutOfSpaceError
from vlmserve.facade.store.files import FileRepository
from vlmserve.facade.store.records import (
    MissingChainLinkError,
    ResponseRecord,
    StoredItem,
    UnknownCursorError,
)
from vlmserve.facade.store.repositories import Store
from vlmserve.facade.store.sqlite import SCHEMA_VERSION


def resource(
    response_id: str, previous: str | None = None, output: list[Any] | None = None
) -> dict[str, Any]:
    return {
        "id": response_id,
        "created_at": 1,
        "status": "completed",
        "previous_response_id": previous,
        "output": output or [],
    }


def message(item_id: str, text: str, role: str = "user") -> StoredItem:
    return StoredItem(item_id, {"type": "message", "role": role, "content": text})


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Each test on both backends: the proof that they behave the same."""
    opened: Store
    if request.param == "sqlite":
        opened = Store.sqlite(tmp_path / "store.sqlite3")
    else:
        opened = Store.postgres(request.getfixturevalue("postgres_url"))
    yield opened
    opened.close()


def test_uses_wal_and_creates_its_folder(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "store.sqlite3"
    Store.sqlite(path).close()
    assert path.exists()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_owners_never_see_each_others_objects(store: Store) -> None:
    await store.responses.put(
        ResponseRecord.of(resource("resp_a")), [message("msg_1", "secret")], owner="alice"
    )
    assert await store.responses.get("resp_a", owner="bob") is None
    assert await store.responses.list_input_items("resp_a", owner="bob") is None
    assert await store.responses.replay_items("resp_a", owner="bob") is None
    assert await store.responses.find_item("msg_1", owner="bob") is None
    assert not await store.responses.delete("resp_a", owner="bob")
    assert await store.responses.get("resp_a", owner="alice") is not None


async def test_replay_walks_the_chain_oldest_first(store: Store) -> None:
    answer = {"type": "message", "id": "msg_out1", "role": "assistant", "content": []}
    await store.responses.put(ResponseRecord.of(resource("resp_1", output=[answer])), [message("m1", "one")])
    await store.responses.put(
        ResponseRecord.of(resource("resp_2", previous="resp_1")), [message("m2", "two")]
    )
    items = await store.responses.replay_items("resp_2")
    assert items is not None
    assert [stored.item.get("content") for stored in items] == ["one", [], "two"]
    assert [stored.id for stored in items] == ["m1", "msg_out1", "m2"]


async def test_replay_with_a_deleted_link_names_it(store: Store) -> None:
    await store.responses.put(ResponseRecord.of(resource("resp_1")), [message("m1", "one")])
    await store.responses.put(
        ResponseRecord.of(resource("resp_2", previous="resp_1")), [message("m2", "two")]
    )
    await store.responses.delete("resp_1")
    with pytest.raises(MissingChainLinkError) as missing:
        await store.responses.replay_items("resp_2")
    assert missing.value.response_id == "resp_1"


async def test_replay_depth_is_bounded(store: Store) -> None:
    previous = None
    for index in range(5):
        await store.responses.put(
            ResponseRecord.of(resource(f"resp_{index}", previous=previous)),
            [message(f"m{index}", str(index))],
        )
        previous = f"resp_{index}"
    items = await store.responses.replay_items("resp_4", max_depth=2)
    assert items is not None and [stored.item["content"] for stored in items] == ["3", "4"]


async def test_update_replaces_outputs_and_delete_cascades(store: Store) -> None:
    await store.responses.put(ResponseRecord.of(resource("resp_1")), [message("m1", "one")])
    out = {"type": "message", "id": "msg_o", "role": "assistant", "content": []}
    assert await store.responses.update(ResponseRecord.of(resource("resp_1", output=[out])))
    assert await store.responses.find_item("msg_o") == StoredItem("msg_o", out)
    assert await store.responses.delete("resp_1")
    assert await store.responses.find_item("msg_o") is None and await store.responses.find_item("m1") is None
    assert not await store.responses.update(ResponseRecord.of(resource("resp_1")))


@pytest.mark.parametrize(
    ("background", "status", "after"),
    [
        (True, "queued", "cancelled"),
        (True, "in_progress", "cancelled"),
        (True, "cancelled", "cancelled"),
        (True, "completed", "completed"),
        (True, "failed", "failed"),
        (False, "in_progress", "in_progress"),
    ],
)
async def test_cancel_marks_only_an_unfinished_background_response(
    store: Store, background: bool, status: str, after: str
) -> None:
    await store.responses.put(
        ResponseRecord.of({**resource("resp_a"), "background": background, "status": status}), []
    )
    assert await store.responses.cancel("resp_a", owner="bob") is None
    cancelled = await store.responses.cancel("resp_a")
    assert cancelled is not None and cancelled.status == cancelled.resource["status"] == after
    stored = await store.responses.get("resp_a")
    assert stored is not None and stored.status == stored.resource["status"] == after
    assert await store.responses.cancel("resp_missing") is None


async def test_paging_errors_on_unknown_cursor(store: Store) -> None:
    await store.responses.put(ResponseRecord.of(resource("resp_1")), [message("m1", "one")])
    with pytest.raises(UnknownCursorError):
        await store.responses.list_input_items("resp_1", after="nope")


async def test_conversation_items_append_in_order(store: Store) -> None:
    await store.conversations.create("conv_1", metadata={}, items=[message("a", "1")])
    assert await store.conversations.append("conv_1", [message("b", "2"), message("c", "3")])
    page = await store.conversations.list_items("conv_1", order="asc")
    assert page is not None and [entry.id for entry in page.items] == ["a", "b", "c"]
    assert not await store.conversations.append("conv_missing", [message("d", "4")])
    assert await store.conversations.list_items("conv_1", owner="someone-else") is None
    assert await store.conversations.replay("conv_1", owner="someone-else") is None


# The schema before version 1 (no sizes, no messages, auto_vacuum off), as older facades made it.
SCHEMA_V0 = """
CREATE TABLE responses (id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at INTEGER NOT NULL,
    previous_response_id TEXT, conversation_id TEXT, resource TEXT NOT NULL);
CREATE TABLE response_items (response_id TEXT NOT NULL REFERENCES responses(id) ON DELETE CASCADE,
    kind TEXT NOT NULL CHECK (kind IN ('input', 'output')), position INTEGER NOT NULL,
    item_id TEXT NOT NULL, item TEXT NOT NULL, PRIMARY KEY (response_id, kind, position));
CREATE INDEX response_items_by_item_id ON response_items(item_id);
CREATE TABLE conversations (id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at INTEGER NOT NULL,
    metadata TEXT NOT NULL);
CREATE TABLE conversation_items (conversation_id TEXT NOT NULL REFERENCES conversations(id)
    ON DELETE CASCADE, position INTEGER NOT NULL, item_id TEXT NOT NULL, item TEXT NOT NULL,
    PRIMARY KEY (conversation_id, position));
INSERT INTO responses VALUES ('resp_old', 'alice', 1, NULL, NULL,
    '{"id": "resp_old", "status": "completed"}');
INSERT INTO response_items VALUES ('resp_old', 'input', 0, 'm1', '{"role": "user", "content": "old"}');
INSERT INTO conversations VALUES ('conv_old', 'alice', 1, '{}');
INSERT INTO conversation_items VALUES ('conv_old', 0, 'm2', '{"role": "user", "content": "kept"}');
"""


async def test_a_store_made_by_an_older_version_is_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as db:
        db.executescript(SCHEMA_V0)
    store = Store.sqlite(path)
    replay = await store.responses.replay("resp_old", owner="alice")
    assert replay is not None and replay.items == [StoredItem("m1", {"role": "user", "content": "old"})]
    conversation = await store.conversations.replay("conv_old", owner="alice")
    assert conversation is not None
    assert conversation.items == [StoredItem("m2", {"role": "user", "content": "kept"})]
    expected = len('{"id": "resp_old", "status": "completed"}') + len('{"role": "user", "content": "old"}')
    expected += len("{}") + len('{"role": "user", "content": "kept"}')
    assert await store.stored_bytes("alice") == expected
    # New items on an old conversation: it replays from items until all have messages.
    assert await store.conversations.append("conv_old", [message("m3", "new")], owner="alice")
    conversation = await store.conversations.replay("conv_old", owner="alice")
    assert conversation is not None
    assert [stored.item["content"] for stored in conversation.items] == ["kept", "new"]
    store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA auto_vacuum").fetchone() == (2,)  # incremental
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)


def model_resource(response_id: str, model: str, created_at: int = 1) -> dict[str, Any]:
    return {**resource(response_id), "model": model, "created_at": created_at}


async def model_of(store: Store, conversation_id: str) -> str | None:
    conversation = await store.conversations.get(conversation_id)
    assert conversation is not None
    return conversation.model


async def test_a_conversation_remembers_its_model(store: Store) -> None:
    plain = await store.conversations.create("conv_plain", metadata={})
    got = await store.conversations.get("conv_plain")
    assert plain.model is None and got is not None and got.model is None
    # As the API answers it: `model` only once it has one.
    assert conversation_resource(plain) == {
        "id": "conv_plain",
        "object": "conversation",
        "created_at": plain.created_at,
        "metadata": {},
    }
    created = await store.conversations.create("conv_1", metadata={}, model="a", items=[message("m1", "one")])
    assert created.model == "a" and conversation_resource(created)["model"] == "a"
    # Items the client adds keep it; a response's items make the response's model the conversation's.
    assert await store.conversations.append("conv_1", [message("m2", "two")])
    assert await model_of(store, "conv_1") == "a"
    await store.responses.put(ResponseRecord.of(model_resource("resp_1", "b")), [], conversation_id="conv_1")
    await store.responses.finish(
        ResponseRecord.of(model_resource("resp_1", "b")),
        conversation_id="conv_1",
        conversation_items=[message("m3", "three")],
        conversation_model="b",
    )
    assert await model_of(store, "conv_1") == "b"
    updated = await store.conversations.update("conv_1", metadata={"k": "v"})
    assert updated is not None and updated.model == "b" and updated.metadata == {"k": "v"}
    # Another owner sees nothing of it.
    assert await store.conversations.get("conv_1", owner="bob") is None


async def test_a_schema_3_sqlite_store_learns_its_conversations_models(tmp_path: Path) -> None:
    path = tmp_path / "v3.sqlite3"
    old = Store.sqlite(path)
    for conversation_id in ("conv_1", "conv_2", "conv_3"):
        await old.conversations.create(conversation_id, metadata={})
    await old.responses.put(
        ResponseRecord.of(model_resource("resp_1", "a", created_at=1)), [], conversation_id="conv_1"
    )
    await old.responses.put(
        ResponseRecord.of(model_resource("resp_2", "b", created_at=2)), [], conversation_id="conv_1"
    )
    await old.responses.put(
        ResponseRecord.of(model_resource("resp_3", "a", created_at=3)), [], conversation_id="conv_2"
    )
    old.close()
    with sqlite3.connect(path) as db:
        # What schema version 3 had: no model column, no index on responses' conversation_id.
        db.execute("DROP INDEX responses_by_conversation")
        db.execute("ALTER TABLE conversations DROP COLUMN model")
        db.execute("PRAGMA user_version = 3")
    store = Store.sqlite(path)
    models = {cid: await model_of(store, cid) for cid in ("conv_1", "conv_2", "conv_3")}
    assert models == {"conv_1": "b", "conv_2": "a", "conv_3": None}
    store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        plan = db.execute(
            "EXPLAIN QUERY PLAN SELECT resource FROM responses WHERE conversation_id = 'conv_1'"
            " ORDER BY created_at DESC LIMIT 1"
        ).fetchall()
        assert "responses_by_conversation" in str(plan)


async def test_a_version_1_postgres_database_learns_its_conversations_models(
    postgres_url: str,
) -> None:
    import psycopg

    from vlmserve.facade.store import postgres

    with psycopg.connect(postgres_url, autocommit=True) as connection:
        # A database as the facade left it before conversations had a model.
        connection.execute(postgres.MIGRATIONS[0])
        connection.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY)")
        connection.execute("INSERT INTO schema_migrations (version) VALUES (1)")
        connection.execute(
            "INSERT INTO conversations (id, owner, created_at, metadata) VALUES ('conv_1', '', 1, '{}')"
        )
        for response_id, model, created_at in (("resp_1", "a", 1), ("resp_2", "b", 2)):
            connection.execute(
                "INSERT INTO responses (id, owner, created_at, conversation_id, resource)"
                " VALUES (%s, '', %s, 'conv_1', %s)",
                (response_id, created_at, json.dumps(model_resource(response_id, model, created_at))),
            )
    store = Store.postgres(postgres_url)
    try:
        assert await model_of(store, "conv_1") == "b"
    finally:
        store.close()


FULL_DISK_ERRORS = [
    sqlite3.OperationalError("database or disk is full"),
    OSError(errno.ENOSPC, "No space left on device"),
    OSError(errno.EDQUOT, "Disk quota exceeded"),
]


@pytest.mark.parametrize("error", FULL_DISK_ERRORS, ids=lambda error: str(error))
async def test_a_full_disk_is_the_stores_own_error_with_its_cause(
    store: Store, error: Exception, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store raises OutOfSpaceError (no driver's error reaches the app, which answers 507)."""

    def full(*args: Any, **kwargs: Any) -> None:
        raise error

    monkeypatch.setattr(store.responses, "_put", full)
    with pytest.raises(OutOfSpaceError) as raised:
        await store.responses.put(ResponseRecord.of(resource("resp_1")), [message("m1", "one")])
    assert raised.value.__cause__ is error


async def test_other_store_errors_are_raised_as_they_were(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise sqlite3.OperationalError("no such table: responses")

    monkeypatch.setattr(store.responses, "_put", broken)
    with pytest.raises(sqlite3.OperationalError):
        await store.responses.put(ResponseRecord.of(resource("resp_1")), [])


async def test_a_file_the_disk_has_no_room_for_is_out_of_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = FileRepository(tmp_path / "files")

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)  # the file store's, as a full disk fails it
    with pytest.raises(OutOfSpaceError) as raised:
        await files.save("o", b"data", filename="a.txt", purpose="user_data", media_type="text/plain")
    assert raised.value.what == "the file" and isinstance(raised.value.__cause__, OSError)
    monkeypatch.undo()
    assert await files.list("o") == ([], False)  # nothing of it left

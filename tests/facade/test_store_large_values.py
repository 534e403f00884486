"""Large values (an input's JSON, its messages) are written in pieces (SQLite: incremental blob
I/O, store/sqlite.py `insert_large`; PostgreSQL binds them whole) and read back exactly as
stored before; the cache keeps copies of a request's messages, never the request."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade.store.message_codec import encode_messages
from vlmserve.facade.store.records import ResponseRecord, StoredItem
from vlmserve.facade.store.repositories import Store
from vlmserve.facade.store.sqlite import LARGE_VALUE_BYTES, SCHEMA_VERSION

# Past the threshold, with escapes and non-ASCII text across the JSON's slices.
LONG = ('quote " backslash \\ newline \n é 漢 😀 nul \x00 ' * 40_000)[: LARGE_VALUE_BYTES + 12_345]


def resource(response_id: str) -> dict[str, Any]:
    return {"id": response_id, "created_at": 1, "status": "completed", "output": []}


def item(item_id: str, text: str) -> StoredItem:
    return StoredItem(
        item_id, {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )


def text_message(text: str) -> pb.Message:
    message = pb.Message(role=pb.ROLE_USER)
    message.parts.add().text.text = text
    return message


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Store]]:
    if request.param == "sqlite":
        store = Store.sqlite(tmp_path / "store.sqlite3")
    else:
        store = Store.postgres(request.getfixturevalue("postgres_url"))
    yield request.param, store
    store.close()


async def test_a_large_input_reads_back_as_it_was_sent(backend: tuple[str, Store], tmp_path: Path) -> None:
    name, store = backend
    small, large = item("msg_small", "hi"), item("msg_large", LONG)
    messages = [text_message("hi"), text_message(LONG)]
    await store.responses.put(
        ResponseRecord.of(resource("resp_1")), [small, large], owner="o", input_messages=messages
    )
    page = await store.responses.list_input_items("resp_1", order="asc", owner="o")
    assert page is not None and [s.item for s in page.items] == [small.item, large.item]
    assert await store.responses.find_item("msg_large", owner="o") == large
    store.db.cache.forget("resp_1")  # read back from the database, not the cache
    replay = await store.responses.replay("resp_1", owner="o")
    assert replay is not None and replay.messages == messages
    # Charged as before: the items' JSON and the messages' bytes.
    stored = len(json.dumps(small.item)) + len(json.dumps(large.item)) + encode_messages(messages).size
    assert await store.stored_bytes("o") == stored + len(json.dumps(resource("resp_1")))
    if name == "sqlite":
        with sqlite3.connect(tmp_path / "store.sqlite3") as db:
            rows = db.execute(
                "SELECT item_id, typeof(item), item FROM response_items ORDER BY position"
            ).fetchall()
            (blob,) = db.execute("SELECT messages FROM response_messages WHERE kind = 'input'").fetchone()
        # The large one was written in place (a blob of the same bytes); the small one bound whole.
        assert rows[0][:2] == ("msg_small", "text") and rows[0][2] == json.dumps(small.item)
        assert rows[1][:2] == ("msg_large", "blob") and rows[1][2] == json.dumps(large.item).encode()
        assert blob == b"".join(encode_messages(messages).pieces)


async def test_a_large_conversation_item_reads_back_as_it_was_sent(backend: tuple[str, Store]) -> None:
    _, store = backend
    await store.conversations.create("conv_1", metadata={}, owner="o")
    large = item("msg_large", LONG)
    assert await store.conversations.append("conv_1", [large], messages=[text_message(LONG)], owner="o")
    store.db.cache.forget("conv_1")
    replay = await store.conversations.replay("conv_1", owner="o")
    assert replay is not None and replay.messages == [text_message(LONG)]
    page = await store.conversations.list_items("conv_1", owner="o")
    assert page is not None and [s.item for s in page.items] == [large.item]


async def test_the_cache_keeps_copies_of_a_requests_messages(backend: tuple[str, Store]) -> None:
    _, store = backend
    request = pb.GenerateRequest(messages=[text_message("earlier"), text_message("the input")])
    # The input's messages as the translation gives them: views into the request.
    await store.responses.put(
        ResponseRecord.of(resource("resp_1")), [], owner="o", input_messages=[request.messages[1]]
    )
    request.messages[1].parts[0].text.text = "changed after"
    replay = await store.responses.replay("resp_1", owner="o")
    assert replay is not None and replay.messages == [text_message("the input")]


async def test_a_schema_4_sqlite_store_keeps_its_messages(tmp_path: Path) -> None:
    path = tmp_path / "v4.sqlite3"
    old = Store.sqlite(path)
    messages = [text_message("kept")]
    await old.responses.put(
        ResponseRecord.of(resource("resp_1")), [item("m1", "kept")], owner="o", input_messages=messages
    )
    await old.conversations.create("conv_1", metadata={}, owner="o")
    await old.conversations.append("conv_1", [item("m2", "kept too")], messages=messages, owner="o")
    old.close()
    with sqlite3.connect(path) as db:
        # Schema 4's column order: the blob before the image hashes.
        for table, key in (
            ("response_messages", "response_id TEXT NOT NULL, kind TEXT NOT NULL"),
            (
                "conversation_messages",
                "conversation_id TEXT NOT NULL, position INTEGER NOT NULL, item_count INTEGER",
            ),
        ):
            columns = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
            keys = ", ".join(name for name in columns if name not in ("messages", "images"))
            db.execute(f"CREATE TABLE old_{table} ({key}, messages BLOB NOT NULL, images TEXT NOT NULL)")
            db.execute(f"INSERT INTO old_{table} SELECT {keys}, messages, images FROM {table}")
            db.execute(f"DROP TABLE {table}")
            db.execute(f"ALTER TABLE old_{table} RENAME TO {table}")
        db.execute("PRAGMA user_version = 4")
    store = Store.sqlite(path)
    response = await store.responses.replay("resp_1", owner="o")
    conversation = await store.conversations.replay("conv_1", owner="o")
    assert response is not None and response.messages == messages
    assert conversation is not None and conversation.messages == messages
    store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        for table in ("response_messages", "conversation_messages"):
            assert [row[1] for row in db.execute(f"PRAGMA table_info({table})")][-2:] == [
                "images",
                "messages",
            ]

"""The SQLite store on its own: owners, chains, paging, durability."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from vlmserve.facade.store import MissingChainLinkError, ResponseStore, StoredItem, UnknownCursorError


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


@pytest.fixture
def store(tmp_path: Path) -> ResponseStore:
    return ResponseStore(tmp_path / "nested" / "store.sqlite3")


def test_uses_wal_and_creates_its_folder(tmp_path: Path, store: ResponseStore) -> None:
    path = tmp_path / "nested" / "store.sqlite3"
    assert path.exists()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_owners_never_see_each_others_objects(store: ResponseStore) -> None:
    store.put_response(resource("resp_a"), [message("msg_1", "secret")], owner="alice")
    assert store.get_response("resp_a", owner="bob") is None
    assert store.list_input_items("resp_a", owner="bob") is None
    assert store.replay_items("resp_a", owner="bob") is None
    assert store.find_item("msg_1", owner="bob") is None
    assert not store.delete_response("resp_a", owner="bob")
    assert store.get_response("resp_a", owner="alice") is not None


def test_replay_walks_the_chain_oldest_first(store: ResponseStore) -> None:
    answer = {"type": "message", "id": "msg_out1", "role": "assistant", "content": []}
    store.put_response(resource("resp_1", output=[answer]), [message("m1", "one")])
    store.put_response(resource("resp_2", previous="resp_1"), [message("m2", "two")])
    items = store.replay_items("resp_2")
    assert items is not None
    assert [item.get("content") for item in items] == ["one", [], "two"]


def test_replay_with_a_deleted_link_names_it(store: ResponseStore) -> None:
    store.put_response(resource("resp_1"), [message("m1", "one")])
    store.put_response(resource("resp_2", previous="resp_1"), [message("m2", "two")])
    store.delete_response("resp_1")
    with pytest.raises(MissingChainLinkError) as missing:
        store.replay_items("resp_2")
    assert missing.value.response_id == "resp_1"


def test_replay_depth_is_bounded(store: ResponseStore) -> None:
    previous = None
    for index in range(5):
        store.put_response(resource(f"resp_{index}", previous=previous), [message(f"m{index}", str(index))])
        previous = f"resp_{index}"
    items = store.replay_items("resp_4", max_depth=2)
    assert items is not None and [item["content"] for item in items] == ["3", "4"]


def test_update_replaces_outputs_and_delete_cascades(store: ResponseStore) -> None:
    store.put_response(resource("resp_1"), [message("m1", "one")])
    out = {"type": "message", "id": "msg_o", "role": "assistant", "content": []}
    assert store.update_response(resource("resp_1", output=[out]))
    assert store.find_item("msg_o") == out
    assert store.delete_response("resp_1")
    assert store.find_item("msg_o") is None and store.find_item("m1") is None
    assert not store.update_response(resource("resp_1"))


def test_paging_errors_on_unknown_cursor(store: ResponseStore) -> None:
    store.put_response(resource("resp_1"), [message("m1", "one")])
    with pytest.raises(UnknownCursorError):
        store.list_input_items("resp_1", after="nope")


def test_conversation_items_append_in_order(store: ResponseStore) -> None:
    store.create_conversation("conv_1", metadata={}, items=[message("a", "1")])
    assert store.append_conversation_items("conv_1", [message("b", "2"), message("c", "3")])
    items = store.conversation_items("conv_1")
    assert items is not None and [entry.id for entry in items] == ["a", "b", "c"]
    assert not store.append_conversation_items("conv_missing", [message("d", "4")])
    assert store.conversation_items("conv_1", owner="someone-else") is None

"""The store's typed records and their rows: what a row reads back as (`from_row`), and that a
record written and read again is the same record, its JSON byte for byte what it was."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vlmserve.facade.store.database import json_value
from vlmserve.facade.store.json_text import SLICE_CHARS
from vlmserve.facade.store.records import ConversationRecord, ResponseRecord, StoredEvent, StoredItem

# (item_id, the row's item column) -> the record it reads back as.
ITEM_ROWS: list[tuple[str, str | bytes, StoredItem]] = [
    (
        "msg_1",
        '{"type": "message", "role": "user", "content": "hi"}',
        StoredItem("msg_1", {"type": "message", "role": "user", "content": "hi"}),
    ),
    # PostgreSQL's driver and SQLite's may hand the text as bytes.
    ("m", b'{"role": "assistant", "content": []}', StoredItem("m", {"role": "assistant", "content": []})),
    # ASCII on disk, the characters in the record.
    (
        "m",
        '{"role": "user", "content": "caf\\u00e9 \\ud83d\\ude00"}',
        StoredItem("m", {"role": "user", "content": "café 😀"}),
    ),
    (
        "fc_1",
        '{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}',
        StoredItem("fc_1", {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}),
    ),
]


@pytest.mark.parametrize(("item_id", "row", "expected"), ITEM_ROWS)
def test_an_item_row_reads_back_as_its_record(item_id: str, row: str | bytes, expected: StoredItem) -> None:
    assert StoredItem.from_row(item_id, row) == expected


@pytest.mark.parametrize(
    ("item", "role"),
    [
        ({"type": "message", "role": "user", "content": "x"}, "user"),
        ({"role": "developer", "content": "x"}, "developer"),
        ({"type": "function_call_output", "call_id": "c", "output": "x"}, None),
        ({"type": "reasoning", "summary": []}, None),
        ({"role": 3}, None),  # not a role: what a client sent is stored as it was, and read as none
    ],
)
def test_an_item_role_is_its_messages_role_or_none(item: dict[str, Any], role: str | None) -> None:
    assert StoredItem("i", item).role == role


@pytest.mark.parametrize(
    "item",
    [
        {"type": "message", "role": "user", "content": "hi"},
        {"role": "user", "content": [{"type": "input_text", "text": 'é😀\n"quoted"'}]},
        {"z": 1, "a": [1.5, None, True], "m": {"nested": {}}},  # key order kept
        {"role": "user", "content": "x" * (SLICE_CHARS + 3) + "é"},  # written in slices
    ],
)
def test_an_item_written_and_read_again_is_the_same_record(item: dict[str, Any]) -> None:
    stored = StoredItem("i", item)
    row = json_value(stored.item).whole()
    assert row == json.dumps(item)  # what the store wrote before records: byte for byte
    assert StoredItem.from_row(stored.id, row) == stored
    assert list(StoredItem.from_row(stored.id, row).item) == list(item)


# A response row's resource column -> the fields of its record.
RESPONSE_ROWS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    (
        {
            "id": "resp_1",
            "created_at": 7,
            "status": "completed",
            "model": "m",
            "previous_response_id": "resp_0",
        },
        {
            "id": "resp_1",
            "status": "completed",
            "background": False,
            "model": "m",
            "created_at": 7,
            "previous_response_id": "resp_0",
            "unfinished": False,
            "cancellable": False,
        },
    ),
    (
        {"id": "resp_2", "status": "queued", "background": True, "model": None, "previous_response_id": None},
        {
            "id": "resp_2",
            "status": "queued",
            "background": True,
            "model": None,
            "created_at": 0,
            "previous_response_id": None,
            "unfinished": True,
            "cancellable": True,
        },
    ),
    (
        {"id": "resp_3", "status": "in_progress", "background": False, "created_at": None},
        {
            "id": "resp_3",
            "status": "in_progress",
            "background": False,
            "model": None,
            "created_at": 0,
            "previous_response_id": None,
            "unfinished": True,
            "cancellable": False,  # a foreground response ends with its client
        },
    ),
]


@pytest.mark.parametrize(("resource", "fields"), RESPONSE_ROWS)
def test_a_response_row_reads_back_as_its_record(resource: dict[str, Any], fields: dict[str, Any]) -> None:
    record = ResponseRecord.from_row(json.dumps(resource))
    assert {name: getattr(record, name) for name in fields} == fields
    assert record.resource == resource


@pytest.mark.parametrize("resource", [resource for resource, _ in RESPONSE_ROWS])
def test_a_response_written_and_read_again_is_the_same_record(resource: dict[str, Any]) -> None:
    record = ResponseRecord.of(resource)
    text = record.resource_text()
    assert text == json.dumps(resource)  # the resource column, fields in their order
    assert ResponseRecord.from_row(text) == record
    assert ResponseRecord.from_row(text.encode()) == record


@pytest.mark.parametrize(
    ("status", "error", "expected"),
    [
        ("cancelled", None, {"status": "cancelled"}),
        (
            "failed",
            {"code": "server_error", "message": "x"},
            {"status": "failed", "error": {"code": "server_error", "message": "x"}},
        ),
    ],
)
def test_an_ended_response_keeps_its_other_fields_in_order(
    status: str, error: dict[str, str] | None, expected: dict[str, Any]
) -> None:
    running = ResponseRecord.of({"id": "r", "status": "in_progress", "background": True, "output": []})
    ended = running.ended(status, error=error)
    assert ended.resource == {**running.resource, **expected}
    assert list(ended.resource)[:4] == ["id", "status", "background", "output"]
    assert ended.status == status and not ended.unfinished
    assert running.status == "in_progress"  # the record it came from is unchanged


# A conversation row (id, created_at, metadata column, model) -> its record.
CONVERSATION_ROWS: list[tuple[tuple[str, int, str | bytes, str | None], ConversationRecord]] = [
    (("conv_1", 5, "{}", None), ConversationRecord("conv_1", 5, {})),
    (
        ("conv_2", 6, '{"topic": "t", "k": "v"}', "model-a"),
        ConversationRecord("conv_2", 6, {"topic": "t", "k": "v"}, "model-a"),
    ),
    (("conv_3", 7, b'{"k": "caf\\u00e9"}', None), ConversationRecord("conv_3", 7, {"k": "café"})),
]


@pytest.mark.parametrize(("row", "expected"), CONVERSATION_ROWS)
def test_a_conversation_row_reads_back_as_its_record(
    row: tuple[str, int, str | bytes, str | None], expected: ConversationRecord
) -> None:
    assert ConversationRecord.from_row(*row) == expected


@pytest.mark.parametrize("record", [expected for _, expected in CONVERSATION_ROWS])
def test_a_conversation_written_and_read_again_is_the_same_record(record: ConversationRecord) -> None:
    text = record.metadata_text()
    assert text == json.dumps(record.metadata)
    assert ConversationRecord.from_row(record.id, record.created_at, text, record.model) == record


# A stored event's row (its `event` column, compact JSON) -> (sequence_number, type).
EVENT_ROWS: list[tuple[str | bytes, tuple[int, str]]] = [
    ('{"type":"response.created","sequence_number":0,"response":{"id":"r"}}', (0, "response.created")),
    (
        b'{"type":"response.output_text.delta","sequence_number":7,"delta":"caf\\u00e9"}',
        (7, "response.output_text.delta"),
    ),
    ('{"sequence_number":12,"type":"response.completed","response":{}}', (12, "response.completed")),
]


@pytest.mark.parametrize(("row", "fields"), EVENT_ROWS)
def test_an_event_row_reads_back_as_its_record(row: str | bytes, fields: tuple[int, str]) -> None:
    stored = StoredEvent.from_row(row)
    assert (stored.sequence_number, stored.type) == fields
    text = row.decode() if isinstance(row, bytes) else row
    # What a resumed stream sends: the row, byte for byte (as the route sent it before records).
    assert stored.event_text() == text == json.dumps(json.loads(text), separators=(",", ":"))


@pytest.mark.parametrize(
    "event",
    [
        {"type": "response.output_text.delta", "sequence_number": 3, "delta": "é😀", "logprobs": []},
        {"type": "error", "sequence_number": 9, "code": None, "message": "m", "param": None},
    ],
)
def test_an_event_written_and_read_again_is_the_same_record(event: dict[str, Any]) -> None:
    stored = StoredEvent.of(event)
    assert StoredEvent.from_row(stored.event_text()) == stored
    assert list(StoredEvent.from_row(stored.event_text()).event) == list(event)


@pytest.mark.parametrize("event", [{"type": "response.created"}, {"sequence_number": 1}])
def test_an_event_without_its_number_or_type_is_refused(event: dict[str, Any]) -> None:
    with pytest.raises(KeyError):
        StoredEvent.of(event)

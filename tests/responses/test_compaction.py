"""The pure parts of compaction: the item's content read back, what is kept, the output list."""

from __future__ import annotations

from typing import Any

import pytest

from vlmserve.responses._compaction import (
    CONTENT_PREFIX,
    compacted_output,
    compaction_item,
    compaction_summary,
    kept_items,
)

USER = {"role": "user", "content": "hi"}
ASSISTANT = {"role": "assistant", "content": "hello"}
CALL = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "c", "output": "ok"}


def test_the_summary_comes_back() -> None:
    item = compaction_item("Alice likes red squares; ünïcode kept.")
    assert item["type"] == "compaction" and item["id"].startswith("cmp_")
    assert compaction_summary(item["encrypted_content"]) == "Alice likes red squares; ünïcode kept."


@pytest.mark.parametrize(
    "content",
    ["", "gAAAAABpM0Yj", CONTENT_PREFIX, CONTENT_PREFIX + "!!!", CONTENT_PREFIX + "WzFd"],  # WzFd: [1]
)
def test_foreign_or_broken_content_is_not_read(content: str) -> None:
    assert compaction_summary(content) is None


@pytest.mark.parametrize(
    ("items", "kept"),
    [
        ([], []),
        ([ASSISTANT], []),
        ([USER, ASSISTANT], [USER, ASSISTANT]),
        ([USER, ASSISTANT, {**USER, "content": "again"}], [{**USER, "content": "again"}]),
        ([USER, CALL, OUTPUT], [USER, CALL, OUTPUT]),
        ([{"type": "message", **USER}, ASSISTANT, CALL], [{"type": "message", **USER}, ASSISTANT, CALL]),
    ],
)
def test_kept_from_the_last_user_message_on(items: list[Any], kept: list[Any]) -> None:
    assert kept_items(items) == kept


def test_the_output_types_kept_messages() -> None:
    output = compacted_output("s", [USER, ASSISTANT, CALL], lambda prefix: f"{prefix}_1")
    assert [item["type"] for item in output] == ["compaction", "message", "message", "function_call"]
    assert output[1] == {
        "type": "message",
        "id": "msg_1",
        "status": "completed",
        "role": "user",
        "content": [{"type": "input_text", "text": "hi"}],
    }
    assert output[2]["content"] == [
        {"type": "output_text", "text": "hello", "annotations": [], "logprobs": []}
    ]
    assert output[3] == CALL

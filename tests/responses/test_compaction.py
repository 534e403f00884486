"""The pure parts of compaction: the item's content read back, what is kept, the output list."""

from __future__ import annotations

from typing import Any

import pytest

from vlmserve.facade.responses.compaction_seal import PREFIX, CompactionSeal
from vlmserve.responses import CompactionState, KeptImage, clean_summary, parse_create_request
from vlmserve.responses._compaction import compacted_output, compaction_item, kept_items, opening_compactions

USER = {"role": "user", "content": "hi"}
ASSISTANT = {"role": "assistant", "content": "hello"}
CALL = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "c", "output": "ok"}
SEAL = CompactionSeal(bytes(range(32)))
STATE = CompactionState("Alice likes red squares; ünïcode kept.", (KeptImage(b"\x89PNG...", "image/png"),))


def test_the_state_comes_back_for_its_owner_only() -> None:
    sealed = SEAL.seal(STATE, owner="alice")
    assert sealed.startswith(PREFIX)
    # Not readable: neither the summary nor its encoding is in it.
    assert "Alice" not in sealed and "QWxpY2U" not in sealed
    assert SEAL.open(sealed, owner="alice") == STATE
    assert SEAL.open(sealed, owner="bob") is None
    assert CompactionSeal(bytes(32)).open(sealed, owner="alice") is None
    # Every byte is authenticated: any change is refused.
    body = sealed[len(PREFIX) :]
    for at in (0, len(body) // 2, len(body) - 2):
        flipped = body[:at] + ("A" if body[at] != "A" else "B") + body[at + 1 :]
        assert SEAL.open(PREFIX + flipped, owner="alice") is None


@pytest.mark.parametrize(
    "content",
    [
        "",
        "gAAAAABpM0Yj",
        PREFIX,
        PREFIX + "!!!",
        PREFIX + "WzFd",
        "vlmserve.compaction.v1.eyJzdW1tYXJ5IjoieCJ9",
    ],
)
def test_foreign_or_broken_content_is_not_read(content: str) -> None:
    assert SEAL.open(content, owner="alice") is None


def test_an_item_parses_only_with_its_owners_opener() -> None:
    item = compaction_item(SEAL.seal(STATE, owner="alice"))
    body = {"model": "m", "input": [item, {"role": "user", "content": "go on"}]}
    with opening_compactions(lambda content: SEAL.open(content, owner="alice")):
        parsed = parse_create_request(body)
    assert parsed.body.input[0].state == STATE  # type: ignore[union-attr,index]
    for opener in (None, lambda content: SEAL.open(content, owner="bob")):
        with opening_compactions(opener), pytest.raises(Exception) as refused:
            parse_create_request(body)
        assert getattr(refused.value, "param", None) == "input[0].encrypted_content"


@pytest.mark.parametrize(
    ("text", "clean"),
    [
        ("Goal: a red square.", "Goal: a red square."),
        ('Done.<tool_call>{"name": "click"}</tool_call>', "Done."),
        ("<think>hmm</think>Progress: step 3.<|im_end|>", "Progress: step 3."),
        ('Next: save. <tool_call>{"name": "cut off', "Next: save."),
    ],
)
def test_the_summary_is_clean_text(text: str, clean: str) -> None:
    assert clean_summary(text) == clean


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
    output = compacted_output("sealed", [USER, ASSISTANT, CALL], lambda prefix: f"{prefix}_1")
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

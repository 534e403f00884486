"""Responses input lowered to the contract: Responses-native parts and image-bearing tool outputs."""

from __future__ import annotations

import json

import pytest

from tests.responses.responses_testkit import (
    GREEN,
    GREEN_URL,
    RED,
    RED_URL,
    function_call,
    function_output,
    images_of,
    input_image,
    input_text,
    message,
    texts_of,
)
from vlmserve.engine.prep.lowering import IMAGE_FOLLOW_UP_MARKER, lower_messages
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.responses import InvalidRequestError, input_to_messages


def lowered(items: list[dict[str, object]]) -> list[pb.Message]:
    return lower_messages(input_to_messages(items))


def test_input_text_and_input_image_parts_lower_to_chat_parts() -> None:
    items = [message("user", [input_text("what colour?"), input_image(RED_URL, detail="high")])]
    [user] = lowered(items)
    assert user.role == pb.ROLE_USER
    assert [part.WhichOneof("kind") for part in user.parts] == ["text", "image"]
    assert user.parts[0].text.text == "what colour?"
    assert user.parts[1].image.data == RED
    assert user.parts[1].image.media_type == "image/png"
    assert user.parts[1].image.detail == pb.IMAGE_DETAIL_HIGH


def test_input_image_file_id_without_a_files_store_is_rejected_with_named_error() -> None:
    items = [message("user", [input_text("hi"), {"type": "input_image", "file_id": "file-1"}])]
    with pytest.raises(InvalidRequestError) as caught:
        input_to_messages(items)
    assert caught.value.param == "input[0].content[1].file_id"
    assert "files store" in caught.value.message
    assert "file_data" in caught.value.message


@pytest.mark.parametrize("where", ["message", "tool_output"])
def test_input_file_by_id_without_a_files_store_is_rejected(where: str) -> None:
    file_part = {"type": "input_file", "file_id": "file-1", "filename": "a.pdf"}
    if where == "message":
        items = [message("user", [input_text("read"), file_part])]
        expected = "input[0].content[1].file_id"
    else:
        items = [function_call(), function_output([input_text("x"), file_part])]
        expected = "input[1].output[1].file_id"
    with pytest.raises(InvalidRequestError) as caught:
        input_to_messages(items)
    assert caught.value.param == expected
    assert caught.value.code == "unsupported_value"


def test_function_output_image_stays_after_tool_result() -> None:
    items = [
        message("user", "Take a screenshot and tell me its dominant color."),
        function_call(),
        function_output([input_text("done"), input_image(RED_URL)]),
    ]
    messages = lowered(items)
    assert [m.role for m in messages] == [pb.ROLE_USER, pb.ROLE_ASSISTANT, pb.ROLE_TOOL, pb.ROLE_USER]
    tool, follow_up = messages[2], messages[3]
    assert tool.tool_output.WhichOneof("output") == "text"
    assert tool.tool_output.text.endswith(IMAGE_FOLLOW_UP_MARKER)
    assert tool.tool_output.text == f"done\n{IMAGE_FOLLOW_UP_MARKER}"
    assert [part.WhichOneof("kind") for part in follow_up.parts] == ["image"]
    assert images_of(follow_up) == [RED]


def test_function_output_preserves_text_alongside_visual_input() -> None:
    output = [input_text("left"), input_image(RED_URL), input_text("right"), input_image(GREEN_URL, "low")]
    messages = lowered([function_call(), function_output(output)])
    tool, follow_up = messages[1], messages[2]
    assert tool.tool_output.text == f"left\nright\n{IMAGE_FOLLOW_UP_MARKER}"
    assert images_of(follow_up) == [RED, GREEN]
    assert [part.image.detail for part in follow_up.parts] == [pb.IMAGE_DETAIL_AUTO, pb.IMAGE_DETAIL_LOW]
    assert not texts_of(follow_up)


@pytest.mark.parametrize("text", ["", "plain result", '{"ok": true}', "line one\nline two"])
def test_function_output_string_form_is_unchanged(text: str) -> None:
    messages = lowered([function_call(), function_output(text)])
    assert len(messages) == 2
    assert messages[1].tool_output.WhichOneof("output") == "text"
    assert messages[1].tool_output.text == text


def test_unknown_function_output_parts_remain_as_json_text() -> None:
    foo = {"type": "foo", "value": 1, "nested": {"é": [1, 2]}}
    bar = {"no_type": True}
    messages = lowered([function_call(), function_output([input_text("ok"), foo, bar])])
    assert len(messages) == 2  # no images -> no follow-up turn
    text = messages[1].tool_output.text
    assert text == "ok\n" + json.dumps([foo, bar], ensure_ascii=False)
    assert IMAGE_FOLLOW_UP_MARKER not in text


@pytest.mark.parametrize("role", ["assistant", "system", "developer"])
def test_assistant_message_image_moves_to_following_user_turn(role: str) -> None:
    items = [
        message(role, [input_text("before"), input_image(RED_URL), input_text("after")]),
        message("user", "next"),
    ]
    messages = lowered(items)
    assert [m.role for m in messages][:2] == [
        {"assistant": pb.ROLE_ASSISTANT, "system": pb.ROLE_SYSTEM, "developer": pb.ROLE_DEVELOPER}[role],
        pb.ROLE_USER,
    ]
    assert texts_of(messages[0]) == ["before", "after"]
    assert not images_of(messages[0])
    assert images_of(messages[1]) == [RED]
    assert not texts_of(messages[1])  # no marker line outside tool outputs
    assert texts_of(messages[2]) == ["next"]

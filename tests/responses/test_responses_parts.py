"""Content parts and input items (docs/responses-api.md, "Content parts", "Input items") -> raw
contract messages."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.responses.responses_testkit import (
    GREEN,
    GREEN_URL,
    RED,
    RED_URL,
    data_url,
    function_call,
    function_output,
    image_bytes,
    input_image,
    input_text,
    message,
)
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.responses import InvalidRequestError, input_to_messages


def only_part(part: dict[str, Any], role: str = "user") -> pb.Part:
    [converted] = input_to_messages([message(role, [part])])
    [result] = converted.parts
    return result


@pytest.mark.parametrize("part_type", ["input_text", "text", "output_text"])
def test_text_part_types_become_text(part_type: str) -> None:
    assert only_part({"type": part_type, "text": "héllo"}) == pb.Part(text=pb.TextPart(text="héllo"))


def test_output_text_extras_are_accepted() -> None:
    part = {"type": "output_text", "text": "said", "annotations": [], "logprobs": []}
    assert only_part(part, "assistant").text.text == "said"


def test_refusal_part_becomes_text() -> None:
    assert only_part({"type": "refusal", "refusal": "I can't."}, "assistant").text.text == "I can't."


@pytest.mark.parametrize(
    ("detail", "expected"),
    [
        (None, pb.IMAGE_DETAIL_AUTO),
        ("auto", pb.IMAGE_DETAIL_AUTO),
        ("low", pb.IMAGE_DETAIL_LOW),
        ("high", pb.IMAGE_DETAIL_HIGH),
        ("original", pb.IMAGE_DETAIL_ORIGINAL),
    ],
)
def test_image_detail_is_carried(detail: str | None, expected: pb.ImageDetail.ValueType) -> None:
    assert only_part(input_image(RED_URL, detail)).image.detail == expected


@pytest.mark.parametrize(
    ("fmt", "media_type"),
    [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp"), ("GIF", "image/gif")],
)
def test_image_bytes_and_media_type_are_kept(fmt: str, media_type: str) -> None:
    data = image_bytes(fmt=fmt)
    image = only_part(input_image(data_url(data, media_type))).image
    assert (image.data, image.media_type) == (data, media_type)


def test_media_type_is_sniffed_when_not_declared() -> None:
    image = only_part(input_image(RED_URL.replace("data:image/png;", "data:;"))).image
    assert image.media_type == "image/png"


def test_data_url_scheme_is_case_insensitive() -> None:
    assert only_part(input_image("DATA" + RED_URL[4:])).image.data == RED


@pytest.mark.parametrize(
    "chat_part",
    [
        {"type": "image_url", "image_url": {"url": RED_URL, "detail": "low"}},
        {"type": "image_url", "image_url": RED_URL, "detail": "low"},
        {"type": "image_url", "image_url": {"url": RED_URL}, "detail": "low"},
    ],
    ids=["object", "string", "object-outer-detail"],
)
def test_input_image_and_chat_image_url_give_identical_messages(chat_part: dict[str, Any]) -> None:
    native = input_to_messages([message("user", [input_text("colour?"), input_image(RED_URL, "low")])])
    chat = input_to_messages([message("user", [{"type": "text", "text": "colour?"}, chat_part])])
    assert native == chat


def test_string_input_is_one_user_message() -> None:
    assert input_to_messages("hello") == [
        pb.Message(role=pb.ROLE_USER, parts=[pb.Part(text=pb.TextPart(text="hello"))])
    ]


def test_instructions_become_a_leading_system_turn() -> None:
    messages = input_to_messages("hi", instructions="Be brief.")
    assert [m.role for m in messages] == [pb.ROLE_SYSTEM, pb.ROLE_USER]
    assert messages[0].parts[0].text.text == "Be brief."


def test_easy_message_without_type_is_a_message() -> None:
    [converted] = input_to_messages([{"role": "developer", "content": "rules"}])
    assert converted.role == pb.ROLE_DEVELOPER


def test_codex_item_fields_are_accepted() -> None:
    items = [
        {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "user",
            "content": [input_text("go")],
        },
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": None, "encrypted_content": "opaque"},
        {**function_call("call_1", "view_image", '{"path": "a.png"}'), "id": "fc_1", "status": "completed"},
        {**function_output([input_image(RED_URL, "high")], "call_1"), "id": "fco_1", "status": "completed"},
    ]
    _, assistant, tool = input_to_messages(items)
    assert assistant.tool_calls == [
        pb.ToolCall(id="call_1", name="view_image", arguments='{"path": "a.png"}', kind=pb.TOOL_KIND_FUNCTION)
    ]
    [image] = tool.tool_output.parts.parts
    assert (image.image.data, image.image.detail) == (RED, pb.IMAGE_DETAIL_HIGH)


def test_reasoning_items_are_not_rendered() -> None:
    items = [message("user", "q"), {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]}]
    assert input_to_messages(items) == input_to_messages([message("user", "q")])


def test_calls_join_the_assistant_turn_they_follow() -> None:
    items = [
        message("user", "q"),
        message("assistant", [{"type": "output_text", "text": "calling"}]),
        {"type": "reasoning", "summary": []},
        function_call("a", "f"),
        function_call("b", "g"),
        function_output("ra", "a"),
        function_output("rb", "b"),
        function_call("c", "h"),
    ]
    messages = input_to_messages(items)
    assert [m.role for m in messages] == [
        pb.ROLE_USER,
        pb.ROLE_ASSISTANT,
        pb.ROLE_TOOL,
        pb.ROLE_TOOL,
        pb.ROLE_ASSISTANT,
    ]
    assert [call.id for call in messages[1].tool_calls] == ["a", "b"]
    assert messages[1].parts[0].text.text == "calling"
    assert [call.id for call in messages[4].tool_calls] == ["c"]


def test_calls_do_not_join_an_assistant_turn_with_images() -> None:
    items = [message("assistant", [input_image(RED_URL)]), function_call("a")]
    messages = input_to_messages(items)
    assert len(messages) == 2
    assert not messages[0].tool_calls
    assert [call.id for call in messages[1].tool_calls] == ["a"]


def test_custom_tool_call_and_output() -> None:
    items = [
        {"type": "custom_tool_call", "call_id": "p1", "name": "apply_patch", "input": "*** Begin Patch"},
        {
            "type": "custom_tool_call_output",
            "call_id": "p1",
            "output": [input_text("ok"), input_image(GREEN_URL)],
        },
    ]
    assistant, tool = input_to_messages(items)
    assert assistant.tool_calls[0] == pb.ToolCall(
        id="p1", name="apply_patch", arguments="*** Begin Patch", kind=pb.TOOL_KIND_CUSTOM
    )
    assert tool.tool_output.kind == pb.TOOL_KIND_CUSTOM
    assert [p.WhichOneof("kind") for p in tool.tool_output.parts.parts] == ["text", "image"]
    assert tool.tool_output.parts.parts[1].image.data == GREEN


def test_tool_output_keeps_parts_raw_in_order() -> None:
    foo = {"type": "foo", "x": [1, 2]}
    output = [
        input_image(RED_URL),
        foo,
        {"type": "text", "text": "t"},
        {"type": "image_url", "image_url": GREEN_URL},
    ]
    [_, tool] = input_to_messages([function_call(), function_output(output)])
    parts = tool.tool_output.parts.parts
    assert [p.WhichOneof("kind") for p in parts] == ["image", "json", "text", "image"]
    assert json.loads(parts[1].json.json) == foo
    assert (parts[0].image.data, parts[3].image.data) == (RED, GREEN)


def test_image_only_input_is_not_empty() -> None:
    [user] = input_to_messages([message("user", [input_image(RED_URL)])])
    assert user.parts[0].image.data == RED


@pytest.mark.parametrize(
    "items",
    [
        [message("assistant", [input_image(RED_URL)])],
        [function_output([input_image(RED_URL)])],
        [function_output("")],
        [function_call()],
    ],
    ids=["assistant-image", "tool-output-image", "empty-tool-output", "tool-call"],
)
def test_inputs_without_text_are_not_empty(items: list[dict[str, Any]]) -> None:
    assert input_to_messages(items)


def test_item_reference_is_resolved() -> None:
    stored = {"msg_1": message("user", [input_text("stored"), input_image(RED_URL)])}
    items = [{"type": "item_reference", "id": "msg_1"}, {"id": "msg_1"}]
    messages = input_to_messages(items, resolve_item=stored.get)
    assert messages == input_to_messages([stored["msg_1"], stored["msg_1"]])


def test_item_reference_to_a_reference_is_refused() -> None:
    stored = {"a": {"type": "item_reference", "id": "a"}}
    with pytest.raises(InvalidRequestError) as caught:
        input_to_messages([{"type": "item_reference", "id": "a"}], resolve_item=stored.get)
    assert caught.value.param == "input[0].id"

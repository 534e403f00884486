"""Property-based checks of the lowering's invariants (docs/responses-api.md, "The image follow-up
lowering": idempotent, images kept in number and order, no text lost) on generated Responses inputs."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.responses.responses_testkit import data_url, image_bytes
from vlmserve.engine.prep.lowering import lower_messages
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.responses import input_to_messages, messages_to_items

# Distinct tiny images, so that order can be checked by comparing bytes.
POOL = [image_bytes((40 * i, 255 - 40 * i, 7 * i)) for i in range(5)]
POOL_URLS = [data_url(data) for data in POOL]

texts = st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=12).filter(
    lambda text: text.strip() != ""
)
images = st.builds(
    lambda index, detail: {
        "type": "input_image",
        "image_url": POOL_URLS[index],
        **({"detail": detail} if detail else {}),
    },
    st.integers(0, len(POOL) - 1),
    st.sampled_from([None, "auto", "low", "high", "original"]),
)
chat_images = st.builds(
    lambda index: {"type": "image_url", "image_url": {"url": POOL_URLS[index]}}, st.integers(0, len(POOL) - 1)
)
text_parts = st.builds(
    lambda kind, text: {"type": kind, "text": text}, st.sampled_from(["input_text", "text"]), texts
)
unknown_parts = st.builds(lambda value: {"type": "custom_thing", "value": value}, texts)

message_parts = st.lists(st.one_of(text_parts, images, chat_images), min_size=1, max_size=4)
output_parts = st.lists(st.one_of(text_parts, images, unknown_parts), max_size=4)


def _message(role: str, content: Any) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": content}


messages = st.builds(
    _message, st.sampled_from(["user", "assistant", "system", "developer"]), st.one_of(texts, message_parts)
)
calls = st.builds(
    lambda call_id, name: {"type": "function_call", "call_id": call_id, "name": name, "arguments": "{}"},
    texts,
    texts,
)
outputs = st.builds(
    lambda kind, output: {"type": kind, "call_id": "c", "output": output},
    st.sampled_from(["function_call_output", "custom_tool_call_output"]),
    st.one_of(texts, output_parts),
)
items = st.lists(st.one_of(messages, calls, outputs), min_size=1, max_size=6)


def sent_images(item_list: list[dict[str, Any]]) -> list[bytes]:
    """The images in the order the client sent them."""
    found: list[bytes] = []
    for item in item_list:
        parts = item.get("content") if item["type"] == "message" else item.get("output")
        if not isinstance(parts, list):
            continue
        for part in parts:
            if part["type"] == "input_image":
                found.append(POOL[POOL_URLS.index(part["image_url"])])
            elif part["type"] == "image_url":
                found.append(POOL[POOL_URLS.index(part["image_url"]["url"])])
    return found


def sent_texts(item_list: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(plain texts in order, JSON of the unknown parts)."""
    found: list[str] = []
    leftovers: list[str] = []
    for item in item_list:
        if item["type"] == "function_call":
            continue
        content = item.get("content") if item["type"] == "message" else item.get("output")
        if isinstance(content, str):
            found.append(content)
            continue
        for part in content or []:
            if part["type"] in ("input_text", "text"):
                found.append(part["text"])
            elif part["type"] == "custom_thing":
                leftovers.append(json.dumps(part, ensure_ascii=False))
    return found, leftovers


def received_images(messages_: list[pb.Message]) -> list[bytes]:
    return [
        part.image.data
        for message in messages_
        for part in message.parts
        if part.WhichOneof("kind") == "image"
    ]


def rendered_text(messages_: list[pb.Message]) -> str:
    chunks: list[str] = []
    for message in messages_:
        chunks.extend(part.text.text for part in message.parts if part.WhichOneof("kind") == "text")
        if message.HasField("tool_output"):
            chunks.append(message.tool_output.text)
    return "\n".join(chunks)


@settings(max_examples=150, deadline=None)
@given(items)
def test_images_only_in_user_turns_after_lowering(item_list: list[dict[str, Any]]) -> None:
    lowered = lower_messages(input_to_messages(item_list))
    for message in lowered:
        kinds = {part.WhichOneof("kind") for part in message.parts}
        if message.role != pb.ROLE_USER:
            assert "image" not in kinds
        if message.role == pb.ROLE_TOOL:
            assert message.tool_output.WhichOneof("output") != "parts"


@settings(max_examples=150, deadline=None)
@given(items)
def test_number_and_order_of_images_preserved(item_list: list[dict[str, Any]]) -> None:
    assert received_images(lower_messages(input_to_messages(item_list))) == sent_images(item_list)


@settings(max_examples=150, deadline=None)
@given(items)
def test_no_text_is_lost(item_list: list[dict[str, Any]]) -> None:
    rendered = rendered_text(lower_messages(input_to_messages(item_list)))
    plain, leftovers = sent_texts(item_list)
    position = 0
    for text in plain:  # in order, each after the previous one
        position = rendered.find(text, position)
        assert position >= 0
        position += len(text)
    for leftover in leftovers:
        assert leftover in rendered


@settings(max_examples=150, deadline=None)
@given(items)
def test_lowering_is_idempotent(item_list: list[dict[str, Any]]) -> None:
    once = lower_messages(input_to_messages(item_list))
    assert lower_messages(once) == once


@settings(max_examples=100, deadline=None)
@given(items)
def test_outbound_items_replay_to_the_same_lowering(item_list: list[dict[str, Any]]) -> None:
    raw = input_to_messages(item_list)
    assert lower_messages(input_to_messages(messages_to_items(raw))) == lower_messages(raw)


image_only_items = st.lists(
    st.one_of(
        st.builds(
            _message,
            st.sampled_from(["user", "assistant", "system", "developer"]),
            st.lists(images, min_size=1, max_size=3),
        ),
        st.builds(
            lambda parts: {"type": "function_call_output", "call_id": "c", "output": parts},
            st.lists(images, min_size=1, max_size=3),
        ),
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=60, deadline=None)
@given(image_only_items)
def test_image_only_input_is_not_empty(item_list: list[dict[str, Any]]) -> None:
    lowered = lower_messages(input_to_messages(item_list))
    assert received_images(lowered) == sent_images(item_list)

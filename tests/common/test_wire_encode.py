"""`encode` writes exactly what `SerializeToString()` does (a raw gRPC client and the engine see
the same bytes), and a held text exactly as if it were in the message (common/wire_encode.py)."""

from __future__ import annotations

import pytest
from google.protobuf.message import Message

from vlmserve.common import wire_encode
from vlmserve.common.wire_encode import HeldMessages, HeldTexts, OutgoingRequest, encode
from vlmserve.common.wire_size import wire_size
from vlmserve.engine.v1 import engine_pb2 as pb

from ._wire_cases import CASES, generate_request


@pytest.mark.parametrize("message", CASES, ids=lambda message: type(message).__name__)
def test_encode_is_serialize_to_string(message: Message) -> None:
    assert encode(message) == message.SerializeToString()


def test_a_held_text_is_written_as_if_it_were_in_the_message() -> None:
    held = HeldTexts(min_chars=10)
    texts = ["ascii " * 10, "non-ASCII é😀漢 " * 10]
    expected = generate_request(texts[0])
    expected.messages[0].parts.add().text.text = texts[1]
    request = generate_request(held.hold(texts[0]))
    request.messages[0].parts.add().text.text = held.hold(texts[1])
    assert len(held) == 2
    assert held.holds_any(request) and held.holds_any(request.messages[0])
    assert not held.holds_any(request.messages[1])
    assert request.SerializeToString() != expected.SerializeToString()
    assert encode(request, held) == expected.SerializeToString()
    assert wire_size(request, held) == expected.ByteSize()
    assert pb.GenerateRequest.FromString(encode(request, held)) == expected


def test_short_texts_are_not_held_and_markers_differ_by_request() -> None:
    held, other = HeldTexts(min_chars=10), HeldTexts(min_chars=10)
    assert held.hold("short") == "short"
    marker = held.hold("x" * 10)
    assert marker != "x" * 10 and marker not in other
    # Another request's marker is just text to this one.
    part = pb.Part(text=pb.TextPart(text=marker))
    assert encode(part, other) == part.SerializeToString()


def test_long_texts_are_written_in_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire_encode, "_SLICE_CHARS", 3)
    part = pb.Part(text=pb.TextPart(text="a😀é" * 10 + "z"))
    assert encode(part) == part.SerializeToString()


def test_an_outgoing_request_is_measured_encoded_and_handed_out_only_with_its_texts() -> None:
    held = HeldTexts(min_chars=10)
    text = "non-ASCII é😀漢 " * 10
    expected = generate_request(text)
    expected.model, expected.request_id, expected.partition_key = "m", "resp_1", "owner"
    expected.sampling.max_tokens = 7
    outgoing = OutgoingRequest(generate_request(held.hold(text)), held)
    outgoing.model, outgoing.request_id, outgoing.partition_key = "m", "resp_1", "owner"
    outgoing.sampling.max_tokens = 7
    assert outgoing.encode() == expected.SerializeToString()
    assert outgoing.wire_size() == expected.ByteSize()
    assert list(outgoing.images()) == [
        part.image for message in expected.messages for part in message.parts if part.HasField("image")
    ]
    # Its message holds a marker: it is not handed out to be serialized by protobuf.
    with pytest.raises(ValueError, match="holds texts apart"):
        outgoing.plain()
    plain = OutgoingRequest(expected)
    assert plain.plain() is expected and plain.encode() == expected.SerializeToString()


def test_an_outgoing_request_without_messages_is_a_new_one_with_the_same_texts() -> None:
    held = HeldTexts(min_chars=10)
    text = "non-ASCII é😀漢 " * 10
    whole = generate_request(text)
    outgoing = OutgoingRequest(generate_request(held.hold(text)), held)
    before = outgoing.encode()
    assert outgoing.turns() == [
        wire_encode.Turn(pb.ROLE_USER, range(0)),
        wire_encode.Turn(pb.ROLE_ASSISTANT, range(1)),
        wire_encode.Turn(pb.ROLE_TOOL, range(0)),
    ]
    assert outgoing.whole() == whole and outgoing.whole() is not outgoing.whole()
    # The held text's message kept, the tool turns gone: the new request still writes the text.
    kept = outgoing.without_messages({1, 2})
    expected = generate_request(text)
    del expected.messages[1:]
    assert kept.held is held and kept.encode() == expected.SerializeToString()
    # The held text's message gone; the request left behind is unchanged.
    assert (
        outgoing.without_messages({0}).encode()
        == pb.GenerateRequest(**{**_fields(whole), "messages": whole.messages[1:]}).SerializeToString()
    )
    assert outgoing.encode() == before
    plain = OutgoingRequest(whole)
    assert plain.whole() is whole


def _fields(message: pb.GenerateRequest) -> dict[str, object]:
    return {field.name: value for field, value in message.ListFields()}


def test_held_messages_are_measured_encoded_and_copied_only_with_their_texts() -> None:
    held = HeldTexts(min_chars=10)
    text = "non-ASCII é😀漢 " * 10
    expected = generate_request(text).messages
    messages = HeldMessages(generate_request(held.hold(text)).messages, held)
    assert messages.holds_markers() and len(messages) == len(expected)
    assert messages.wire_size() == sum(message.ByteSize() for message in expected)
    assert list(messages.encode_each()) == [message.SerializeToString() for message in expected]
    assert messages.owned() == list(expected)
    with pytest.raises(ValueError, match="hold texts apart"):
        messages.plain()
    more = messages.plus([pb.Message(role=pb.ROLE_ASSISTANT)])
    assert more.owned() == [*expected, pb.Message(role=pb.ROLE_ASSISTANT)]
    assert HeldMessages(expected).plain() == list(expected)

"""A protobuf message's bytes written by hand, and texts held out of a message until then.

The wire format is simple (tag, varint length, payload), and writing it here lets a long text
go from the client's own `str` straight into the request's bytes, a slice at a time: upb would
hold the text once in the message, once in its encoder's buffer and once more in the `bytes` it
returns (docs/hardening.md, "Memory per request byte"). `encode(message)` is exactly
`message.SerializeToString()` (field-number order, the same varints; tests compare them), with
every marker of `held` written as the text it stands for.

`HeldTexts.hold(text)` keeps a long text apart and gives a short marker to put in the message in
its place: such a message must then only be measured (`wire_size(message, held)`) and written
(`encode(message, held)`) with its `held`, never serialized by protobuf or read for its text. A
GenerateRequest holding markers travels as an `OutgoingRequest`, which hands its messages to no
one: measuring, encoding and sending it all go through it.
"""

from __future__ import annotations

import io
import secrets
import struct
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass
from typing import Any, Final

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from vlmserve.common.wire_size import NO_TEXTS, ZIGZAG, utf8_length, wire_size
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = ["HOLD_MIN_CHARS", "HeldMessages", "HeldTexts", "OutgoingRequest", "Turn", "encode"]

_TYPE = FieldDescriptor
# Texts shorter than this go into the message as they are: holding them saves nothing.
HOLD_MIN_CHARS = 1 << 20
# A long text goes out a slice at a time: its UTF-8 is never whole beside the request's bytes.
_SLICE_CHARS = 1 << 20
_WIRE_VARINT, _WIRE_FIXED64, _WIRE_LENGTH, _WIRE_FIXED32 = 0, 1, 2, 5
_FIXED = {
    _TYPE.TYPE_FIXED32: (struct.Struct("<I"), _WIRE_FIXED32),
    _TYPE.TYPE_SFIXED32: (struct.Struct("<i"), _WIRE_FIXED32),
    _TYPE.TYPE_FLOAT: (struct.Struct("<f"), _WIRE_FIXED32),
    _TYPE.TYPE_FIXED64: (struct.Struct("<Q"), _WIRE_FIXED64),
    _TYPE.TYPE_SFIXED64: (struct.Struct("<q"), _WIRE_FIXED64),
    _TYPE.TYPE_DOUBLE: (struct.Struct("<d"), _WIRE_FIXED64),
}


class HeldTexts(Mapping[str, str]):
    """Long texts of one request, kept out of its messages: marker -> text. A marker is random
    per request, so no client text can pass for one."""

    def __init__(self, min_chars: int | None = None) -> None:
        self._min_chars = HOLD_MIN_CHARS if min_chars is None else min_chars
        self._prefix = f"\x00held:{secrets.token_hex(16)}:"
        self._texts: dict[str, str] = {}

    def hold(self, text: str) -> str:
        """What to put in the message for `text`: a marker for a long one, else the text."""
        if len(text) < self._min_chars:
            return text
        marker = f"{self._prefix}{len(self._texts)}"
        self._texts[marker] = text
        return marker

    def holds_any(self, message: Message) -> bool:
        """Whether a marker of these texts is in `message` (at any depth)."""
        return bool(self._texts) and any(self._in(field, value) for field, value in message.ListFields())

    def _in(self, field: FieldDescriptor, value: Any) -> bool:
        values: Iterable[Any] = value if field.is_repeated else (value,)
        if field.type == _TYPE.TYPE_MESSAGE:
            return any(self.holds_any(item) for item in values)
        return field.type == _TYPE.TYPE_STRING and any(item in self._texts for item in values)

    def __getitem__(self, marker: str) -> str:
        return self._texts[marker]

    def __iter__(self) -> Iterator[str]:
        return iter(self._texts)

    def __len__(self) -> int:
        return len(self._texts)


@dataclass(frozen=True, slots=True)
class Turn:
    """What truncation reads of a message: its role and its tool calls (only how many)."""

    role: int
    # Sized like a message's `tool_calls`: a range of their count (their fields may hold markers).
    tool_calls: Sized = ()


class OutgoingRequest:
    """A GenerateRequest on its way to the engine, with the texts it holds apart (`HeldTexts`):
    the only way to measure (`wire_size`), encode (`encode`) and send it
    (`AsyncEngineClient.generate` takes one). Its messages are not handed out, so a marker cannot
    meet protobuf's serializer; the fields outside them (which never hold markers) are read and
    set here. `plain()` gives the message itself to a caller that sends it its own way, only when
    it holds no texts apart."""

    __slots__ = ("_held", "_message")

    def __init__(self, message: pb.GenerateRequest, held: HeldTexts | None = None) -> None:
        self._message: Final = message
        self._held: Final = held

    @property
    def held(self) -> HeldTexts | None:
        """The texts held apart (None: none)."""
        return self._held

    @property
    def sampling(self) -> pb.SamplingParams:
        return self._message.sampling

    @property
    def model(self) -> str:
        return self._message.model

    @model.setter
    def model(self, value: str) -> None:
        self._message.model = value

    @property
    def request_id(self) -> str:
        return self._message.request_id

    @request_id.setter
    def request_id(self, value: str) -> None:
        self._message.request_id = value

    @property
    def partition_key(self) -> str:
        return self._message.partition_key

    @partition_key.setter
    def partition_key(self, value: str) -> None:
        self._message.partition_key = value

    def images(self) -> Iterator[pb.ImagePart]:
        """Every image of its messages, tool outputs' included (metrics)."""
        for message in self._message.messages:
            parts = list(message.parts)
            if message.HasField("tool_output") and message.tool_output.WhichOneof("output") == "parts":
                parts += message.tool_output.parts.parts
            for part in parts:
                if part.WhichOneof("kind") == "image":
                    yield part.image

    def wire_size(self) -> int:
        """Its serialized size, held texts counted as themselves."""
        return wire_size(self._message, self._held or NO_TEXTS)

    def encode(self) -> bytes:
        """Its bytes, exactly `SerializeToString()`'s had the texts been in the message."""
        return encode(self._message, self._held or NO_TEXTS)

    def turns(self) -> list[Turn]:
        """Its messages' roles and tool call counts, in order (truncation groups turns by them)."""
        return [Turn(message.role, range(len(message.tool_calls))) for message in self._message.messages]

    def without_messages(self, indexes: Collection[int]) -> OutgoingRequest:
        """A new request: this one without the messages at `indexes`, holding the same texts
        apart; this one is left as it is (the new one holds copies: in upb a message taken out
        of another would keep its whole parent alive)."""
        message = pb.GenerateRequest()
        message.CopyFrom(self._message)
        del message.messages[:]
        for index, kept in enumerate(self._message.messages):
            if index not in indexes:
                message.messages.add().CopyFrom(kept)
        return OutgoingRequest(message, self._held)

    def whole(self) -> pb.GenerateRequest:
        """The message with its held texts in place, for a call that takes the message itself
        (counting its tokens): itself when it holds none, else a copy decoded from `encode()`;
        not to be changed."""
        return pb.GenerateRequest.FromString(self.encode()) if self._held else self._message

    def plain(self) -> pb.GenerateRequest:
        """The message itself, for a request that holds no texts apart (ValueError otherwise)."""
        if self._held:
            raise ValueError("this request holds texts apart: send it as it is (encode())")
        return self._message


class HeldMessages:
    """Contract messages that may hold markers of one request's held texts (its input, as stored
    for a later turn): like `OutgoingRequest`, measured, encoded and copied only with them, and
    handed out as they are only when they hold none (`plain()`)."""

    __slots__ = ("_held", "_messages")

    def __init__(self, messages: Sequence[pb.Message] = (), held: HeldTexts | None = None) -> None:
        self._messages = list(messages)
        self._held: Final = held

    @property
    def held(self) -> HeldTexts | None:
        return self._held

    def __len__(self) -> int:
        return len(self._messages)

    def plus(self, others: Sequence[pb.Message]) -> HeldMessages:
        """These messages, then `others` (which hold no markers), with the same held texts."""
        return HeldMessages([*self._messages, *others], self._held)

    def holds_markers(self) -> bool:
        return self._held is not None and any(self._held.holds_any(message) for message in self._messages)

    def wire_size(self) -> int:
        """Their serialized sizes, added up, held texts counted as themselves."""
        held = self._held or NO_TEXTS
        return sum(wire_size(message, held) for message in self._messages)

    def encode_each(self, prepare: Callable[[pb.Message], pb.Message] | None = None) -> Iterator[bytes]:
        """Each message's bytes (after `prepare`, which may return a copy to change: the store
        takes images out), held texts written in place."""
        held = self._held or NO_TEXTS
        for message in self._messages:
            yield encode(prepare(message) if prepare is not None else message, held)

    def owned(self) -> list[pb.Message]:
        """Copies holding their texts themselves, that keep nothing else alive (in upb a message
        taken out of another holds its whole parent)."""
        if self.holds_markers():
            held = self._held or NO_TEXTS
            return [pb.Message.FromString(encode(message, held)) for message in self._messages]
        return [_copy(message) for message in self._messages]

    def keep_whole(self) -> None:
        """Copies in place of the messages (views into a request whose turns are about to be
        edited), markers kept."""
        self._messages = [_copy(message) for message in self._messages]

    def plain(self) -> list[pb.Message]:
        """The messages themselves, when they hold no markers (ValueError otherwise)."""
        if self.holds_markers():
            raise ValueError("these messages hold texts apart: encode or copy them with them")
        return list(self._messages)


def _copy(message: pb.Message) -> pb.Message:
    copy = pb.Message()
    copy.CopyFrom(message)
    return copy


def encode(message: Message, held: Mapping[str, str] = NO_TEXTS) -> bytes:
    """`message.SerializeToString()`, held texts written in place of their markers. One buffer,
    grown in place (a large block grows by remapping), handed out without a copy."""
    buffer = io.BytesIO()
    _write_message(buffer, message, held)
    # getvalue() gives the buffer's own bytes (trimmed in place) when nothing else shares it.
    return buffer.getvalue()


def _write_message(out: io.BytesIO, message: Message, held: Mapping[str, str]) -> None:
    for field, value in message.ListFields():
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            raise TypeError(f"maps are not encoded here: {field.full_name}")
        if not field.is_repeated:
            _write_field(out, field, value, held)
        elif field.is_packed:
            payload = io.BytesIO()
            for item in value:
                _write_scalar(payload, field.type, item)
            packed = payload.getvalue()
            out.write(_varint(field.number << 3 | _WIRE_LENGTH) + _varint(len(packed)) + packed)
        else:
            for item in value:
                _write_field(out, field, item, held)


def _write_field(out: io.BytesIO, field: FieldDescriptor, value: object, held: Mapping[str, str]) -> None:
    kind = field.type
    if kind == _TYPE.TYPE_MESSAGE:
        assert isinstance(value, Message)
        out.write(_varint(field.number << 3 | _WIRE_LENGTH) + _varint(wire_size(value, held)))
        _write_message(out, value, held)
    elif kind == _TYPE.TYPE_STRING:
        assert isinstance(value, str)
        text = held.get(value, value)
        out.write(_varint(field.number << 3 | _WIRE_LENGTH) + _varint(utf8_length(text)))
        for start in range(0, len(text), _SLICE_CHARS):
            out.write(text[start : start + _SLICE_CHARS].encode("utf-8"))
    elif kind == _TYPE.TYPE_BYTES:
        assert isinstance(value, bytes)
        out.write(_varint(field.number << 3 | _WIRE_LENGTH) + _varint(len(value)))
        out.write(value)
    elif kind == _TYPE.TYPE_GROUP:
        raise TypeError(f"groups are not encoded: {field.full_name}")
    else:
        wire = _FIXED[kind][1] if kind in _FIXED else _WIRE_VARINT
        out.write(_varint(field.number << 3 | wire))
        _write_scalar(out, kind, value)


def _write_scalar(out: io.BytesIO, kind: int, value: object) -> None:
    if kind in _FIXED:
        out.write(_FIXED[kind][0].pack(value))
        return
    assert isinstance(value, int)  # bool and enums too
    if kind in ZIGZAG:
        out.write(_varint((value << 1) ^ (value >> 63)))
    else:
        # Negative int32, int64 and enum values are sign-extended to ten bytes.
        out.write(_varint(value & 0xFFFFFFFFFFFFFFFF if value < 0 else value))


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)

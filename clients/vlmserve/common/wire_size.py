"""A protobuf message's serialized size without serializing it.

upb's `ByteSize()` encodes the message to measure it: for a request holding a 30 MiB text that
is twice the text for a moment (the encoder's buffer grows by doubling), only to learn a number.
Here each field is measured where it is: a string or bytes field is read once (one copy of it,
for a moment), everything else costs nothing. Unknown fields are not counted (our own messages,
built or decoded by this version, have none). With `held` (`wire_encode.HeldTexts`), a marker is
measured as the text it stands for.
"""

from __future__ import annotations

from collections.abc import Mapping

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

__all__ = ["NO_TEXTS", "ZIGZAG", "utf8_length", "wire_size"]

_TYPE = FieldDescriptor
_VARINT = frozenset(
    {_TYPE.TYPE_INT32, _TYPE.TYPE_INT64, _TYPE.TYPE_UINT32, _TYPE.TYPE_UINT64}
    | {_TYPE.TYPE_ENUM, _TYPE.TYPE_BOOL}
)
ZIGZAG = frozenset({_TYPE.TYPE_SINT32, _TYPE.TYPE_SINT64})
_FIXED32 = frozenset({_TYPE.TYPE_FIXED32, _TYPE.TYPE_SFIXED32, _TYPE.TYPE_FLOAT})
_FIXED64 = frozenset({_TYPE.TYPE_FIXED64, _TYPE.TYPE_SFIXED64, _TYPE.TYPE_DOUBLE})
# Non-ASCII strings are encoded a slice at a time to count their UTF-8 bytes.
_SLICE_CHARS = 1 << 20


# No held texts (wire_encode.HeldTexts): every string is its own text.
NO_TEXTS: Mapping[str, str] = {}


def wire_size(message: Message, held: Mapping[str, str] = NO_TEXTS) -> int:
    """`message.ByteSize()`, without encoding the message; each marker of `held` counts as its text."""
    size = 0
    for field, value in message.ListFields():
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            # No contract message has a map; measured the encoding way rather than guessed.
            return message.ByteSize()
        tag = _varint_size(field.number << 3)
        if not field.is_repeated:
            size += tag + _value_size(field, value, held)
        elif field.is_packed:
            payload = sum(_scalar_size(field.type, item) for item in value)
            size += tag + _varint_size(payload) + payload
        else:
            size += sum(tag + _value_size(field, item, held) for item in value)
    return size


def _value_size(field: FieldDescriptor, value: object, held: Mapping[str, str]) -> int:
    """One value's bytes after its tag (with its length, where it has one)."""
    if field.type == _TYPE.TYPE_MESSAGE:
        assert isinstance(value, Message)
        inner = wire_size(value, held)
        return _varint_size(inner) + inner
    if field.type == _TYPE.TYPE_STRING:
        assert isinstance(value, str)
        length = utf8_length(held.get(value, value))
        return _varint_size(length) + length
    if field.type == _TYPE.TYPE_BYTES:
        assert isinstance(value, bytes)
        return _varint_size(len(value)) + len(value)
    if field.type == _TYPE.TYPE_GROUP:
        raise TypeError(f"groups are not measured: {field.full_name}")
    return _scalar_size(field.type, value)


def _scalar_size(kind: int, value: object) -> int:
    if kind in _FIXED32:
        return 4
    if kind in _FIXED64:
        return 8
    assert isinstance(value, int)  # bool and enums too
    if kind in ZIGZAG:
        return _varint_size((value << 1) ^ (value >> 63))
    if kind in _VARINT:
        # Negative int32, int64 and enum values are sign-extended to ten bytes.
        return 10 if value < 0 else _varint_size(value)
    raise TypeError(f"unknown field type {kind}")


def _varint_size(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def utf8_length(text: str) -> int:
    """The length of `text` in UTF-8, without encoding it whole."""
    if text.isascii():
        return len(text)
    return sum(
        len(text[start : start + _SLICE_CHARS].encode("utf-8", "surrogatepass"))
        for start in range(0, len(text), _SLICE_CHARS)
    )

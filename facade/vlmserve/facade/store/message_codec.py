"""Raw contract messages as the store keeps them: serialized without their image bytes, which are
kept once per content hash (an image replayed on every later turn is stored, and checked, once).

Backend-independent: any store saves `EncodedMessages.pieces` (the blob), the hash list and the
images, and gets the messages back with `decode_messages`.
"""

from __future__ import annotations

import hashlib
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from vlmserve.common.wire_encode import HeldMessages
from vlmserve.common.wire_size import wire_size
from vlmserve.engine.v1 import engine_pb2 as pb

_LENGTH = struct.Struct(">I")


class CorruptMessagesError(ValueError):
    """Stored messages that cannot be read back (truncated, or an image is missing)."""


@dataclass(frozen=True, slots=True)
class EncodedMessages:
    # The stored blob, in pieces (each length and each message): a store writes them one after
    # the other (SQLite's incremental blob I/O), never joined beside the request's own copy.
    pieces: list[bytes]
    # The hash of every image part, in the order `_image_parts` walks them.
    image_hashes: list[str]
    # hash -> bytes, each image once.
    images: dict[str, bytes] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(len(piece) for piece in self.pieces)

    @property
    def image_bytes(self) -> int:
        return sum(len(data) for data in self.images.values())


def image_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def as_held(messages: HeldMessages | Sequence[pb.Message]) -> HeldMessages:
    """Messages to store: a request's input with its held texts, or plain ones (no markers)."""
    return messages if isinstance(messages, HeldMessages) else HeldMessages(messages)


def encode_messages(messages: HeldMessages | Sequence[pb.Message]) -> EncodedMessages:
    """The messages without image bytes (length-prefixed, one after the other), and the images;
    held texts written in place of their markers (`wire_encode`)."""
    chunks: list[bytes] = []
    hashes: list[str] = []
    images: dict[str, bytes] = {}

    def strip(message: pb.Message) -> pb.Message:
        # Copied only to take its images out: a 30 MiB text is serialized from where it is.
        if next(_image_parts(message), None) is None:
            return message
        stripped = pb.Message()
        stripped.CopyFrom(message)
        for part in _image_parts(stripped):
            digest = image_hash(part.image.data)
            images.setdefault(digest, part.image.data)
            hashes.append(digest)
            part.image.data = b""
        return stripped

    for serialized in as_held(messages).encode_each(strip):
        # The length and the message as two pieces, never joined here.
        chunks += (_LENGTH.pack(len(serialized)), serialized)
        del serialized
    return EncodedMessages(chunks, hashes, images)


def cacheable(messages: HeldMessages | Sequence[pb.Message]) -> bool:
    """Whether these messages may be cached as they are: not when they hold markers of held texts
    (a request's long texts): a cache would need those texts too, and a later turn would send
    its markers (the next read decodes them from the store, and caches them then)."""
    return not as_held(messages).holds_markers()


def detached(messages: Sequence[pb.Message]) -> list[pb.Message]:
    """Copies that keep nothing else alive: in upb a message taken out of another (a request's
    `messages[k]`) holds its whole parent, and a cache would then hold every request whole."""
    copies: list[pb.Message] = []
    for message in messages:
        copy = pb.Message()
        copy.CopyFrom(message)
        copies.append(copy)
    return copies


def decode_messages(
    blob: bytes, image_hashes: Sequence[str], images: Mapping[str, bytes]
) -> list[pb.Message]:
    """`encode_messages` undone, image bytes put back from `images` (hash -> bytes)."""
    messages: list[pb.Message] = []
    hashes = iter(image_hashes)
    offset = 0
    while offset < len(blob):
        if offset + _LENGTH.size > len(blob):
            raise CorruptMessagesError("truncated length")
        (size,) = _LENGTH.unpack_from(blob, offset)
        offset += _LENGTH.size
        if offset + size > len(blob):
            raise CorruptMessagesError("truncated message")
        message = pb.Message.FromString(blob[offset : offset + size])
        offset += size
        for part in _image_parts(message):
            digest = next(hashes, None)
            if digest is None or digest not in images:
                raise CorruptMessagesError("an image of the stored messages is missing")
            part.image.data = images[digest]
        messages.append(message)
    if next(hashes, None) is not None:
        raise CorruptMessagesError("more image hashes than image parts")
    return messages


def _image_parts(message: pb.Message) -> Iterator[pb.Part]:
    """Image parts in a fixed order: the message's parts, then its tool output's parts."""
    for part in message.parts:
        if part.WhichOneof("kind") == "image":
            yield part
    if message.HasField("tool_output") and message.tool_output.WhichOneof("output") == "parts":
        for part in message.tool_output.parts.parts:
            if part.WhichOneof("kind") == "image":
                yield part


class MessageCache:
    """Decoded messages of recently stored or replayed objects, least recently used out first,
    bounded by their bytes: the next turn of a chain finds its earlier turns here instead of
    reading and decoding them again. Entries are shared: callers must not modify them."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, str], tuple[list[pb.Message], int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str]) -> list[pb.Message] | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: tuple[str, str], messages: Sequence[pb.Message], *, size: int | None = None) -> None:
        """`size`: their bytes where the caller knows them (else measured, `wire_size`)."""
        if size is None:
            size = sum(wire_size(message) for message in messages)
        with self._lock:
            self._drop(key)
            if size > self._max_bytes:
                return
            self._entries[key] = (list(messages), size)
            self._bytes += size
            while self._bytes > self._max_bytes:
                self._drop(next(iter(self._entries)))

    def drop(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._drop(key)

    def forget(self, owner_key: str) -> None:
        """Drop every entry of one object (a response or conversation id)."""
        with self._lock:
            for key in [key for key in self._entries if key[0] == owner_key]:
                self._drop(key)

    def _drop(self, key: tuple[str, str]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry[1]

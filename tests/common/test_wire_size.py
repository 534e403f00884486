"""`wire_size` is what `ByteSize()` says, without encoding the message (common/wire_size.py)."""

from __future__ import annotations

import pytest
from google.protobuf.message import Message

from vlmserve.common.wire_size import wire_size
from vlmserve.engine.v1 import engine_pb2 as pb

from ._wire_cases import CASES


@pytest.mark.parametrize("message", CASES, ids=lambda message: type(message).__name__)
def test_wire_size_is_byte_size(message: Message) -> None:
    assert wire_size(message) == message.ByteSize() == len(message.SerializeToString())


def test_a_long_non_ascii_text_is_measured_in_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    from vlmserve.common import wire_size as module

    monkeypatch.setattr(module, "_SLICE_CHARS", 3)
    part = pb.Part(text=pb.TextPart(text="a😀é" * 10 + "z"))
    assert wire_size(part) == part.ByteSize()

"""`wire_size` is what `ByteSize()` says, without encoding the message (common/wire_size.py)."""

from __future__ import annotations

import pytest
from google.protobuf.message import Message

from vlmserve.common.wire_size import wire_size
from vlmserve.engine.v1 import engine_pb2 as pb


def _request() -> pb.GenerateRequest:
    request = pb.GenerateRequest(request_id="resp_1", model="m", partition_key="k" * 200, max_tool_calls=3)
    request.enable_thinking = False
    request.parallel_tool_calls = True
    message = request.messages.add(role=pb.ROLE_USER)
    message.parts.add().text.text = "héllo 😀 漢字 " * 40
    message.parts.add().image.data = bytes(range(256)) * 3
    request.messages.add(role=pb.ROLE_ASSISTANT).tool_calls.add(
        id="c", name="f", arguments='{"a": 1}', kind=pb.TOOL_KIND_CUSTOM
    )
    request.sampling.temperature = 0.25
    request.sampling.top_p = 1.0
    request.sampling.max_tokens = 1 << 20
    request.sampling.seed = 2**40
    request.sampling.stop.extend(["\n\n", "END", ""])
    request.tools.add()
    return request


CASES: list[Message] = [
    pb.GenerateRequest(),
    pb.Message(role=pb.ROLE_USER),
    pb.Part(text=pb.TextPart(text="")),
    pb.Part(text=pb.TextPart(text="x" * 300)),
    _request(),
    # A packed repeated enum, and an enum value this version does not know (negative: ten bytes).
    pb.GetModelInfoResponse(input_modalities=[1, 2, 2, 1], context_length=1 << 31),  # type: ignore[list-item]
    pb.Message(role=-3),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("message", CASES, ids=lambda message: type(message).__name__)
def test_wire_size_is_byte_size(message: Message) -> None:
    assert wire_size(message) == message.ByteSize() == len(message.SerializeToString())


def test_a_long_non_ascii_text_is_measured_in_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    from vlmserve.common import wire_size as module

    monkeypatch.setattr(module, "_SLICE_CHARS", 3)
    part = pb.Part(text=pb.TextPart(text="a😀é" * 10 + "z"))
    assert wire_size(part) == part.ByteSize()

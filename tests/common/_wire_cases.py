"""The messages that test_wire_encode.py and test_wire_size.py check `encode` and `wire_size`
against protobuf's own `SerializeToString()` and `ByteSize()`: empty and unset fields, long and
non-ASCII texts, bytes, nested and repeated messages, packed and unknown enums, odd floats."""

from __future__ import annotations

from google.protobuf.message import Message

from vlmserve.engine.v1 import engine_pb2 as pb


def generate_request(text: str = "héllo 😀 漢字 " * 40, max_tool_calls: int = 0) -> pb.GenerateRequest:
    """A request using most of GenerateRequest's fields, its first text part `text`."""
    request = pb.GenerateRequest(
        request_id="resp_1", model="m", partition_key="k" * 200, max_tool_calls=max_tool_calls
    )
    request.enable_thinking = False
    request.parallel_tool_calls = True
    message = request.messages.add(role=pb.ROLE_USER)
    message.parts.add().text.text = text
    message.parts.add().image.data = bytes(range(256)) * 3
    message.parts.add().image.data = b""
    message.parts.add().text.text = ""
    request.messages.add(role=pb.ROLE_ASSISTANT, reasoning_text="é").tool_calls.add(
        id="c", name="f", arguments='{"a": 1}', kind=pb.TOOL_KIND_CUSTOM
    )
    tool = request.messages.add(role=pb.ROLE_TOOL).tool_output
    tool.call_id = "c"
    tool.parts.parts.add().json.json = '{"ü": []}'
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
    pb.Part(text=pb.TextPart(text="\x00 NUL and \U0010ffff")),
    pb.Part(image=pb.ImagePart(data=b"\x89PNG\r\n" + bytes(200))),
    generate_request(),
    generate_request(max_tool_calls=3),
    generate_request("a" * 70_000),
    # A packed repeated enum, and an enum value this version does not know (negative: ten bytes).
    pb.GetModelInfoResponse(input_modalities=[1, 2, 2, 1], context_length=1 << 31),  # type: ignore[list-item]
    pb.Message(role=-3),  # type: ignore[arg-type]
    pb.SamplingParams(temperature=-0.0, top_p=float("inf"), seed=0),
]

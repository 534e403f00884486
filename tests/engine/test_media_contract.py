"""Video and audio parts on the wire (issue 34.1): a Generate or CountTokens carrying a VideoPart or an
AudioPart, sent through the client library and raw gRPC stubs, reaches the engine wherever it is in
the conversation, and what the engine cannot take is refused naming the field (INVALID_ARGUMENT with
its path): a damaged clip names its bytes (`…video.data`), a damaged frame its image, audio on a
family without an audio tower the part and the family. Never dropped, never a crash. (Clips that
decode are rendered: tests/engine/test_clips.py.)"""

from __future__ import annotations

import grpc
import pytest
from grpc_status import rpc_status

from vlmserve.client import EngineClient, InvalidArgumentError
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc

from ._rpc_details import field_violations
from .conftest import InProcessEngine

MP4 = b"\x00\x00\x00\x1cftypisom" + bytes(64)
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(64)


def text(value: str) -> pb.Part:
    return pb.Part(text=pb.TextPart(text=value))


def video() -> pb.Part:
    return pb.Part(
        video=pb.VideoPart(data=MP4, media_type="video/mp4", sampling=pb.VideoSampling(fps=2, max_frames=8))
    )


def frames() -> pb.Part:
    return pb.Part(video=pb.VideoPart(frames=pb.VideoFrames(frames=[pb.ImagePart(data=b"x")], fps=2)))


def audio() -> pb.Part:
    return pb.Part(audio=pb.AudioPart(data=WAV, media_type="audio/wav"))


def user(*parts: pb.Part) -> pb.Message:
    return pb.Message(role=pb.ROLE_USER, parts=list(parts))


def tool_turns(*parts: pb.Part) -> list[pb.Message]:
    return [
        user(text("look")),
        pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(id="c1", name="record", arguments="{}")]),
        pb.Message(
            role=pb.ROLE_TOOL, tool_output=pb.ToolOutput(call_id="c1", parts=pb.PartList(parts=list(parts)))
        ),
    ]


CASES = [
    # (name, conversation, the field the refusal names, its words)
    (
        "video in a user turn",
        [user(text("what happens?"), video())],
        "messages[0].parts[1].video.data",
        "could not be decoded",
    ),
    (
        "frames in a user turn",
        [user(frames())],
        "messages[0].parts[0].video.frames.frames[0]",
        "unrecognised image format",
    ),
    (
        "audio in a user turn",
        [user(audio(), text("how many beeps?"))],
        "messages[0].parts[0]",
        "(qwen2_vl) does not take audio",
    ),
    (
        "video in a tool output",
        tool_turns(text("recorded"), video()),
        "messages[2].tool_output.parts.parts[1].video.data",
        "could not be decoded",
    ),
    (
        "audio in a tool output",
        tool_turns(audio()),
        "messages[2].tool_output.parts.parts[0]",
        "(qwen2_vl) does not take audio",
    ),
    (
        "video in a system turn",
        [pb.Message(role=pb.ROLE_SYSTEM, parts=[text("watch"), video()]), user(text("go"))],
        "messages[0].parts[1].video.data",
        "could not be decoded",
    ),
]


def violations(error: grpc.RpcError) -> list[str]:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None, "no google.rpc.Status in the trailers"
    return field_violations(status)


@pytest.mark.parametrize(("name", "messages", "field", "words"), CASES, ids=[row[0] for row in CASES])
def test_the_client_library_carries_clips_to_the_engines_refusal(
    idle_engine: InProcessEngine, name: str, messages: list[pb.Message], field: str, words: str
) -> None:
    request = pb.GenerateRequest(messages=messages, sampling=pb.SamplingParams(max_tokens=2))
    with EngineClient(idle_engine.address) as client:
        with pytest.raises(InvalidArgumentError) as generated:
            client.generate_unary(request, timeout=60)
        with pytest.raises(InvalidArgumentError) as counted:
            client.count_tokens(request, timeout=60)
    for caught in (generated, counted):
        assert caught.value.field == field
        assert words in str(caught.value)


@pytest.mark.parametrize(("name", "messages", "field", "words"), CASES[:2], ids=[row[0] for row in CASES[:2]])
def test_a_streamed_generate_with_a_clip_is_refused_by_name(
    idle_engine: InProcessEngine,
    stub: pb_grpc.EngineServiceStub,
    name: str,
    messages: list[pb.Message],
    field: str,
    words: str,
) -> None:
    request = pb.GenerateRequest(messages=messages, sampling=pb.SamplingParams(max_tokens=2))
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Generate(request, timeout=60))
    error: grpc.RpcError = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert violations(error) == [field]
    assert words in error.details()  # type: ignore[attr-defined]

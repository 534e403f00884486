"""The blocking client library against a real engine process on the random-weight fixture model."""

from __future__ import annotations

import io
import time
from collections.abc import Generator, Iterator
from typing import cast

import grpc
import numpy as np
import pytest
from PIL import Image

from vlmserve.client import (
    DeadlineExceededError,
    EngineClient,
    EngineError,
    InvalidArgumentError,
    NotFoundError,
)
from vlmserve.engine.v1 import engine_pb2 as pb


@pytest.fixture(scope="module")
def client(random_engine_address: str) -> Iterator[EngineClient]:
    with EngineClient(random_engine_address) as client:
        yield client


def png(seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(56, 56, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def user(*parts: pb.Part) -> pb.Message:
    return pb.Message(role=pb.ROLE_USER, parts=list(parts))


def text(value: str) -> pb.Part:
    return pb.Part(text=pb.TextPart(text=value))


def image(data: bytes) -> pb.Part:
    return pb.Part(image=pb.ImagePart(data=data, media_type="image/png"))


def request(*messages: pb.Message, max_tokens: int = 6, **fields: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        messages=list(messages) or [user(text("Hello"))],
        sampling=pb.SamplingParams(max_tokens=max_tokens),
        **fields,  # type: ignore[arg-type]
    )


def screenshot_turns(data: bytes) -> list[pb.Message]:
    """An agent turn whose tool output is an image (what Codex sends for a screenshot tool)."""
    return [
        user(text("What is on screen?")),
        pb.Message(
            role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(id="c1", name="screenshot", arguments="{}")]
        ),
        pb.Message(
            role=pb.ROLE_TOOL,
            tool_output=pb.ToolOutput(
                call_id="c1", parts=pb.PartList(parts=[text("screenshot"), image(data)])
            ),
        ),
    ]


def test_stream_ends_with_one_result(client: EngineClient) -> None:
    responses = list(client.generate(request(user(image(png()), text("Count.")))))
    assert responses[-1].HasField("complete")
    assert all(r.HasField("chunk") for r in responses[:-1])
    result = responses[-1].complete
    assert "".join(r.chunk.text for r in responses[:-1]) == result.text
    assert result.usage.image_count == 1


def test_unary_and_count_agree(client: EngineClient) -> None:
    req = request(user(image(png(1)), text("Count.")), max_tokens=2)
    assert client.count_tokens(req).input_tokens == client.generate_unary(req).usage.input_tokens


def test_model_info_and_health(client: EngineClient) -> None:
    assert client.health()
    assert client.health("")
    info = client.model_info()
    assert info.model_id == "qwen2-vl-tiny" and info.architecture == "qwen2_vl"


def test_a_tool_output_image_is_sent_as_is_and_reaches_the_model(client: EngineClient) -> None:
    req = request(*screenshot_turns(png(2)), max_tokens=2)
    before = pb.GenerateRequest()
    before.CopyFrom(req)
    result = client.generate_unary(req)
    assert result.usage.image_count == 1
    assert req == before  # the client does not rewrite requests; the engine lowers


def test_typed_errors(client: EngineClient) -> None:
    corrupt = request(user(pb.Part(image=pb.ImagePart(data=b"\x89PNG\r\n\x1a\nxx", media_type="image/png"))))
    with pytest.raises(InvalidArgumentError, match=r"messages\[0\]\.parts\[0\]") as invalid:
        client.generate_unary(corrupt)
    assert invalid.value.field == "messages[0].parts[0].image.data"
    assert "[messages[0].parts[0].image.data]" in str(invalid.value)
    with pytest.raises(NotFoundError) as not_found:
        client.generate_unary(request(model="not-this-one"))
    assert not_found.value.field == "model"
    bad_top_p = request()
    bad_top_p.sampling.top_p = 3.0
    with pytest.raises(InvalidArgumentError) as streamed:
        list(client.generate(bad_top_p))
    assert streamed.value.field == "sampling.top_p"
    assert streamed.value.retry_after_s is None
    assert client.abort("no-such-request") is False


def test_deadline_is_enforced(client: EngineClient) -> None:
    with pytest.raises(DeadlineExceededError):
        client.generate_unary(request(max_tokens=2000), timeout=0.2)
    # The engine dropped the abandoned request and still answers.
    assert client.generate_unary(request(max_tokens=1)).usage.output_tokens == 1


def test_closing_the_stream_early_cancels_it(client: EngineClient) -> None:
    # The client's generate is a generator function; closing it cancels the call.
    stream = cast(
        Generator[pb.GenerateResponse, None, None],
        client.generate(request(max_tokens=2000, request_id="sync-close-early")),
    )
    assert next(stream).HasField("chunk")
    stream.close()
    # 2000 tokens take many seconds; the id is free again only once the engine dropped the request.
    deadline = time.monotonic() + 3
    while True:
        try:
            result = client.generate_unary(request(max_tokens=1, request_id="sync-close-early"))
            break
        except EngineError as error:
            assert error.code == grpc.StatusCode.ALREADY_EXISTS
            assert time.monotonic() < deadline, (
                "the engine kept generating after the client closed the stream"
            )
            time.sleep(0.05)
    assert result.usage.output_tokens == 1

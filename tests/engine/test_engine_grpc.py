"""The engine over a real gRPC channel, on the fixture model (docs/engine-contract.md)."""

from __future__ import annotations

import concurrent.futures
import io
import time
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from PIL import Image

from tests.hardening import _image_corpus as corpus
from vlmserve.engine.config import EngineConfig
from vlmserve.engine.rpc.server import ENGINE_SERVICE_NAME
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc

from .conftest import MAX_ACTIVE, MAX_QUEUE, InProcessEngine

SERVING = 1  # grpc.health.v1 HealthCheckResponse.SERVING
NOT_SERVING = 2


def png(size: tuple[int, int] = (64, 64), seed: int = 0, *, compress_level: int = 6) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG", compress_level=compress_level)
    return buffer.getvalue()


def text_part(value: str) -> pb.Part:
    return pb.Part(text=pb.TextPart(text=value))


def image_part(data: bytes, media_type: str = "image/png") -> pb.Part:
    return pb.Part(image=pb.ImagePart(data=data, media_type=media_type))


def request(*parts: pb.Part, max_tokens: int = 8, **fields: Any) -> pb.GenerateRequest:
    sampling = fields.pop("sampling", pb.SamplingParams())
    sampling.max_tokens = max_tokens
    messages = fields.pop(
        "messages", [pb.Message(role=pb.ROLE_USER, parts=list(parts) or [text_part("Hello")])]
    )
    return pb.GenerateRequest(messages=messages, sampling=sampling, **fields)


def stream(
    stub: pb_grpc.EngineServiceStub, req: pb.GenerateRequest
) -> tuple[list[pb.GenerateChunk], list[pb.GenerateResult]]:
    chunks: list[pb.GenerateChunk] = []
    results: list[pb.GenerateResult] = []
    for response in stub.Generate(req, timeout=60):
        assert not results, "nothing may follow the final message"
        if response.HasField("chunk"):
            # A chunk is one thing: text, a whole tool call or a call's streamed arguments (the
            # oneof), never empty.
            assert response.chunk.WhichOneof("kind") in ("text", "tool_call", "tool_call_delta"), response
            chunks.append(response.chunk)
        else:
            results.append(response.complete)
    return chunks, results


def status_of(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    error: Any = caught.value
    return error.code(), error.details()


# -- streaming, usage, counting ---------------------------------------------------------------


def test_text_request_streams_then_one_final_message(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    chunks, results = stream(stub, request(text_part("Say something."), max_tokens=6))
    assert len(results) == 1
    result = results[0]
    assert chunks, "tokens must stream before the final message"
    assert "".join(c.text for c in chunks) == result.text
    assert result.finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_STOP)
    assert result.usage.image_count == 0
    assert 0 < result.usage.output_tokens <= 6
    assert result.usage.input_tokens > 0
    assert result.model == "qwen2-vl-tiny"
    assert result.timings.time_to_first_token_seconds > 0
    assert result.timings.total_seconds >= result.timings.time_to_first_token_seconds


def test_image_request_streams_with_image_count(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    req = request(image_part(png()), text_part("How many squares?"), max_tokens=6)
    chunks, results = stream(stub, req)
    assert len(results) == 1 and chunks
    assert results[0].usage.image_count == 1
    text_only = stub.CountTokens(
        pb.CountTokensRequest(request=request(text_part("How many squares?"))), timeout=30
    )
    # A square image is 16 image tokens plus the two vision markers.
    assert results[0].usage.input_tokens == text_only.input_tokens + 18


@pytest.mark.parametrize("with_image", [False, True])
def test_count_tokens_matches_generation(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub, with_image: bool
) -> None:
    parts = [image_part(png(seed=3)), text_part("Count them.")] if with_image else [text_part("Count them.")]
    req = request(*parts, max_tokens=2)
    counted = stub.CountTokens(pb.CountTokensRequest(request=req), timeout=30)
    result = stub.GenerateUnary(pb.GenerateUnaryRequest(request=req), timeout=60).result
    assert counted.input_tokens == result.usage.input_tokens
    assert counted.image_count == result.usage.image_count == int(with_image)


def test_max_tokens_is_honoured(idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub) -> None:
    # Ignore EOS by asking for a length the random model is unlikely to end before; still bounded.
    result = stub.GenerateUnary(pb.GenerateUnaryRequest(request=request(max_tokens=5)), timeout=60).result
    assert result.usage.output_tokens <= 5
    if result.finish_reason == pb.FINISH_REASON_LENGTH:
        assert result.usage.output_tokens == 5


def test_stop_sequence_ends_generation(idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub) -> None:
    def run(*stop: str) -> pb.GenerateResult:
        params = pb.SamplingParams(temperature=1.0, seed=5, stop=list(stop))
        req = request(max_tokens=16, sampling=params)
        return stub.GenerateUnary(pb.GenerateUnaryRequest(request=req), timeout=60).result

    base = run()
    assert len(base.text) >= 12, f"need some output to cut: {base.text!r}"
    middle = len(base.text) // 2
    stop = base.text[middle : middle + 3]
    cut = run(stop)
    assert cut.finish_reason == pb.FINISH_REASON_STOP
    assert cut.text == base.text[: base.text.index(stop)]
    assert stop not in cut.text


def test_seeded_sampling_is_reproducible(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    def sample(seed: int) -> str:
        params = pb.SamplingParams(temperature=1.0, seed=seed)
        return stub.GenerateUnary(
            pb.GenerateUnaryRequest(request=request(max_tokens=16, sampling=params)), timeout=60
        ).result.text

    assert sample(7) == sample(7)
    assert len({sample(7), sample(8), sample(9)}) > 1


def test_interleaved_requests_match_sequential_ones(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    """Requests decoded round-robin produce exactly what each produces alone.

    The two differ in M-RoPE position offset (one image vs two), so a decode step that used the
    other request's position state would change the sampled tokens.
    """
    first = request(
        image_part(png(seed=1)),
        text_part("One."),
        max_tokens=64,
        sampling=pb.SamplingParams(temperature=4.0, seed=11),
    )
    second = request(
        text_part("Compare"),
        image_part(png(seed=2)),
        text_part("with"),
        image_part(png(seed=3)),
        max_tokens=64,
        sampling=pb.SamplingParams(temperature=4.0, seed=12),
    )

    def run(req: pb.GenerateRequest) -> str:
        text: str = stub.GenerateUnary(pb.GenerateUnaryRequest(request=req), timeout=60).result.text
        return text

    alone = [run(first), run(second)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        together = list(pool.map(run, [first, second]))
    assert together == alone


# -- bad input ---------------------------------------------------------------------------------


def screenshot_turns(image: pb.Part) -> list[pb.Message]:
    return [
        pb.Message(role=pb.ROLE_USER, parts=[text_part("look")]),
        pb.Message(
            role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(id="c1", name="screenshot", arguments="{}")]
        ),
        pb.Message(
            role=pb.ROLE_TOOL,
            tool_output=pb.ToolOutput(call_id="c1", parts=pb.PartList(parts=[text_part("shot"), image])),
        ),
    ]


def test_image_in_a_tool_turn_reaches_the_model(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    """The engine lowers (docs/engine-contract.md, "What the engine does with a conversation"): a
    raw gRPC caller gets what the facade's callers get."""
    req = request(messages=screenshot_turns(image_part(png())), max_tokens=2)
    result = stub.GenerateUnary(pb.GenerateUnaryRequest(request=req), timeout=30).result
    assert result.usage.image_count == 1
    counted = stub.CountTokens(pb.CountTokensRequest(request=req), timeout=30)
    assert (counted.input_tokens, counted.image_count) == (result.usage.input_tokens, 1)


def test_image_in_an_assistant_turn_reaches_the_model(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    messages = [
        pb.Message(role=pb.ROLE_USER, parts=[text_part("hi")]),
        pb.Message(role=pb.ROLE_ASSISTANT, parts=[image_part(png())]),
    ]
    req = request(messages=messages, max_tokens=2)
    assert stub.GenerateUnary(pb.GenerateUnaryRequest(request=req), timeout=30).result.usage.image_count == 1


def test_a_bad_image_in_a_tool_output_is_named_where_it_was_sent(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    corrupt = image_part(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)
    code, details = status_of(
        lambda: list(stub.Generate(request(messages=screenshot_turns(corrupt)), timeout=30))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("messages[2].tool_output.parts.parts[1]: ")


@pytest.mark.parametrize(
    ("data", "media_type", "message"),
    [
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, "image/png", "could not be decoded"),
        (b"definitely not an image", "image/png", "unsupported or unrecognised image format"),
        (png(), "image/jpeg", "does not match the image bytes"),
        (corpus.jpeg_scan_bomb(), "image/jpeg", "JPEG has more than 64 scans"),
    ],
    ids=["corrupt png", "not an image", "media type mismatch", "progressive jpeg scan bomb"],
)
def test_bad_image_bytes_are_invalid_argument(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub, data: bytes, media_type: str, message: str
) -> None:
    req = request(image_part(data, media_type), text_part("?"))
    code, details = status_of(lambda: list(stub.Generate(req, timeout=30)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message in details and "messages[0].parts[0]" in details


def test_over_long_prompt_is_out_of_range_with_the_limits(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    context = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).context_length
    digits = "1234567890" * (context // 10 + 100)  # the tokenizer splits digits: one token each
    req = request(text_part(digits))
    code, details = status_of(lambda: list(stub.Generate(req, timeout=60)))
    assert code == grpc.StatusCode.OUT_OF_RANGE
    assert f"context length is {context} tokens" in details
    counted = stub.CountTokens(pb.CountTokensRequest(request=req), timeout=60).input_tokens
    assert counted > context
    assert f"the prompt is {counted} tokens" in details


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        (pb.ToolChoice(function_name="missing"), "'missing' is not one of the request's tools"),
        (pb.ToolChoice(mode=42), "tool_choice.mode 42 is not a known tool choice mode"),  # type: ignore[arg-type]
    ],
)
def test_unknown_tool_choice_is_invalid_argument(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub, choice: pb.ToolChoice, message: str
) -> None:
    tool = pb.Tool(function=pb.FunctionTool(name="shell", parameters_json='{"type": "object"}'))
    req = request(text_part("run it"), tools=[tool], tool_choice=choice)
    code, details = status_of(lambda: stub.GenerateUnary(pb.GenerateUnaryRequest(request=req), timeout=30))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message in details


def test_wrong_model_name_is_not_found(idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub) -> None:
    code, details = status_of(lambda: list(stub.Generate(request(model="gpt-9"), timeout=30)))
    assert code == grpc.StatusCode.NOT_FOUND
    assert "'gpt-9'" in details and "qwen2-vl-tiny" in details
    assert stub.GenerateUnary(
        pb.GenerateUnaryRequest(request=request(model="qwen2-vl-tiny", max_tokens=1)), timeout=30
    )


def test_bad_sampling_is_invalid_argument(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    req = request(sampling=pb.SamplingParams(top_p=2.0))
    code, details = status_of(lambda: list(stub.Generate(req, timeout=30)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "top_p" in details


def test_twenty_megabyte_image_passes_the_channel(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    data = png((2580, 2580), seed=5, compress_level=0)  # uncompressed noise: ~20 MB
    assert 19_900_000 < len(data) < 20 * 1024 * 1024
    result = stub.GenerateUnary(
        pb.GenerateUnaryRequest(request=request(image_part(data), text_part("?"), max_tokens=1)), timeout=120
    ).result
    assert result.usage.image_count == 1


# -- forced tool choice --------------------------------------------------------------------------


def test_named_tool_choice_is_one_call_even_from_the_random_model(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    # Forced by the grammar while decoding (tests/engine/test_constrained_decoding.py has the rest).
    tool = pb.Tool(function=pb.FunctionTool(name="shell", parameters_json='{"type": "object"}'))
    forced = request(
        text_part("run it"), tools=[tool], tool_choice=pb.ToolChoice(function_name="shell"), max_tokens=64
    )
    result = stub.GenerateUnary(pb.GenerateUnaryRequest(request=forced), timeout=60).result
    assert [call.name for call in result.tool_calls] == ["shell"]
    assert result.finish_reason == pb.FINISH_REASON_TOOL_CALLS and result.text == ""


# -- cancellation, abort, limits -------------------------------------------------------------------


def test_client_cancel_stops_generation_within_one_step(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    req = request(image_part(png()), text_part("Go on."), max_tokens=400, request_id="cancel-me")
    call = stub.Generate(req, timeout=60)
    for received, response in enumerate(call, start=1):
        assert response.HasField("chunk")
        if received == 3:
            call.cancel()
            break
    report = idle_engine.report("cancel-me")
    assert report.finish_reason == pb.FINISH_REASON_CANCELLED
    # Within one step: a step gives a row one token, or with speculation (on by default) its
    # accepted drafts plus one (this random model repeats itself, so lookup drafts are accepted).
    assert report.tokens_after_cancel <= 1 + EngineConfig().speculative_max_draft
    assert report.output_tokens < 400
    # The engine serves the next request normally.
    _chunks, results = stream(stub, request(max_tokens=3))
    assert len(results) == 1 and results[0].finish_reason != pb.FINISH_REASON_CANCELLED


def test_abort_by_request_id(idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub) -> None:
    req = request(max_tokens=400, request_id="abort-me")
    call = stub.Generate(req, timeout=60)
    first = next(call)
    assert first.HasField("chunk")
    assert stub.Abort(pb.AbortRequest(request_id="abort-me"), timeout=10).found
    rest = list(call)
    assert rest[-1].HasField("complete")
    result = rest[-1].complete
    assert result.finish_reason == pb.FINISH_REASON_CANCELLED
    assert result.usage.output_tokens < 400
    assert idle_engine.report("abort-me").tokens_after_cancel <= 1 + EngineConfig().speculative_max_draft
    assert not stub.Abort(pb.AbortRequest(request_id="abort-me"), timeout=10).found


def test_full_queue_is_resource_exhausted(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    calls = [
        stub.Generate(request(max_tokens=400, request_id=f"fill-{i}"), timeout=60) for i in range(MAX_ACTIVE)
    ]
    for call in calls:
        next(call)  # running
    waiting = [
        stub.Generate(request(max_tokens=400, request_id=f"wait-{i}"), timeout=60) for i in range(MAX_QUEUE)
    ]
    deadline = time.monotonic() + 10
    while (
        idle_engine.server.generator.admission.in_flight < MAX_ACTIVE + MAX_QUEUE
        and time.monotonic() < deadline
    ):
        time.sleep(0.02)
    code, details = status_of(lambda: list(stub.Generate(request(max_tokens=1), timeout=30)))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"limit {MAX_QUEUE}" in details
    for call in calls + waiting:
        call.cancel()
    assert idle_engine.server.generator.wait_idle(30)


def test_duplicate_request_id_in_flight_is_refused(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    call = stub.Generate(request(max_tokens=400, request_id="twice"), timeout=60)
    next(call)
    code, _ = status_of(lambda: list(stub.Generate(request(max_tokens=1, request_id="twice"), timeout=30)))
    assert code == grpc.StatusCode.ALREADY_EXISTS
    call.cancel()


# -- model info, health, reflection --------------------------------------------------------------


def test_model_info(idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub) -> None:
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert info.model_id == "qwen2-vl-tiny"
    assert info.architecture == "qwen2_vl"
    assert info.context_length == 65536
    assert info.has_chat_template
    assert info.tool_call_format == "hermes"
    assert list(info.input_modalities) == [pb.MODALITY_TEXT, pb.MODALITY_IMAGE]
    assert info.image_limits.max_image_bytes >= 20_000_000
    assert "image/png" in info.image_limits.media_types
    assert abs(info.loaded_at - time.time()) < 3600


def test_health_not_serving_before_load_and_serving_after(engine: InProcessEngine) -> None:
    assert engine.health_before_load == {"": NOT_SERVING, ENGINE_SERVICE_NAME: NOT_SERVING}
    assert engine.health_after_load == {"": SERVING, ENGINE_SERVICE_NAME: SERVING}
    # Calls before that are refused as retryable, not failed.
    assert engine.generate_before_load == grpc.StatusCode.UNAVAILABLE


def test_reflection_lists_the_service(channel: grpc.Channel) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    responses = list(
        stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
        )
    )
    names = {service.name for service in responses[0].list_services_response.service}
    assert ENGINE_SERVICE_NAME in names
    assert "grpc.health.v1.Health" in names

"""The asyncio client library against a real engine process on the random-weight fixture model."""

from __future__ import annotations

import asyncio

import pytest

from vlmserve.client import AsyncEngineClient, InvalidArgumentError
from vlmserve.engine.v1 import engine_pb2 as pb


def request(prompt: str = "Hello", *, max_tokens: int = 6, **fields: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        messages=[pb.Message(role=pb.ROLE_USER, parts=[pb.Part(text=pb.TextPart(text=prompt))])],
        sampling=pb.SamplingParams(max_tokens=max_tokens),
        **fields,  # type: ignore[arg-type]
    )


async def test_async_stream_unary_and_count(random_engine_address: str) -> None:
    async with AsyncEngineClient(random_engine_address) as client:
        assert await client.health()
        responses = [r async for r in client.generate(request())]
        assert responses[-1].HasField("complete")
        result = responses[-1].complete
        assert "".join(r.chunk.text for r in responses[:-1]) == result.text
        unary = await client.generate_unary(request(max_tokens=2))
        counted = await client.count_tokens(request(max_tokens=2))
        assert counted.input_tokens == unary.usage.input_tokens


async def test_concurrent_requests_all_complete(random_engine_address: str) -> None:
    async with AsyncEngineClient(random_engine_address) as client:
        results = await asyncio.gather(
            *(client.generate_unary(request(f"Question {i}", max_tokens=4)) for i in range(4))
        )
    assert all(r.finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_STOP) for r in results)
    assert len({r.request_id for r in results}) == 4


async def test_abort_ends_a_stream_with_cancelled(random_engine_address: str) -> None:
    async with AsyncEngineClient(random_engine_address) as client:
        stream = client.generate(request(max_tokens=2000, request_id="async-abort"))
        first = await anext(stream)
        assert first.HasField("chunk")
        assert await client.abort("async-abort")
        last = None
        async for response in stream:
            last = response
        assert last is not None and last.HasField("complete")
        assert last.complete.finish_reason == pb.FINISH_REASON_CANCELLED
        assert last.complete.usage.output_tokens < 2000


async def test_bad_tool_choice_is_a_typed_error(random_engine_address: str) -> None:
    tool = pb.Tool(function=pb.FunctionTool(name="shell", parameters_json="{}"))
    req = request(tools=[tool], tool_choice=pb.ToolChoice(function_name="other"))
    async with AsyncEngineClient(random_engine_address) as client:
        with pytest.raises(InvalidArgumentError, match="'other' is not one of the request's tools") as caught:
            await client.generate_unary(req)
    # The field path comes from the engine's google.rpc.BadRequest, not from the text.
    assert caught.value.field == "tool_choice.function_name"
    assert caught.value.field_violations[0].description == caught.value.details

"""Grammar-constrained decoding on the real engine with the random-weight fixture model.

The random model never writes valid JSON or a tool call by itself; every assertion here holds
only because the grammar masks its logits (and closes the output within the token budget).
"""

from __future__ import annotations

import json
from typing import Any

import grpc
import jsonschema
import pytest

from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc

from .conftest import InProcessEngine
from .test_engine_grpc import request, status_of, stream, text_part

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "tags", "address"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}


def sampled(seed: int) -> pb.SamplingParams:
    return pb.SamplingParams(temperature=1.0, seed=seed)


def schema_format(schema: Any, *, strict: bool = False) -> pb.ResponseFormat:
    return pb.ResponseFormat(
        json_schema=pb.JsonSchemaFormat(name="person", schema_json=json.dumps(schema), strict=strict)
    )


def tools() -> list[pb.Tool]:
    return [
        pb.Tool(function=pb.FunctionTool(name="weather", parameters_json=json.dumps(WEATHER), strict=True)),
        pb.Tool(function=pb.FunctionTool(name="shell", parameters_json='{"type": "object"}')),
    ]


@pytest.mark.parametrize(("seed", "max_tokens"), [(0, 512), (1, 64), (2, 40)])
def test_json_schema_output_always_validates(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub, seed: int, max_tokens: int
) -> None:
    req = request(
        text_part("Who?"),
        response_format=schema_format(PERSON),
        sampling=sampled(seed),
        max_tokens=max_tokens,
    )
    chunks, (result,) = stream(stub, req)
    jsonschema.validate(json.loads(result.text), PERSON)
    assert "".join(chunk.text for chunk in chunks) == result.text
    # Closed within the budget, then stopped: complete, not cut off.
    assert result.finish_reason == pb.FINISH_REASON_STOP
    assert result.usage.output_tokens <= max_tokens


def test_json_object_output_is_an_object(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    req = request(
        text_part("Anything."),
        response_format=pb.ResponseFormat(json_object=pb.JsonObjectFormat()),
        sampling=sampled(3),
        max_tokens=128,
    )
    result = stub.GenerateUnary(pb.GenerateUnaryRequest(request=req), timeout=60).result
    assert isinstance(json.loads(result.text), dict)


@pytest.mark.parametrize("seed", [0, 1])
def test_required_tool_choice_streams_valid_calls_to_offered_tools(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub, seed: int
) -> None:
    req = request(
        text_part("Weather?"),
        tools=tools(),
        tool_choice=pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED),
        sampling=sampled(seed),
        max_tokens=160,
    )
    chunks, (result,) = stream(stub, req)
    assert result.tool_calls and result.finish_reason == pb.FINISH_REASON_TOOL_CALLS
    assert [c.tool_call.name for c in chunks if c.HasField("tool_call")] == [
        c.name for c in result.tool_calls
    ]
    assert result.text == "" and all(not chunk.text for chunk in chunks)
    # Each call's arguments streamed first (Hermes), adding up to the call's, under its id.
    streamed: dict[str, str] = {}
    for chunk in chunks:
        if chunk.HasField("tool_call_delta"):
            delta = chunk.tool_call_delta
            streamed[delta.id] = streamed.get(delta.id, "") + delta.arguments
    assert streamed == {call.id: call.arguments for call in result.tool_calls}
    for call in result.tool_calls:
        arguments = json.loads(call.arguments)
        assert call.name in ("weather", "shell") and isinstance(arguments, dict)
        if call.name == "weather":  # strict: exactly its parameters
            jsonschema.validate(arguments, WEATHER)


def test_named_strict_tool_gets_valid_arguments(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    req = request(
        text_part("Weather?"),
        tools=tools(),
        tool_choice=pb.ToolChoice(function_name="weather"),
        parallel_tool_calls=False,
        sampling=sampled(5),
        max_tokens=48,
    )
    result = stub.GenerateUnary(pb.GenerateUnaryRequest(request=req), timeout=60).result
    assert [call.name for call in result.tool_calls] == ["weather"]
    jsonschema.validate(json.loads(result.tool_calls[0].arguments), WEATHER)


def test_max_tool_calls_is_enforced(idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub) -> None:
    req = request(
        text_part("Go."),
        tools=tools(),
        tool_choice=pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED),
        max_tool_calls=1,
        sampling=sampled(7),
        max_tokens=200,
    )
    result = stub.GenerateUnary(pb.GenerateUnaryRequest(request=req), timeout=60).result
    assert len(result.tool_calls) == 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"response_format": schema_format({"type": "string", "pattern": "a(?=b)"}, strict=True)},
            "response_format.json_schema.schema_json cannot be enforced",
        ),
        (
            {
                "tools": tools(),
                "tool_choice": pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED),
                "max_tool_calls": 0,
            },
            "max_tool_calls is 0 but tool_choice requires a call",
        ),
    ],
)
def test_unenforceable_requests_are_invalid_argument(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub, fields: dict[str, Any], message: str
) -> None:
    code, details = status_of(lambda: list(stub.Generate(request(text_part("x"), **fields), timeout=30)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(message)

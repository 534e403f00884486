"""Constraints bind the answer, not the thinking: Qwen3-VL-Thinking's prompt opens `<think>`.

On the random-weight thinking fixture: the model thinks freely, `</think>` ends it (forced while
the answer still fits in the budget, since a random model never ends it by itself), and what
follows is the JSON the schema asks for.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tests.engine._family_engine import running_engine, text, user
from vlmserve.engine.v1 import engine_pb2 as pb

pytestmark = pytest.mark.needs_model

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}


def test_the_schema_binds_after_thinking(family_models: dict[str, Path]) -> None:
    request = pb.GenerateRequest(
        messages=[user(text("Think, then answer."))],
        response_format=pb.ResponseFormat(
            json_schema=pb.JsonSchemaFormat(name="a", schema_json=json.dumps(SCHEMA), strict=True)
        ),
        sampling=pb.SamplingParams(temperature=1.0, seed=3, max_tokens=120),
    )
    with running_engine(family_models["qwen3_vl_thinking"]) as (_engine, stub):
        result = stub.GenerateUnary(pb.GenerateUnaryRequest(request=request), timeout=120).result
    # The thinking is a reasoning output, never part of the answer text.
    assert result.reasoning_text.strip()  # the thinking was not constrained to JSON
    assert "<think>" not in result.text and "</think>" not in result.text
    jsonschema.validate(json.loads(result.text), SCHEMA)
    assert result.finish_reason == pb.FINISH_REASON_STOP
    assert 0 < result.usage.reasoning_tokens < result.usage.output_tokens


def test_streamed_reasoning_comes_before_the_answer(family_models: dict[str, Path]) -> None:
    request = pb.GenerateRequest(
        messages=[user(text("Think, then answer."))],
        response_format=pb.ResponseFormat(
            json_schema=pb.JsonSchemaFormat(name="a", schema_json=json.dumps(SCHEMA), strict=True)
        ),
        sampling=pb.SamplingParams(temperature=1.0, seed=3, max_tokens=120),
    )
    with running_engine(family_models["qwen3_vl_thinking"]) as (_engine, stub):
        unary = stub.GenerateUnary(pb.GenerateUnaryRequest(request=request), timeout=120).result
        responses = list(stub.Generate(request, timeout=120))
    chunks = [r.chunk for r in responses if r.WhichOneof("event") == "chunk"]
    result = responses[-1].complete
    kinds = [chunk.WhichOneof("kind") for chunk in chunks]
    assert "reasoning_text" in kinds and "text" in kinds
    # All reasoning first, then the answer.
    assert kinds.index("text") > max(i for i, kind in enumerate(kinds) if kind == "reasoning_text")
    assert "".join(c.reasoning_text for c in chunks) == result.reasoning_text == unary.reasoning_text
    assert "".join(c.text for c in chunks) == result.text == unary.text
    assert result.usage.reasoning_tokens == unary.usage.reasoning_tokens > 0


def test_without_a_budget_to_close_it_everything_is_reasoning(family_models: dict[str, Path]) -> None:
    request = pb.GenerateRequest(
        messages=[user(text("Think."))],
        sampling=pb.SamplingParams(temperature=1.0, seed=3, max_tokens=12),
    )
    with running_engine(family_models["qwen3_vl_thinking"]) as (_engine, stub):
        result = stub.GenerateUnary(pb.GenerateUnaryRequest(request=request), timeout=120).result
    if "</think>" in result.reasoning_text:  # pragma: no cover - the random model never closes it
        raise AssertionError(result.reasoning_text)
    assert result.text == ""
    assert result.reasoning_text
    assert result.usage.reasoning_tokens == result.usage.output_tokens == 12

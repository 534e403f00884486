"""Constraints bind the answer, not the thinking: Qwen3-VL-Thinking's prompt opens `<think>`.

On the random-weight thinking fixture: the model thinks freely, `</think>` ends it (forced while
the answer still fits in the budget, since a random model never ends it by itself), and what
follows is the JSON the schema asks for.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from tests.engine._family_engine import running_engine, text, user
from vlmserve.engine.v1 import engine_pb2 as pb

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
    thinking, marker, answer = result.text.partition("</think>")
    assert marker, result.text
    assert thinking.strip()  # the thinking was not constrained to JSON
    jsonschema.validate(json.loads(answer), SCHEMA)
    assert result.finish_reason == pb.FINISH_REASON_STOP

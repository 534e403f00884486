"""Schemas that require themselves without end (issue 39, finding 8): a strict tool whose
arguments must hold themselves (`{"child": {"$ref": "#"}}`, required) compiled, then llguidance
gave up at the output's first token after about a second ("Too many items (limit 50000;
ff_tokens)"): a 500 `constrained_decoding_failed`. It is now refused when the grammar is built,
naming the tool (a 400 at the facade); recursion that can end is enforced as before."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest

from tests.engine.test_grammar import accepts, build, function
from vlmserve.engine.grammar.compiler import GrammarCompiler, endless_reference
from vlmserve.engine.request_errors import RequestError
from vlmserve.engine.v1 import engine_pb2 as pb

NODE = {"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}}}

ENDLESS: dict[str, Any] = {
    "root": {"type": "object", "properties": {"child": {"$ref": "#"}}, "required": ["child"]},
    "defs": {
        "$defs": {
            "a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]},
            "b": {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "required": ["a"]},
        },
        "type": "object",
        "properties": {"start": {"$ref": "#/$defs/a"}},
        "required": ["start"],
    },
    "non-empty array": {
        "type": "object",
        "properties": {"children": {"type": "array", "items": {"$ref": "#"}, "minItems": 1}},
        "required": ["children"],
    },
    "every branch": {
        "type": "object",
        "properties": {"x": {"anyOf": [{"$ref": "#"}, {"allOf": [{"$ref": "#"}]}]}},
        "required": ["x"],
    },
}
ENDING: dict[str, Any] = {
    "optional": {"type": "object", "properties": {"child": {"$ref": "#"}}},
    "nullable": {
        "type": "object",
        "properties": {"child": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
        "required": ["child"],
        "additionalProperties": False,
    },
    "array may be empty": {
        "type": "object",
        "properties": {"children": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["children"],
    },
    "defs": {
        **NODE,
        "type": "object",
        "properties": {"head": {"$ref": "#/$defs/node"}},
        "required": ["head"],
    },
    "no refs": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.mark.parametrize("name", ENDLESS)
def test_a_strict_tool_that_requires_itself_is_refused_naming_it(
    compiler: GrammarCompiler, name: str
) -> None:
    assert endless_reference(ENDLESS[name]) is not None
    with pytest.raises(RequestError) as refused:
        build(compiler, tools=[function("tree", ENDLESS[name], strict=True)], tool_mode="required")
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.field == "tools[0].function.parameters_json"
    assert "'tree'" in refused.value.message and "$ref" in refused.value.message


@pytest.mark.parametrize("name", ENDING)
def test_recursion_that_can_end_is_enforced(compiler: GrammarCompiler, name: str) -> None:
    assert endless_reference(ENDING[name]) is None
    constraint = build(compiler, tools=[function("tree", ENDING[name], strict=True)], tool_mode="required")
    assert constraint is not None


def test_a_loose_tool_that_requires_itself_takes_any_object(
    compiler: GrammarCompiler, tokenizer: Any
) -> None:
    constraint = build(compiler, tools=[function("tree", ENDLESS["root"])], tool_mode="required")
    call = '<tool_call>\n{"name": "tree", "arguments": {"anything": 1}}\n</tool_call>'
    assert accepts(compiler, tokenizer, constraint, call)


def test_a_strict_answer_schema_that_requires_itself_is_refused(compiler: GrammarCompiler) -> None:
    schema = pb.JsonSchemaFormat(name="tree", schema_json=json.dumps(ENDLESS["root"]), strict=True)
    with pytest.raises(RequestError) as refused:
        build(compiler, tools=[], tool_mode="none", response_format=pb.ResponseFormat(json_schema=schema))
    assert refused.value.field == "response_format.json_schema.schema_json"

"""Request -> grammar, checked by running llguidance's matcher over real token sequences (no MLX)."""

from __future__ import annotations

import json
from typing import Any

import grpc
import llguidance
import pytest
from transformers import AutoTokenizer

from tests.engine._tool_pieces import collect
from vlmserve.engine.grammar.compiler import GrammarCompiler, OutputConstraint, constraint_for
from vlmserve.engine.request_errors import RequestError
from vlmserve.engine.toolcalls.parsers import ToolCallPiece
from vlmserve.engine.toolcalls.registry import HERMES_FORMAT, LLAMA_JSON_FORMAT, make_parser
from vlmserve.engine.v1 import engine_pb2 as pb

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}


def function(name: str, parameters: Any = None, *, strict: bool = False) -> pb.Tool:
    return pb.Tool(
        function=pb.FunctionTool(
            name=name, parameters_json=json.dumps(parameters or {"type": "object"}), strict=strict
        )
    )


TOOLS = [function("weather", WEATHER, strict=True), function("shell")]


def build(compiler: GrammarCompiler, **options: Any) -> OutputConstraint | None:
    settings: dict[str, Any] = {
        "tool_call_format": HERMES_FORMAT,
        "tools": TOOLS,
        "tool_mode": "auto",
        "forced_name": None,
        "parallel_tool_calls": True,
        "max_tool_calls": None,
        "response_format": None,
    }
    settings.update(options)
    return constraint_for(compiler, **settings)


def accepts(
    compiler: GrammarCompiler, tokenizer: Any, constraint: OutputConstraint | None, text: str
) -> bool:
    """Whether the model may write exactly `text` (tokenized as the model would) and then stop."""
    assert constraint is not None
    matcher = llguidance.LLMatcher(compiler.tokenizer, constraint.grammar)
    for token in tokenizer.encode(text, add_special_tokens=False):
        if not matcher.consume_token(token):
            return False
    return bool(matcher.is_accepting())


def call(name: str, arguments: Any) -> str:
    body = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{body}\n</tool_call>"


def json_format(schema: Any, *, strict: bool = False) -> pb.ResponseFormat:
    return pb.ResponseFormat(
        json_schema=pb.JsonSchemaFormat(name="out", schema_json=json.dumps(schema), strict=strict)
    )


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        (call("weather", {"city": "Oslo", "days": 3}), True),
        (call("shell", {"anything": [1, 2]}), True),  # not strict, its schema is any object
        (call("weather", {"city": "Oslo"}), False),  # strict: the parameters' schema
        (call("weather", {"city": "Oslo", "days": "3"}), False),
        (call("nope", {}), False),  # never offered
        ("Sure, I will call it.", False),  # required: no answer without a call
        (call("shell", {}) + "\n" + call("shell", {"b": 1}), True),
        (call("shell", []), False),
    ],
)
def test_required_means_valid_calls_to_offered_tools(
    compiler: GrammarCompiler, tokenizer: Any, text: str, ok: bool
) -> None:
    assert accepts(compiler, tokenizer, build(compiler, tool_mode="required"), text) is ok


def test_named_function_allows_only_that_function(compiler: GrammarCompiler, tokenizer: Any) -> None:
    constraint = build(compiler, tool_mode="function", forced_name="shell")
    assert accepts(compiler, tokenizer, constraint, call("shell", {}))
    assert not accepts(compiler, tokenizer, constraint, call("weather", {"city": "x", "days": 1}))


@pytest.mark.parametrize(("parallel", "limit", "most"), [(False, None, 1), (True, 2, 2), (True, None, 4)])
def test_call_count_limits(
    compiler: GrammarCompiler, tokenizer: Any, parallel: bool, limit: int | None, most: int
) -> None:
    constraint = build(compiler, tool_mode="required", parallel_tool_calls=parallel, max_tool_calls=limit)
    for count in range(1, 5):
        text = "\n".join(call("shell", {"n": n}) for n in range(count))
        assert accepts(compiler, tokenizer, constraint, text) is (count <= most)


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("Just an answer, no call.", True),
        ("", True),
        ("Let me look. " + call("weather", {"city": "Oslo", "days": 1}), True),
        ("Let me look. " + call("nope", {}), False),  # the name is constrained once a call opens
        ("Let me look. " + call("weather", {"days": 1}), False),
    ],
)
def test_auto_is_free_until_a_call_opens(
    compiler: GrammarCompiler, tokenizer: Any, text: str, ok: bool
) -> None:
    assert accepts(compiler, tokenizer, build(compiler), text) is ok


def test_auto_call_spelled_out_in_plain_tokens_is_constrained_too(
    compiler: GrammarCompiler, tokenizer: Any
) -> None:
    constraint = build(compiler)
    assert constraint is not None
    matcher = llguidance.LLMatcher(compiler.tokenizer, constraint.grammar)
    # "<tool_call>" written piece by piece instead of as its own token (id 8190 in this vocabulary).
    spelled = tokenizer.encode("ok <tool", add_special_tokens=False) + tokenizer.encode(
        "_call>", add_special_tokens=False
    )
    assert 8190 not in spelled and tokenizer.decode(spelled) == "ok <tool_call>"
    for token in spelled:
        assert matcher.consume_token(token)
    assert tokenizer.decode(matcher.compute_ff_tokens()).startswith('\n{"name": "')


def test_no_constraint_for_plain_text_or_tool_choice_none(compiler: GrammarCompiler) -> None:
    assert build(compiler, tools=[]) is None
    assert build(compiler, tool_mode="none") is None
    assert build(compiler, response_format=pb.ResponseFormat(text=pb.TextFormat()), tools=[]) is None


@pytest.mark.parametrize(
    ("response_format", "text", "ok"),
    [
        (pb.ResponseFormat(json_object=pb.JsonObjectFormat()), '{"a": [1, {"b": null}]}', True),
        (pb.ResponseFormat(json_object=pb.JsonObjectFormat()), "[1]", False),
        (pb.ResponseFormat(json_object=pb.JsonObjectFormat()), 'Here: {"a": 1}', False),
        (json_format(WEATHER), '{"city": "Oslo", "days": 2}', True),
        (json_format(WEATHER), '{"city": "Oslo"}', False),
        (json_format(WEATHER), '{"city": "Oslo", "days": 2, "extra": 1}', False),
        # Compact JSON only: a weak model cannot fill its budget with blanks.
        (json_format(WEATHER), '{"city": "Oslo",\n\n  "days": 2}', False),
    ],
)
def test_json_formats(
    compiler: GrammarCompiler, tokenizer: Any, response_format: pb.ResponseFormat, text: str, ok: bool
) -> None:
    constraint = build(compiler, tools=[], response_format=response_format)
    assert accepts(compiler, tokenizer, constraint, text) is ok


def test_auto_with_a_json_format_answers_json_or_calls(compiler: GrammarCompiler, tokenizer: Any) -> None:
    constraint = build(compiler, response_format=json_format(WEATHER))
    assert accepts(compiler, tokenizer, constraint, '{"city": "Oslo", "days": 2}')
    assert accepts(compiler, tokenizer, constraint, call("shell", {}))
    assert not accepts(compiler, tokenizer, constraint, "plain words")


@pytest.mark.parametrize(
    ("schema", "text", "ok"),
    [
        # Unimplemented keywords are ignored (lenient): the rest of the schema still binds.
        (
            {"type": "object", "properties": {"a": {"type": "integer"}}, "if": {}, "then": {}},
            '{"a": 1}',
            True,
        ),
        (
            {"type": "object", "properties": {"a": {"type": "integer"}}, "if": {}, "then": {}},
            '{"a": "x"}',
            False,
        ),
        # Not compilable even leniently: any JSON, never free text.
        ({"type": "string", "pattern": "(?=a)"}, '"anything"', True),
        ({"type": "string", "pattern": "(?=a)"}, "not json", False),
        ({"type": "strng"}, "[1, 2]", True),
    ],
)
def test_a_non_strict_schema_that_cannot_be_enforced_is_best_effort_but_always_json(
    compiler: GrammarCompiler, tokenizer: Any, schema: Any, text: str, ok: bool
) -> None:
    """As OpenAI's strict=false: best effort (the instruction carries the schema), not a refusal;
    the output still always parses."""
    constraint = build(compiler, tools=[], response_format=json_format(schema))
    assert accepts(compiler, tokenizer, constraint, text) is ok


@pytest.mark.parametrize(
    ("options", "field", "reason"),
    [
        (
            {
                "tools": [],
                "response_format": json_format({"type": "string", "pattern": "(?=a)"}, strict=True),
            },
            "response_format.json_schema.schema_json cannot be enforced",
            "look-around",
        ),
        (
            {"tools": [], "response_format": json_format({"type": "strng"}, strict=True)},
            "response_format.json_schema.schema_json cannot be enforced",
            "strng",
        ),
        (
            {
                "tools": [
                    function("f", {"type": "object", "properties": {"a": {"type": "nope"}}}, strict=True)
                ]
            },
            "tools[0].function.parameters_json cannot be enforced (strict)",
            "nope",
        ),
        (
            {
                "tools": [],
                "response_format": pb.ResponseFormat(json_schema=pb.JsonSchemaFormat(schema_json="{")),
            },
            "response_format.json_schema.schema_json is not valid JSON",
            "",
        ),
        (
            {"tool_call_format": "", "tool_mode": "required"},
            "tool_choice cannot be enforced",
            "no call grammar",
        ),
    ],
)
def test_what_cannot_be_enforced_is_invalid_argument_naming_the_field(
    compiler: GrammarCompiler, options: dict[str, Any], field: str, reason: str
) -> None:
    with pytest.raises(RequestError) as caught:
        build(compiler, **options)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.message.startswith(field)
    assert reason in caught.value.message
    assert "%llguidance" not in caught.value.message  # our wrapping grammar is not shown


NESTED = {  # as pydantic writes a model with a nested model
    "$defs": {"City": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
    "type": "object",
    "properties": {"city": {"$ref": "#/$defs/City"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}


@pytest.mark.parametrize("strict", [True, False])
def test_tool_parameters_with_local_refs(compiler: GrammarCompiler, tokenizer: Any, strict: bool) -> None:
    constraint = build(compiler, tools=[function("f", NESTED, strict=strict), function("g", NESTED)])
    assert accepts(compiler, tokenizer, constraint, call("f", {"city": {"name": "Oslo"}, "days": 1}))
    assert not accepts(compiler, tokenizer, constraint, call("f", {"city": {"nom": "Oslo"}, "days": 1}))
    assert not accepts(compiler, tokenizer, constraint, call("g", {"city": "Oslo", "days": 1}))


def test_non_strict_tools_follow_their_schema_leniently_or_fall_back_to_any_object(
    compiler: GrammarCompiler, tokenizer: Any
) -> None:
    loose = {
        "type": "object",
        "properties": {"a": {"type": "integer", "format": "custom"}},
        "required": ["a"],
    }
    unusable = {"type": "object", "properties": {"a": {"$ref": "http://example.com/schema"}}}
    constraint = build(compiler, tools=[function("loose", loose), function("other", unusable)])
    assert accepts(compiler, tokenizer, constraint, call("loose", {"a": 1}))
    assert not accepts(compiler, tokenizer, constraint, call("loose", {"a": "x"}))  # the schema, leniently
    assert accepts(compiler, tokenizer, constraint, call("other", {"anything": True}))  # any object


@pytest.fixture(scope="module")
def mistral(family_models: dict[str, Any]) -> tuple[Any, GrammarCompiler]:
    tokenizer = AutoTokenizer.from_pretrained(str(family_models["mistral3"]))
    return tokenizer, GrammarCompiler(tokenizer, [tokenizer.eos_token_id])


@pytest.mark.parametrize(
    ("mode", "limit", "text", "ok"),
    [
        ("required", None, '[TOOL_CALLS] [{"name": "shell", "arguments": {"a": 1}}]', True),
        ("required", None, '[TOOL_CALLS] [{"name": "weather", "arguments": {"city": "x", "days": 2}}]', True),
        ("required", None, '[TOOL_CALLS] [{"name": "weather", "arguments": {"city": "x"}}]', False),
        ("required", None, '[TOOL_CALLS] [{"name": "nope", "arguments": {}}]', False),
        ("required", None, "Sure.", False),
        (
            "required",
            1,
            '[TOOL_CALLS] [{"name": "shell", "arguments": {}}, {"name": "shell", "arguments": {}}]',
            False,
        ),
        ("auto", None, "Just words.", True),
        ("auto", None, 'Words [TOOL_CALLS] [{"name": "shell", "arguments": {}}]', True),
        ("auto", None, 'Words [TOOL_CALLS] [{"name": "nope", "arguments": {}}]', False),
    ],
)
def test_mistral_calls_are_its_json_array(
    mistral: tuple[Any, GrammarCompiler], mode: str, limit: int | None, text: str, ok: bool
) -> None:
    tokenizer, compiler = mistral
    constraint = build(compiler, tool_call_format="mistral", tool_mode=mode, max_tool_calls=limit)
    assert accepts(compiler, tokenizer, constraint, text) is ok
    if ok and "[TOOL_CALLS]" in text:  # and the family's parser reads what the grammar allows
        pieces = collect(make_parser("mistral"), [text])
        assert [p.call.name for p in pieces if isinstance(p, ToolCallPiece)]


@pytest.fixture(scope="module")
def llama4(family_models: dict[str, Any]) -> tuple[Any, GrammarCompiler]:
    tokenizer = AutoTokenizer.from_pretrained(str(family_models["llama4"]))
    return tokenizer, GrammarCompiler(tokenizer, [tokenizer.eos_token_id])


@pytest.mark.parametrize(
    ("mode", "limit", "text", "ok"),
    [
        ("required", None, '{"name": "shell", "parameters": {"a": 1}}', True),
        ("required", None, '{"name": "weather", "parameters": {"city": "x", "days": 2}}', True),
        ("required", None, '{"name": "weather", "parameters": {"city": "x"}}', False),
        ("required", None, '{"name": "nope", "parameters": {}}', False),
        ("required", None, '{"name": "shell", "arguments": {}}', False),  # Llama's key is `parameters`
        ("required", None, "Sure.", False),
        ("required", None, '{"name": "shell", "parameters": {}}; {"name": "shell", "parameters": {}}', True),
        ("required", 1, '{"name": "shell", "parameters": {}}; {"name": "shell", "parameters": {}}', False),
        ("auto", None, "Just words, even {braces}.", True),
        ("auto", None, " Leading space.", True),
        ("auto", None, '{"name": "shell", "parameters": {}}', True),
        ("auto", None, '{"name": "nope", "parameters": {}}', False),  # a call once `{` opens it
        ("auto", None, '{"free": "json"}', False),
    ],
)
def test_llama_calls_are_the_whole_answer(
    llama4: tuple[Any, GrammarCompiler], mode: str, limit: int | None, text: str, ok: bool
) -> None:
    tokenizer, compiler = llama4
    constraint = build(compiler, tool_call_format=LLAMA_JSON_FORMAT, tool_mode=mode, max_tool_calls=limit)
    assert accepts(compiler, tokenizer, constraint, text) is ok
    if ok and text.startswith("{"):  # and the family's parser reads what the grammar allows
        pieces = collect(make_parser(LLAMA_JSON_FORMAT), [text])
        names = [json.loads(part)["name"] for part in text.split("; ")]
        assert [p.call.name for p in pieces if isinstance(p, ToolCallPiece)] == names

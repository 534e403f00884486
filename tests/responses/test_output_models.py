"""The outbound models held against the vendored Open Responses schema and the openai package.

Each model's fields must be properties of its Open Responses component (a few extensions,
listed, are held against openai's own types instead), every property the component requires
must always be sent, and every literal the model can send must be one the schema allows.
Whole responses and events are then checked by both: the schema validator and openai's parser,
with one known difference: the `error` event follows Open Responses (`error: {...}` nested; the
openai package has its fields flat); openai's types also allow only OpenAI's own codes in a
failed response's `error`. openai 3.57's `Usage` requires `cache_write_tokens`, which the Open
Responses schema lacks (an extension, always 0: the engine's prefix cache has no write cost).
"""

from __future__ import annotations

import itertools
import typing
from typing import Any

import openai.types.responses as openai_types
import pytest
from pydantic import BaseModel, TypeAdapter

from tests._openresponses import EVENT_SCHEMAS, assert_valid, spec
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade.http.errors import APIError
from vlmserve.facade.responses.events import ResponseEvents
from vlmserve.facade.responses.resource import new_resource
from vlmserve.responses import (
    CustomToolCallItem,
    ErrorPayload,
    FunctionCallItem,
    IncompleteDetails,
    OutputMessage,
    OutputTextContent,
    ResponseError,
    ResponseResource,
    Usage,
    build_generate_request,
)
from vlmserve.responses._events import (
    ContentPartEvent,
    FunctionCallArgumentsDeltaEvent,
    FunctionCallArgumentsDoneEvent,
    OutputItemEvent,
    OutputTextDeltaEvent,
    OutputTextDoneEvent,
    ResponseLifecycleEvent,
)
from vlmserve.responses._output_models import (
    FunctionToolEcho,
    InputImageContent,
    InputTokensDetails,
    OutputTokensDetails,
    ReasoningEcho,
    TextEcho,
)

# model -> (Open Responses component, fields it adds that the component lacks; openai's types have them)
HELD: list[tuple[type[BaseModel], str, set[str]]] = [
    (OutputTextContent, "OutputTextContent", set()),
    (InputImageContent, "InputImageContent", set()),
    (OutputMessage, "Message", set()),
    (FunctionCallItem, "FunctionCall", {"namespace"}),
    (Usage, "Usage", set()),
    (InputTokensDetails, "InputTokensDetails", {"cache_write_tokens"}),
    (OutputTokensDetails, "OutputTokensDetails", set()),
    (IncompleteDetails, "IncompleteDetails", set()),
    (ResponseError, "Error", set()),
    (FunctionToolEcho, "FunctionTool", set()),
    (ReasoningEcho, "Reasoning", set()),
    (TextEcho, "TextField", set()),
    (ResponseResource, "ResponseResource", {"conversation", "user", "truncated_items"}),
    (ErrorPayload, "ErrorPayload", set()),
    (ResponseLifecycleEvent, "ResponseCompletedStreamingEvent", set()),
    (OutputItemEvent, "ResponseOutputItemDoneStreamingEvent", set()),
    (ContentPartEvent, "ResponseContentPartDoneStreamingEvent", set()),
    (OutputTextDeltaEvent, "ResponseOutputTextDeltaStreamingEvent", set()),
    (OutputTextDoneEvent, "ResponseOutputTextDoneStreamingEvent", set()),
    (FunctionCallArgumentsDeltaEvent, "ResponseFunctionCallArgumentsDeltaStreamingEvent", set()),
    (FunctionCallArgumentsDoneEvent, "ResponseFunctionCallArgumentsDoneStreamingEvent", set()),
]


def component(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = spec()["components"]["schemas"][name]
    return schema


# Literal values a model sends beyond its component's enum, with the openai type that has them.
WIDER_LITERALS = {("InputImageContent", "detail"): ({"original"}, openai_types.ResponseInputImage)}


def always_sent(model: type[BaseModel]) -> set[str]:
    return {name for name, field in model.model_fields.items() if field.exclude_if is None}


def literals(annotation: Any) -> set[str]:
    """The string literals a field's type allows (through unions and Optional)."""
    if typing.get_origin(annotation) is typing.Literal:
        return {value for value in typing.get_args(annotation) if isinstance(value, str)}
    found: set[str] = set()
    for argument in typing.get_args(annotation):
        found |= literals(argument)
    return found


def schema_enum(schema: dict[str, Any]) -> set[str] | None:
    """The strings a property allows, when the schema lists them (following one $ref)."""
    if "$ref" in schema:
        return schema_enum(component(schema["$ref"].rsplit("/", 1)[1]))
    if "enum" in schema:
        return set(schema["enum"])
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        enums = [schema_enum(option) for option in options if option.get("type") != "null"]
        if enums and all(enum is not None for enum in enums):
            return set().union(*(enum for enum in enums if enum is not None))
    return None


@pytest.mark.parametrize(("model", "name", "extensions"), HELD, ids=[model.__name__ for model, _, _ in HELD])
def test_model_matches_its_open_responses_component(
    model: type[BaseModel], name: str, extensions: set[str]
) -> None:
    schema = component(name)
    properties = schema["properties"]
    assert set(model.model_fields) - extensions <= set(properties), "fields the schema does not have"
    assert set(schema.get("required", [])) <= always_sent(model), "required fields that may be left out"
    for field_name, field in model.model_fields.items():
        if field_name in extensions or (field_name == "type" and name.endswith("StreamingEvent")):
            continue
        sent = literals(field.annotation)
        allowed = schema_enum(properties[field_name])
        wider, openai_type = WIDER_LITERALS.get((name, field_name), (set(), None))
        if wider and allowed is not None:
            assert wider <= literals(openai_type.model_fields[field_name].annotation)
            allowed |= wider
        if sent and allowed is not None:
            assert sent <= allowed, f"{field_name}: {sorted(sent - allowed)} not in the schema"


def test_extensions_are_openai_fields() -> None:
    """What the Open Responses schema lacks, OpenAI's own types carry."""
    assert {"namespace"} <= set(openai_types.ResponseFunctionToolCall.model_fields)
    assert {"conversation", "user"} <= set(openai_types.Response.model_fields)
    assert {"type", "id", "call_id", "name", "input", "namespace"} >= set(CustomToolCallItem.model_fields) - {
        "status"
    }
    assert set(CustomToolCallItem.model_fields) - {"status"} <= set(
        openai_types.ResponseCustomToolCall.model_fields
    )


def streamed(
    result: pb.GenerateResult, *chunks: pb.GenerateChunk, tools: list[Any] | None = None
) -> ResponseEvents:
    translated = build_generate_request({"input": "hi", "tools": tools or [], "user": "u"})
    counter = itertools.count()
    resource = new_resource(translated, response_id="resp_1", model_id="m", conversation_id="conv_1")
    return ResponseEvents(
        resource, offered_tools=translated.tools.offered, new_id=lambda prefix: f"{prefix}_{next(counter)}"
    )


def without_custom_calls(event: dict[str, Any]) -> dict[str, Any]:
    """Open Responses has no custom tool calls (openai's types do): leave them out of its check."""
    if "response" in event:
        output = [item for item in event["response"]["output"] if item["type"] != "custom_tool_call"]
        return {**event, "response": {**event["response"], "output": output}}
    return event


CUSTOM_TOOL = {"type": "custom", "name": "apply_patch"}
CASES = {
    "text": (pb.GenerateResult(text="It is red.", usage=pb.Usage(input_tokens=3, output_tokens=2)), []),
    "length": (pb.GenerateResult(text="It", finish_reason=pb.FINISH_REASON_LENGTH), []),
    "calls": (
        pb.GenerateResult(
            text="Let me look.",
            tool_calls=[
                pb.ToolCall(id="c1", name="view", arguments="{}"),
                pb.ToolCall(id="c2", name="apply_patch", arguments='{"input": "x"}'),
            ],
        ),
        [{"type": "function", "name": "view"}, CUSTOM_TOOL],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_events_and_responses_parse_as_openai_types_and_validate(case: str) -> None:
    result, tools = CASES[case]
    builder = streamed(result, tools=tools)
    events = builder.start() + builder.chunk(pb.GenerateChunk(text=result.text)) + builder.complete(result)
    openai_event = TypeAdapter(openai_types.ResponseStreamEvent)
    for event in events:
        sent = event.to_json()
        if sent["type"] in EVENT_SCHEMAS and sent.get("item", {}).get("type") != "custom_tool_call":
            assert_valid(without_custom_calls(sent), EVENT_SCHEMAS[sent["type"]])
        parsed = openai_event.validate_python(sent)
        assert parsed.type == sent["type"]
    final = builder.snapshot().to_json()
    assert final["conversation"] == {"id": "conv_1"} and final["user"] == "u"
    assert openai_types.Response.model_validate(final).id == "resp_1"
    final.pop("conversation"), final.pop("user")
    assert_valid(
        {**final, "output": [i for i in final["output"] if i["type"] != "custom_tool_call"]},
        "ResponseResource",
    )


def test_a_failure_parses_as_openai_types_and_validates() -> None:
    builder = streamed(pb.GenerateResult())
    events = builder.start() + builder.fail(
        APIError(503, "The engine is unavailable.", code="engine_unavailable")
    )
    error, failed = (event.to_json() for event in events[-2:])
    assert_valid(error, "ErrorStreamingEvent")
    assert_valid(failed, "ResponseFailedStreamingEvent")
    # (openai's types only allow OpenAI's own error codes, such as `server_error`.)
    assert failed["response"]["error"] == {
        "code": "engine_unavailable",
        "message": "The engine is unavailable.",
    }


def test_outbound_models_refuse_what_they_do_not_declare() -> None:
    with pytest.raises(ValueError):
        OutputMessage.model_validate({"id": "m", "status": "completed", "content": [], "extra": 1})
    message = OutputMessage(id="m", status="completed", content=[])
    with pytest.raises(ValueError):
        message.status = "finished"  # type: ignore[assignment]

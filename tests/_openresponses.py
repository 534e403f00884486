"""The Open Responses OpenAPI schema, vendored, and validators for its components.

`tests/data/openresponses-openapi.json` is a copy of the team's reference schema
(`../shared/specs/openresponses-openapi.json`), committed so a fresh clone can run the tests;
`test_vendored_schema_matches_shared` catches drift where the shared copy exists.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SPEC_PATH = Path(__file__).resolve().parent / "data" / "openresponses-openapi.json"
SHARED_SPEC_PATH = Path(__file__).resolve().parents[2] / "shared" / "specs" / "openresponses-openapi.json"
_SPEC_URI = "urn:openresponses-openapi"

# Streaming event type -> its schema in the Open Responses spec.
EVENT_SCHEMAS = {
    "response.created": "ResponseCreatedStreamingEvent",
    "response.queued": "ResponseQueuedStreamingEvent",
    "response.in_progress": "ResponseInProgressStreamingEvent",
    "response.completed": "ResponseCompletedStreamingEvent",
    "response.failed": "ResponseFailedStreamingEvent",
    "response.incomplete": "ResponseIncompleteStreamingEvent",
    "response.output_item.added": "ResponseOutputItemAddedStreamingEvent",
    "response.output_item.done": "ResponseOutputItemDoneStreamingEvent",
    "response.content_part.added": "ResponseContentPartAddedStreamingEvent",
    "response.content_part.done": "ResponseContentPartDoneStreamingEvent",
    "response.output_text.delta": "ResponseOutputTextDeltaStreamingEvent",
    "response.output_text.done": "ResponseOutputTextDoneStreamingEvent",
    "response.function_call_arguments.delta": "ResponseFunctionCallArgumentsDeltaStreamingEvent",
    "response.function_call_arguments.done": "ResponseFunctionCallArgumentsDoneStreamingEvent",
    "error": "ErrorStreamingEvent",
}


@functools.cache
def spec() -> dict[str, Any]:
    return dict(json.loads(SPEC_PATH.read_text()))


@functools.cache
def _registry() -> Registry:
    registry: Registry = Registry().with_resource(
        _SPEC_URI, Resource.from_contents(spec(), default_specification=DRAFT202012)
    )
    return registry


@functools.cache
def validator(schema_name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(
        {"$ref": f"{_SPEC_URI}#/components/schemas/{schema_name}"}, registry=_registry()
    )


def assert_valid(instance: Any, schema_name: str) -> None:
    errors = sorted(validator(schema_name).iter_errors(instance), key=lambda e: list(e.path))
    assert not errors, f"{schema_name}: " + "; ".join(
        f"{list(e.path)}: {e.message[:300]}" for e in errors[:5]
    )

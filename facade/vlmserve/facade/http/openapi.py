"""The OpenAPI document, generated from the request and response models.

The routes read their JSON bodies themselves (bounded in size and depth, request_body.py) and
validate them with the models of `vlmserve.responses`; so FastAPI does not see the bodies, and
this module puts the models' JSON schemas into the document: request bodies, responses, and the
links that let a schema-driven fuzzer (schemathesis) follow a created response or conversation
to the routes that use its id. Unions are documented as `anyOf` (pydantic writes `oneOf`, which
liberal, overlapping item shapes cannot satisfy exactly once).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field, TypeAdapter
from pydantic.json_schema import models_json_schema

from vlmserve.chat import ChatCompletion, ChatCompletionBody
from vlmserve.facade.settings import Limits
from vlmserve.responses import CreateResponseBody, InputItemParam, RequestModel, ResponseResource

_COMPONENTS = "#/components/schemas/{model}"

# operationIds of the routes the links point at (set on the routes themselves).
RETRIEVE_RESPONSE = "retrieveResponse"
DELETE_RESPONSE = "deleteResponse"
LIST_INPUT_ITEMS = "listInputItems"
CANCEL_RESPONSE = "cancelResponse"
RETRIEVE_CONVERSATION = "retrieveConversation"
DELETE_CONVERSATION = "deleteConversation"
LIST_CONVERSATION_ITEMS = "listConversationItems"
ADD_CONVERSATION_ITEMS = "addConversationItems"


class CreateConversationBody(RequestModel):
    """`POST /v1/conversations`: items to start with (validated like a response's `input`)."""

    items: list[InputItemParam] | None = None
    metadata: dict[str, Any] | None = Field(
        default=None,
        description="At most 16 pairs; keys at most 64 characters, values strings of at most 512.",
    )
    model: str | None = Field(
        default=None,
        description="An extension: the model (an id or alias of `GET /v1/models`) its responses use "
        "when they name none, until one names another; its `items` are checked against that model's "
        "limits. Default: none (the server's default model, or each response's own).",
    )


class AddConversationItemsBody(RequestModel):
    """`POST /v1/conversations/{id}/items`."""

    items: Annotated[list[InputItemParam], Field(min_length=1)]


class UpdateConversationBody(RequestModel):
    """`POST /v1/conversations/{id}`: the new metadata (replaces the old)."""

    metadata: dict[str, Any] | None = Field(
        description="At most 16 pairs; keys at most 64 characters, values strings of at most 512.",
    )


CREATE_CONVERSATION = TypeAdapter(CreateConversationBody)
UPDATE_CONVERSATION = TypeAdapter(UpdateConversationBody)
ADD_CONVERSATION_ITEMS_BODY = TypeAdapter(AddConversationItemsBody)

# Documented models, and the JSON schema mode each is documented in.
_MODELS: list[tuple[type[BaseModel], Any]] = [
    (CreateResponseBody, "validation"),
    (CreateConversationBody, "validation"),
    (AddConversationItemsBody, "validation"),
    (UpdateConversationBody, "validation"),
    (ResponseResource, "serialization"),
    (ChatCompletionBody, "validation"),
    (ChatCompletion, "serialization"),
]


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _COMPONENTS.format(model=model.__name__)}


def _links(parameter: str, operations: dict[str, str]) -> dict[str, Any]:
    """OpenAPI links from a created object's `id` to the operations taking it as `parameter`."""
    return {
        name: {"operationId": operation_id, "parameters": {parameter: "$response.body#/id"}}
        for name, operation_id in operations.items()
    }


def _body(
    model: type[BaseModel], *, answer: dict[str, Any] | None = None, links: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`openapi_extra` for a route: its request body, and its 200 answer where it has one."""
    extra: dict[str, Any] = {
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(model)}}}
    }
    if answer or links:
        ok: dict[str, Any] = {"description": "Successful Response"}
        if answer:
            ok["content"] = answer
        if links:
            ok["links"] = links
        extra["responses"] = {"200": ok}
    return extra


CREATE_RESPONSE_BODY = _body(
    CreateResponseBody,
    answer={
        "application/json": {"schema": _ref(ResponseResource)},
        "text/event-stream": {"schema": {"type": "string", "description": "with `stream: true`"}},
    },
    links=_links(
        "response_id",
        {
            "GetResponse": RETRIEVE_RESPONSE,
            "DeleteResponse": DELETE_RESPONSE,
            "ListInputItems": LIST_INPUT_ITEMS,
            "CancelResponse": CANCEL_RESPONSE,
        },
    ),
)
INPUT_TOKENS_BODY = _body(CreateResponseBody)
CREATE_CONVERSATION_BODY = _body(
    CreateConversationBody,
    links=_links(
        "conversation_id",
        {
            "GetConversation": RETRIEVE_CONVERSATION,
            "DeleteConversation": DELETE_CONVERSATION,
            "ListConversationItems": LIST_CONVERSATION_ITEMS,
            "AddConversationItems": ADD_CONVERSATION_ITEMS,
        },
    ),
)
ADD_CONVERSATION_ITEMS_REQUEST = _body(AddConversationItemsBody)
UPDATE_CONVERSATION_REQUEST = _body(UpdateConversationBody)
CREATE_CHAT_COMPLETION_BODY = _body(
    ChatCompletionBody,
    answer={
        "application/json": {"schema": _ref(ChatCompletion)},
        "text/event-stream": {"schema": {"type": "string", "description": "chunks, with `stream: true`"}},
    },
)


def model_schemas() -> dict[str, Any]:
    """The JSON schemas of every documented model and what they refer to, by name."""
    _, schema = models_json_schema(_MODELS, ref_template=_COMPONENTS)
    definitions: dict[str, Any] = schema.get("$defs", {})
    # Only what the documented models reach (members that exist to refuse are left out).
    reached: set[str] = set()
    pending = [model.__name__ for model, _ in _MODELS]
    while pending:
        name = pending.pop()
        if name not in reached:
            reached.add(name)
            pending.extend(_references(definitions[name]))
    return {name: _any_of(definitions[name]) for name in sorted(reached)}


def _references(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"].rsplit("/", 1)[1]] if isinstance(node.get("$ref"), str) else []
        return found + [name for value in node.values() for name in _references(value)]
    if isinstance(node, list):
        return [name for value in node for name in _references(value)]
    return []


def _limit(schema: dict[str, Any], keyword: str, value: int) -> None:
    """Set `keyword` on the non-null arm of an optional field's schema."""
    for arm in schema.get("anyOf", [schema]):
        if arm.get("type") not in (None, "null"):
            arm[keyword] = min(value, arm.get(keyword, value))


def _any_of(node: Any) -> Any:
    if isinstance(node, dict):
        return {("anyOf" if key == "oneOf" else key): _any_of(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_any_of(value) for value in node]
    return node


def install_openapi(app: FastAPI, limits: Limits) -> None:
    """Make `app.openapi()` the routes' document plus the models' schemas (built once), with
    this server's own limits where they are tighter than the models'."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes
            )
            schemas = model_schemas()
            body = schemas["CreateResponseBody"]["properties"]
            if limits.max_output_tokens is not None:
                _limit(body["max_output_tokens"], "maximum", limits.max_output_tokens)
            _limit(body["tools"], "maxItems", limits.max_tools)
            document.setdefault("components", {}).setdefault("schemas", {}).update(schemas)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

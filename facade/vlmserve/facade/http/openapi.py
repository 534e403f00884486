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
            document_answers(document)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


# ---- what the routes answer besides 200 ---------------------------------------------------------

_ERROR_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "description": "OpenAI's error shape (every route but /v1/messages).",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "code": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                    "param": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                },
            }
        },
    },
    "AnthropicError": {
        "type": "object",
        "description": "Anthropic's error shape (/v1/messages and its token count).",
        "required": ["type", "error"],
        "properties": {
            "type": {"const": "error"},
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
}
_WHY: dict[int, str] = {
    400: "Invalid request: the field is named in `param` (or the message)",
    401: "No API key, or a wrong one (with API keys configured)",
    404: "Not found: the object, or the `model` (`model_not_found`)",
    408: "The request body did not arrive in time",
    413: "The request body (or file) is larger than this server's limit",
    429: "This API key's limit (responses at once, stored bytes, files, sockets); see Retry-After",
    502: "The engine failed to process the request",
    503: "Busy (body budget, connections, the engine's queue: Retry-After) or the engine is unavailable",
    504: "The engine did not answer in time",
    507: "The server is out of storage space",
}
# Routes that generate (model, admission, the engine), and those that store.
_GENERATING = ("/v1/responses", "/v1/chat/completions", "/v1/messages", "/v1/responses/compact")
_COUNTING = ("/v1/responses/input_tokens", "/v1/messages/count_tokens")
_STORING_PREFIXES = ("/v1/conversations", "/v1/files")
# Routes that read a JSON body themselves (FastAPI does not see it, so the document may not).
_OWN_BODIES = ("/v1/messages", "/v1/messages/count_tokens", "/v1/responses/compact")
_FILE_TYPES = ("application/pdf", "image/png", "image/jpeg", "image/webp", "image/gif", "text/plain")


def _error_codes(method: str, path: str, operation: dict[str, Any]) -> set[int]:
    """The error statuses a route answers with (what its code paths raise; docs/responses-api.md)."""
    if path == "/healthz":
        return set()
    if path == "/readyz":
        return {503}
    codes = {401, 503}
    parameters = operation.get("parameters") or []
    has_body = "requestBody" in operation or (method == "post" and path in _OWN_BODIES)
    if has_body or parameters:
        codes.add(400)
    if has_body:
        codes |= {408, 413}
    if any(parameter.get("in") == "path" for parameter in parameters):
        codes.add(404)
    if method == "post" and path in (*_GENERATING, *_COUNTING):
        codes |= {404, 502, 504}
    if method == "post" and path in _GENERATING:
        codes.add(429)
    if method == "post" and (path == "/v1/responses" or path.startswith(_STORING_PREFIXES)):
        codes |= {429, 507}
    if path.startswith("/v1/models"):
        codes.add(404 if "{" in path else 503)
    return codes


def document_answers(document: dict[str, Any]) -> None:
    """Each operation's documented answers as the routes give them: the error statuses they
    really return (OpenAI- or Anthropic-shaped; never FastAPI's 422, which the app answers as a
    400), event streams where a route streams, a file's own types for its content."""
    document.setdefault("components", {}).setdefault("schemas", {}).update(_ERROR_SCHEMAS)
    for path, operations in document.get("paths", {}).items():
        anthropic = path.startswith("/v1/messages")
        error = {
            "application/json": {
                "schema": {"$ref": _COMPONENTS.format(model="AnthropicError" if anthropic else "Error")}
            }
        }
        for method, operation in operations.items():
            answers: dict[str, Any] = operation.setdefault("responses", {})
            answers.pop("422", None)
            for code in sorted(_error_codes(method, path, operation)):
                answers.setdefault(str(code), {"description": _WHY[code], "content": error})
            ok = answers.setdefault("200", {"description": "Successful Response"})
            if method == "post" and path == "/v1/messages":
                ok.setdefault("content", {}).setdefault(
                    "text/event-stream", {"schema": {"type": "string", "description": "with `stream: true`"}}
                )
            if path.endswith("/content") and path.startswith("/v1/files"):
                ok["content"] = {
                    kind: {"schema": {"type": "string", "format": "binary"}} for kind in _FILE_TYPES
                }
            if method == "post" and path in _OWN_BODIES and "requestBody" not in operation:
                operation["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": {"type": "object"}}},
                }

"""Request-body schemas and links for the OpenAPI document.

The routes read their JSON bodies themselves (the translation validates them and names the
exact JSON path of a bad field), so these schemas document the accepted shape: the Open
Responses `CreateResponseBody` (docs/responses-api.md), restricted to what this server runs.
They are detailed enough for schema-driven fuzzers (schemathesis) to reach the translation;
the links let them follow a created response or conversation to the routes that use its id.
"""

from __future__ import annotations

from typing import Any

# A 2x2 PNG: lets generated requests carry an image that decodes (the schema's example).
EXAMPLE_IMAGE_URL = (
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR42mM8oaHBwMDAxMDAwMDAAAAN6gEcJklYAwAAAABJRU5ErkJggg=="
)

_ID = {"type": "string", "minLength": 1, "maxLength": 64}
_TEXT = {"type": "string"}


def _object(required: list[str], properties: dict[str, Any], *, title: str) -> dict[str, Any]:
    return {
        "type": "object",
        "title": title,
        "required": required,
        "properties": properties,
        "additionalProperties": False,
    }


def _const(value: str) -> dict[str, Any]:
    return {"type": "string", "enum": [value]}


_INPUT_TEXT = _object(["type", "text"], {"type": _const("input_text"), "text": _TEXT}, title="InputText")
_INPUT_IMAGE = _object(
    ["type", "image_url"],
    {
        "type": _const("input_image"),
        "image_url": {
            "type": "string",
            "description": "A base64 `data:` URL (png, jpeg, webp, gif); http(s) only when the server "
            "enables remote images.",
            "examples": [EXAMPLE_IMAGE_URL],
        },
        "detail": {
            "anyOf": [{"type": "string", "enum": ["auto", "low", "high", "original"]}, {"type": "null"}]
        },
    },
    title="InputImage",
)
_OUTPUT_TEXT = _object(["type", "text"], {"type": _const("output_text"), "text": _TEXT}, title="OutputText")
_USER_CONTENT = {"anyOf": [_TEXT, {"type": "array", "items": {"anyOf": [_INPUT_TEXT, _INPUT_IMAGE]}}]}

_MESSAGE = _object(
    ["role", "content"],
    {
        "type": _const("message"),
        "id": _ID,
        "role": {"type": "string", "enum": ["user", "system", "developer"]},
        "content": _USER_CONTENT,
    },
    title="InputMessage",
)
_ASSISTANT_MESSAGE = _object(
    ["role", "content"],
    {
        "type": _const("message"),
        "id": _ID,
        "role": _const("assistant"),
        "content": {"anyOf": [_TEXT, {"type": "array", "items": _OUTPUT_TEXT}]},
    },
    title="AssistantMessage",
)
_FUNCTION_CALL = _object(
    ["type", "call_id", "name", "arguments"],
    {
        "type": _const("function_call"),
        "id": _ID,
        "call_id": _ID,
        "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
        "arguments": {"type": "string", "description": "JSON text"},
    },
    title="FunctionCall",
)
_FUNCTION_CALL_OUTPUT = _object(
    ["type", "call_id", "output"],
    {
        "type": _const("function_call_output"),
        "id": _ID,
        "call_id": _ID,
        "output": _USER_CONTENT,
    },
    title="FunctionCallOutput",
)
_ITEM_REFERENCE = _object(
    ["type", "id"], {"type": _const("item_reference"), "id": _ID}, title="ItemReference"
)
_ITEM = {"anyOf": [_MESSAGE, _ASSISTANT_MESSAGE, _FUNCTION_CALL, _FUNCTION_CALL_OUTPUT, _ITEM_REFERENCE]}
_ITEMS = {"type": "array", "items": _ITEM}

_INPUT = {
    "description": "A string (one user message) or an array of input items; see docs/responses-api.md.",
    "anyOf": [{"type": "string", "minLength": 1}, {**_ITEMS, "minItems": 1}],
}
_FUNCTION_TOOL = _object(
    ["type", "name"],
    {
        "type": _const("function"),
        "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
        "description": {"anyOf": [_TEXT, {"type": "null"}]},
        "parameters": {"anyOf": [{"type": "object"}, {"type": "null"}], "description": "A JSON Schema"},
        "strict": {"type": "boolean"},
    },
    title="FunctionTool",
)
_TOOL_CHOICE = {
    "anyOf": [
        {"type": "string", "enum": ["none", "auto", "required"]},
        _object(["type", "name"], {"type": _const("function"), "name": _TEXT}, title="SpecificFunction"),
    ]
}
_METADATA = {
    "anyOf": [
        {
            "type": "object",
            "maxProperties": 16,
            "propertyNames": {"maxLength": 64},
            "additionalProperties": {"type": "string", "maxLength": 512},
        },
        {"type": "null"},
    ]
}

_RESPONSE_FIELDS: dict[str, Any] = {
    "model": {"type": ["string", "null"], "description": 'The loaded model\'s id, or "default".'},
    "input": _INPUT,
    "instructions": {"type": ["string", "null"]},
    "previous_response_id": {"type": ["string", "null"]},
    "conversation": {
        "anyOf": [
            {"type": "string"},
            {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
            {"type": "null"},
        ]
    },
    "tools": {"type": "array", "items": _FUNCTION_TOOL, "maxItems": 128},
    "tool_choice": _TOOL_CHOICE,
    "parallel_tool_calls": {"type": "boolean"},
    "max_output_tokens": {"type": ["integer", "null"], "minimum": 1, "maximum": 32768},
    "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
    "top_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
    "metadata": _METADATA,
    "store": {"type": "boolean", "default": True},
    "stream": {"type": "boolean", "default": False},
    "text": {
        "type": "object",
        "properties": {
            "format": {"type": "object", "properties": {"type": _const("text")}, "required": ["type"]},
            "verbosity": {"type": "string", "enum": ["low", "medium", "high"]},
        },
    },
    "truncation": {"type": "string", "enum": ["auto", "disabled"]},
    "reasoning": {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "effort": {"type": "string", "enum": ["none", "low", "medium", "high", "xhigh"]},
                    "summary": {"type": "string", "enum": ["auto", "concise", "detailed"]},
                },
            },
            {"type": "null"},
        ]
    },
    "include": {"type": "array", "items": {"type": "string"}},
    "prompt_cache_key": {"type": "string"},
    "user": {"type": "string"},
}


_RESPONSE_RESOURCE = {
    "type": "object",
    "title": "ResponseResource",
    "description": "The Open Responses `ResponseResource` (see docs/responses-api.md, Output).",
    "required": ["id", "object", "status", "output"],
    "properties": {
        "id": {"type": "string"},
        "object": _const("response"),
        "status": {
            "type": "string",
            "enum": ["completed", "incomplete", "failed", "cancelled", "in_progress"],
        },
        "output": {"type": "array", "items": {"type": "object"}},
    },
}
_CONVERSATION = {
    "type": "object",
    "title": "Conversation",
    "required": ["id", "object", "created_at"],
    "properties": {
        "id": {"type": "string"},
        "object": _const("conversation"),
        "created_at": {"type": "integer"},
        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}


def _body(
    schema: dict[str, Any], links: dict[str, Any] | None = None, answer: dict[str, Any] | None = None
) -> dict[str, Any]:
    extra: dict[str, Any] = {
        "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}
    }
    if links or answer:
        ok: dict[str, Any] = {"description": "Successful Response"}
        if answer:
            ok["content"] = answer
        if links:
            ok["links"] = links
        extra["responses"] = {"200": ok}
    return extra


def _links(parameter: str, operations: dict[str, str]) -> dict[str, Any]:
    """OpenAPI links from a created object's `id` to the operations taking it as `parameter`."""
    return {
        name: {"operationId": operation_id, "parameters": {parameter: "$response.body#/id"}}
        for name, operation_id in operations.items()
    }


# operationIds of the routes the links point at (set on the routes themselves).
RETRIEVE_RESPONSE = "retrieveResponse"
DELETE_RESPONSE = "deleteResponse"
LIST_INPUT_ITEMS = "listInputItems"
CANCEL_RESPONSE = "cancelResponse"
RETRIEVE_CONVERSATION = "retrieveConversation"
DELETE_CONVERSATION = "deleteConversation"
LIST_CONVERSATION_ITEMS = "listConversationItems"
ADD_CONVERSATION_ITEMS = "addConversationItems"

CREATE_RESPONSE_BODY = _body(
    {
        "type": "object",
        "title": "CreateResponseBody",
        "required": ["input"],
        "properties": _RESPONSE_FIELDS,
        "additionalProperties": True,
    },
    _links(
        "response_id",
        {
            "GetResponse": RETRIEVE_RESPONSE,
            "DeleteResponse": DELETE_RESPONSE,
            "ListInputItems": LIST_INPUT_ITEMS,
            "CancelResponse": CANCEL_RESPONSE,
        },
    ),
    {
        "application/json": {"schema": _RESPONSE_RESOURCE},
        "text/event-stream": {"schema": {"type": "string", "description": "with `stream: true`"}},
    },
)

INPUT_TOKENS_BODY = _body(
    {
        "type": "object",
        "title": "InputTokensBody",
        "required": ["input"],
        "properties": {
            key: _RESPONSE_FIELDS[key]
            for key in ("model", "input", "instructions", "previous_response_id", "conversation", "tools")
        },
        "additionalProperties": True,
    }
)

CREATE_CONVERSATION_BODY = _body(
    {
        "type": "object",
        "title": "CreateConversationBody",
        "properties": {"items": _ITEMS, "metadata": _METADATA},
    },
    _links(
        "conversation_id",
        {
            "GetConversation": RETRIEVE_CONVERSATION,
            "DeleteConversation": DELETE_CONVERSATION,
            "ListConversationItems": LIST_CONVERSATION_ITEMS,
            "AddConversationItems": ADD_CONVERSATION_ITEMS,
        },
    ),
    {"application/json": {"schema": _CONVERSATION}},
)

ADD_CONVERSATION_ITEMS_BODY = _body(
    {
        "type": "object",
        "title": "AddConversationItemsBody",
        "required": ["items"],
        "properties": {"items": {**_ITEMS, "minItems": 1}},
    }
)

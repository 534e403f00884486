"""Request-body schemas for the OpenAPI document.

The routes read their JSON bodies themselves (the translation validates them and names the
exact JSON path of a bad field), so these schemas only document the accepted shape.
"""

from __future__ import annotations

from typing import Any

_INPUT = {
    "description": "A string (one user message) or an array of input items; see docs/responses-api.md.",
    "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}],
}

_RESPONSE_FIELDS: dict[str, Any] = {
    "model": {"type": "string", "description": 'The loaded model\'s id, or "default".'},
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
    "tools": {"type": "array", "items": {"type": "object"}},
    "tool_choice": {"anyOf": [{"type": "string", "enum": ["none", "auto", "required"]}, {"type": "object"}]},
    "parallel_tool_calls": {"type": "boolean"},
    "max_output_tokens": {"type": ["integer", "null"], "minimum": 1},
    "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
    "top_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
    "metadata": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
    "store": {"type": "boolean", "default": True},
    "stream": {"type": "boolean", "default": False},
    "text": {"type": "object"},
    "truncation": {"type": "string", "enum": ["auto", "disabled"]},
    "reasoning": {"type": ["object", "null"]},
    "include": {"type": "array", "items": {"type": "string"}},
    "prompt_cache_key": {"type": "string"},
}


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


CREATE_RESPONSE_BODY = _body(
    {
        "type": "object",
        "title": "CreateResponseBody",
        "required": ["input"],
        "properties": _RESPONSE_FIELDS,
        "additionalProperties": True,
    }
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
        "properties": {
            "items": {"type": "array", "items": {"type": "object"}},
            "metadata": _RESPONSE_FIELDS["metadata"],
        },
    }
)

ADD_CONVERSATION_ITEMS_BODY = _body(
    {
        "type": "object",
        "title": "AddConversationItemsBody",
        "required": ["items"],
        "properties": {"items": {"type": "array", "items": {"type": "object"}}},
    }
)

"""The Messages -> Responses translation (`vlmserve.anthropic`), as tables of cases: the Responses
body each Anthropic request becomes (the error names: test_anthropic_paths.py), and the message and
stream events a finished response becomes. Pure: no facade, no engine."""

from __future__ import annotations

from typing import Any

import pytest

from vlmserve.anthropic import EventWriter, anthropic_message, error_body, messages_request
from vlmserve.anthropic._errors import anthropic_status
from vlmserve.anthropic._to_responses import MessagesRequest
from vlmserve.responses import InvalidRequestError, ResponseResource, build_generate_request

USER = {"role": "user", "content": "Hi"}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "default", "max_tokens": 8, "messages": [USER], **fields}


ITEMS: list[tuple[str, list[Any], list[Any]]] = [
    (
        "string content",
        [USER],
        [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
    ),
    (
        "tool use and an image result, then text in the same user turn",
        [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {"a": 1}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "image", "source": {"type": "url", "url": "https://x/i.png"}}],
                    },
                    {"type": "text", "text": "Colour?"},
                ],
            },
        ],
        [
            {"type": "function_call", "call_id": "t1", "name": "shot", "arguments": '{"a": 1}'},
            {
                "type": "function_call_output",
                "call_id": "t1",
                "output": [{"type": "input_image", "image_url": "https://x/i.png", "detail": "auto"}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Colour?"}]},
        ],
    ),
    (
        "error result",
        [
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t", "content": "no", "is_error": True}],
            }
        ],
        [{"type": "function_call_output", "call_id": "t", "output": "[tool error]\nno"}],
    ),
    (
        "thinking, redacted thinking and text",
        [
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "redacted_thinking", "data": "enc"},
                    {"type": "text", "text": "ok"},
                ],
            }
        ],
        [
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
            {"type": "reasoning", "summary": [], "encrypted_content": "enc"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        ],
    ),
    (
        "a system message mid-conversation",
        [USER, {"role": "system", "content": [{"type": "text", "text": "Be brief."}]}],
        [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "Be brief."}]},
        ],
    ),
]


@pytest.mark.parametrize(("name", "messages", "items"), ITEMS, ids=[case[0] for case in ITEMS])
def test_input_items(name: str, messages: list[Any], items: list[Any]) -> None:
    assert _as_json(messages_request(body(messages=messages)))["input"] == items


FIELDS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "tool_choice any, no parallel",
        {"tool_choice": {"type": "any", "disable_parallel_tool_use": True}},
        {"tool_choice": "required", "parallel_tool_calls": False},
    ),
    (
        "tool_choice tool",
        {"tool_choice": {"type": "tool", "name": "f"}},
        {"tool_choice": {"type": "function", "name": "f"}},
    ),
    ("tool_choice none", {"tool_choice": {"type": "none"}}, {"tool_choice": "none"}),
    (
        "custom tool",
        {
            "tools": [
                {
                    "name": "f",
                    "description": "d",
                    "input_schema": {"type": "object"},
                    "cache_control": {"type": "ephemeral"},
                }
            ]
        },
        {
            "tools": [
                {
                    "type": "function",
                    "name": "f",
                    "description": "d",
                    "parameters": {"type": "object"},
                    "strict": None,
                }
            ]
        },
    ),
    (
        "structured output",
        {"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
        {
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": "output",
                    "schema": {"type": "object"},
                    "strict": True,
                }
            }
        },
    ),
    (
        "sampling",
        {"temperature": 0.2, "top_p": 0.5},
        {"temperature": 0.2, "top_p": 0.5, "max_output_tokens": 8},
    ),
]


@pytest.mark.parametrize(("name", "fields", "expected"), FIELDS, ids=[case[0] for case in FIELDS])
def test_body_fields(name: str, fields: dict[str, Any], expected: dict[str, Any]) -> None:
    translated = _as_json(messages_request(body(**fields)))
    assert {key: translated[key] for key in expected} == expected


def test_the_engine_request_has_what_responses_cannot_say() -> None:
    translated = messages_request(
        body(
            stop_sequences=["X"],
            top_k=5,
            thinking={"type": "enabled", "budget_tokens": 1024},
            max_tokens=2048,
        )
    )
    request = build_generate_request(translated.request).request
    assert (list(request.sampling.stop), request.sampling.top_k, request.enable_thinking) == (["X"], 5, True)


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0].type"),
        (
            {"messages": [{"role": "user", "content": [{"type": "server_tool_use"}]}]},
            "messages[0].content[0].type",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"container": "c"}, "container"),
    ],
)
def test_refusals_name_the_field(change: dict[str, Any], param: str) -> None:
    raw = {key: value for key, value in body(**change).items() if value is not None}
    with pytest.raises(InvalidRequestError) as raised:
        messages_request(raw)
    assert raised.value.param == param


@pytest.mark.parametrize(
    ("status", "code", "shaped", "kind"),
    [
        (400, "invalid_value", 400, "invalid_request_error"),
        (401, "invalid_api_key", 401, "authentication_error"),
        (404, "model_not_found", 404, "not_found_error"),
        (413, "request_too_large", 413, "request_too_large"),
        (503, "engine_overloaded", 529, "overloaded_error"),
        (503, "engine_unavailable", 503, "api_error"),
        (504, "engine_timeout", 504, "timeout_error"),
    ],
)
def test_error_types_and_statuses(status: int, code: str, shaped: int, kind: str) -> None:
    assert anthropic_status(status, code) == shaped
    assert error_body(status, code, "m") == {"type": "error", "error": {"type": kind, "message": "m"}}


def _resource(output: list[Any], **fields: Any) -> ResponseResource:
    usage = {
        "input_tokens": 10,
        "output_tokens": 4,
        "total_tokens": 14,
        "input_tokens_details": {"cached_tokens": 3},
    }
    raw = {
        "id": "resp_abc",
        "object": "response",
        "created_at": 1,
        "status": "completed",
        "model": "m",
        "output": output,
        "usage": usage,
        "tools": [],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        **fields,
    }
    return ResponseResource.model_validate(raw)


def test_a_message_from_a_response() -> None:
    call = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "c1",
        "name": "f",
        "arguments": '{"a": 1}',
        "status": "completed",
    }
    text = {
        "type": "message",
        "id": "m1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "hi", "annotations": [], "logprobs": []}],
    }
    message = anthropic_message(_resource([text, call])).to_json()
    assert message["id"] == "msg_abc" and message["stop_reason"] == "tool_use"
    assert message["content"] == [
        {"type": "text", "text": "hi"},
        {"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}},
    ]
    assert message["usage"] == {
        "input_tokens": 7,
        "output_tokens": 4,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 3,
        "service_tier": "standard",
    }
    stopped = anthropic_message(_resource([text]), stop_sequence="END").to_json()
    assert (stopped["stop_reason"], stopped["stop_sequence"]) == ("stop_sequence", "END")
    last = EventWriter("resp_abc", "m").last(_resource([text]))
    assert [kind for kind, _ in last] == ["message_delta", "message_stop"]
    assert last[0][1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}


def _as_json(translated: MessagesRequest) -> dict[str, Any]:
    """The typed Responses body as the JSON it stands for (the fields the translation set)."""
    body = translated.request.body
    return body.model_dump(mode="json", by_alias=True, exclude_unset=True, serialize_as_any=True)

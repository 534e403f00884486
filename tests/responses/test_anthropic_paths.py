"""Anthropic Messages -> the Responses body: the path map the translation writes, one row per
field kind, and the shared translation's errors renamed through it. An Anthropic block has no
inner fields of the Responses part it becomes (`detail`, `call_id`), so those name the block."""

from __future__ import annotations

from typing import Any

import pytest

from vlmserve.anthropic import messages_request
from vlmserve.responses import InvalidRequestError, build_generate_request
from vlmserve.responses._paths import PathMap

IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "eA=="}}
PDF = {"type": "base64", "media_type": "application/pdf", "data": "eA=="}
DOCUMENT = {"type": "document", "title": "T", "context": "about T", "source": PDF}
INLINE_DOCUMENT = {
    "type": "document",
    "title": "T",
    "source": {"type": "content", "content": [{"type": "text", "text": "a"}, IMAGE]},
}
USE = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
FAILED_RESULT = {
    "type": "tool_result",
    "tool_use_id": "t1",
    "is_error": True,
    "content": [{"type": "text", "text": "r"}, IMAGE],
}
THINKING = {"type": "thinking", "thinking": "h", "signature": "s"}
MESSAGES: list[Any] = [
    {"role": "user", "content": [{"type": "text", "text": "hi"}, IMAGE, DOCUMENT, INLINE_DOCUMENT]},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "h", "signature": "s"},
            {"type": "text", "text": "ok"},
            USE,
        ],
    },
    {
        "role": "user",
        "content": [
            FAILED_RESULT,
            {"type": "text", "text": "more"},
            {"type": "tool_result", "tool_use_id": "t1", "content": "plain"},
        ],
    },
    {"role": "user", "content": "last"},
]
BODY = {
    "model": "m",
    "max_tokens": 8,
    "system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
    "messages": MESSAGES,
    "tools": [{"name": "f", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
}

# (Responses path the shared translation names, the Anthropic path it came from)
PATHS = [
    ("input", "messages"),
    ("input[10]", "messages"),  # past the last item: the list
    ("input[0]", "system"),
    ("input[0].content[1]", "system[1]"),
    ("input[1]", "messages[0]"),
    ("input[1].role", "messages[0]"),
    ("input[1].content[0].text", "messages[0].content[0]"),
    ("input[1].content[1].image_url", "messages[0].content[1].source"),
    ("input[1].content[1].detail", "messages[0].content[1]"),
    ("input[1].content[2]", "messages[0].content[2].context"),  # a document's context is its own part
    ("input[1].content[3].file_data", "messages[0].content[2].source.data"),
    ("input[1].content[3].file_id", "messages[0].content[2].source.file_id"),
    ("input[1].content[3].file_url", "messages[0].content[2].source.url"),
    ("input[1].content[4]", "messages[0].content[3].title"),
    ("input[1].content[6].image_url", "messages[0].content[3].source.content[1].source"),
    ("input[1].content[9]", "messages[0]"),  # past the last part: the message
    ("input[2]", "messages[1].content[0]"),  # thinking -> a reasoning item
    ("input[3].content[0]", "messages[1].content[1]"),
    ("input[4].arguments", "messages[1].content[2].input"),
    ("input[4].call_id", "messages[1].content[2]"),
    ("input[5].output[0]", "messages[2].content[0].is_error"),
    ("input[5].output[2].image_url", "messages[2].content[0].content[1].source"),
    ("input[6].content[0]", "messages[2].content[1]"),
    ("input[7].output", "messages[2].content[2]"),
    ("input[8].content[0]", "messages[3].content"),
    ("tools[0].parameters.properties", "tools[0].input_schema.properties"),
    ("tools[0].name", "tools[0].name"),
    ("text.format.schema", "output_format.schema"),
    ("max_output_tokens", "max_tokens"),
    ("parallel_tool_calls", "tool_choice.disable_parallel_tool_use"),
    ("stop", "stop_sequences"),
    ("instructions", "system"),
    ("temperature", "temperature"),
]


@pytest.mark.parametrize(("responses_path", "anthropic_path"), PATHS)
def test_each_responses_path_names_its_anthropic_field(responses_path: str, anthropic_path: str) -> None:
    assert messages_request(BODY).anthropic_param(responses_path) == anthropic_path


def test_a_string_system_prompt_is_one_part() -> None:
    translated = messages_request({**BODY, "system": "be brief"})
    assert [translated.anthropic_param(f"input[0].content[{i}]") for i in (0, 1)] == ["system", "system"]


@pytest.mark.parametrize(
    ("extends", "path", "expected"),
    [(True, "a[0].b.c", "x.b.c"), (False, "a[0].b.c", "x"), (False, "a[0]", "x")],
)
def test_an_entry_that_does_not_extend_names_its_origin_for_every_path_below(
    extends: bool, path: str, expected: str
) -> None:
    paths = PathMap()
    paths.add("a[0]", "x", extends=extends)
    assert paths.origin(path) == expected


def test_a_bad_image_in_a_tool_result_is_renamed_in_param_and_message() -> None:
    bad = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "!!"}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "r"}, bad]}
    translated = messages_request(
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [{"role": "assistant", "content": [USE]}, {"role": "user", "content": [result]}],
        }
    )
    with pytest.raises(InvalidRequestError) as caught:
        build_generate_request(translated.request)
    error = caught.value.renamed(translated.anthropic_param)
    assert error.param == "messages[1].content[0].content[1].source"
    assert "'messages[1].content[0].content[1].source'" in error.message
    assert "input" not in error.message


def _bad_data(block_type: str, media_type: str) -> dict[str, Any]:
    return {"type": block_type, "source": {"type": "base64", "media_type": media_type, "data": 5}}


# (case, Messages body fields, the path the message names: the Anthropic field as sent, with
# none of the union members the validation chose on the way)
VALIDATION_PATHS = [
    (
        "text block",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
        "messages[0].content[0].text",
    ),
    (
        "image source",
        {"messages": [{"role": "user", "content": [_bad_data("image", "image/png")]}]},
        "messages[0].content[0].source.data",
    ),
    (
        "document in a tool result",
        {
            "messages": [
                {"role": "assistant", "content": [USE]},
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [_bad_data("document", "application/pdf")],
                        }
                    ],
                },
            ]
        },
        "messages[1].content[0].content[0].source.data",
    ),
    ("named tool choice", {"tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ("thinking budget", {"thinking": {"type": "enabled", "budget_tokens": "x"}}, "thinking.budget_tokens"),
]


@pytest.mark.parametrize(
    ("case", "fields", "path"), VALIDATION_PATHS, ids=[row[0] for row in VALIDATION_PATHS]
)
def test_a_validation_error_names_the_field_as_sent(case: str, fields: dict[str, Any], path: str) -> None:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], **fields}
    with pytest.raises(InvalidRequestError) as caught:
        messages_request(body)
    assert caught.value.param == path
    assert f"'{path}'" in caught.value.message

"""Chat completions -> the Responses body: the path map the translation writes, one row per field
kind, and the shared translation's errors renamed through it (param and quoted paths alike)."""

from __future__ import annotations

from typing import Any

import pytest

from vlmserve.chat import chat_request
from vlmserve.responses import InvalidRequestError, build_generate_request
from vlmserve.responses._paths import PathMap, translated_body

CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
MESSAGES: list[Any] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "file", "file": {"file_id": "f1"}}]},
    {"role": "assistant", "reasoning_content": "hm", "content": "calling", "tool_calls": [CALL, CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "ok"}]},
    {"role": "tool", "tool_call_id": "c1", "content": "plain"},
]

# (Responses path the shared translation names, the chat path it came from)
PATHS = [
    ("input", "messages"),
    ("input[0]", "messages[0]"),
    ("input[0].content[0]", "messages[0].content"),  # a string content is one part
    ("input[1].content[0]", "messages[1].content[0]"),
    ("input[1].content[1].file_id", "messages[1].content[1].file.file_id"),
    ("input[1].content[1].file_data", "messages[1].content[1].file.file_data"),
    ("input[1].content[1].detail", "messages[1].content[1].detail"),
    ("input[2]", "messages[2].reasoning_content"),
    ("input[3]", "messages[2]"),
    ("input[3].content[0]", "messages[2].content"),
    ("input[4]", "messages[2].tool_calls[0]"),
    ("input[5].arguments", "messages[2].tool_calls[1].function.arguments"),
    ("input[5].name", "messages[2].tool_calls[1].function.name"),
    ("input[5].call_id", "messages[2].tool_calls[1].id"),
    ("input[6].output[0]", "messages[3].content[0]"),
    ("input[6].output[0].text", "messages[3].content[0].text"),
    ("input[6].call_id", "messages[3].tool_call_id"),
    ("input[7].output", "messages[4].content"),
    ("tools[0].parameters.properties", "tools[0].function.parameters.properties"),
    ("tools[0].type", "tools[0].type"),
    ("tool_choice.name", "tool_choice.function.name"),
    ("text.format.schema", "response_format.json_schema.schema"),
    ("text.format", "response_format"),
    ("max_output_tokens", "max_tokens"),
    ("reasoning.effort", "reasoning_effort"),
    ("temperature", "temperature"),
]


@pytest.mark.parametrize(("responses_path", "chat_path"), PATHS)
def test_each_responses_path_names_its_chat_field(responses_path: str, chat_path: str) -> None:
    chat = chat_request({"model": "m", "messages": MESSAGES, "tools": [TOOL], "max_tokens": 5})
    assert chat.chat_param(responses_path) == chat_path


def test_max_completion_tokens_is_named_when_that_was_sent() -> None:
    chat = chat_request({"model": "m", "messages": MESSAGES, "max_completion_tokens": 5})
    assert chat.chat_param("max_output_tokens") == "max_completion_tokens"


@pytest.mark.parametrize(
    ("recorded", "path", "expected"),
    [
        ({"a": "x"}, "a", "x"),
        ({"a": "x"}, "a.b[2].c", "x.b[2].c"),
        ({"a": "x", "a[1]": "y"}, "a[1].c", "y.c"),
        ({"a[1]": "y"}, "a[10]", None),  # an index is a whole component, not a prefix
        ({}, "a", None),
    ],
)
def test_path_map_uses_the_nearest_recorded_ancestor(
    recorded: dict[str, str], path: str, expected: str | None
) -> None:
    paths = PathMap()
    for key, origin in recorded.items():
        paths.add(key, origin)
    assert paths.origin(path) == expected


def _translation_error(messages: list[Any]) -> InvalidRequestError:
    # Refused as the typed body is made (already renamed) or by the shared translation.
    chat = None
    with pytest.raises(InvalidRequestError) as caught:
        chat = chat_request({"model": "m", "messages": messages})
        build_generate_request(chat.request)
    return caught.value if chat is None else caught.value.renamed(chat.chat_param)


def test_every_path_a_message_quotes_is_renamed() -> None:
    error = _translation_error(
        [{"role": "user", "content": [{"type": "file", "file": {"filename": "a.pdf"}}]}]
    )
    assert error.param == "messages[0].content[0].file.file_id"
    assert error.message == (
        "Missing required parameter: 'messages[0].content[0].file.file_id' or "
        "'messages[0].content[0].file.file_data'."
    )


def test_a_bad_image_in_a_tool_message_names_the_tool_message_content() -> None:
    bad = {"type": "image_url", "image_url": {"url": "data:,"}}
    error = _translation_error(
        [
            {"role": "user", "content": "x"},
            {"role": "assistant", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "t"}, bad]},
        ]
    )
    assert error.param is not None and error.param.startswith("messages[2].content[1]")
    assert "input" not in error.message


IMAGE = {"type": "image_url", "image_url": {"url": "data:,"}}
CALLED = {"role": "assistant", "tool_calls": [CALL]}
SECOND_TOOL = {"type": "function", "function": {"name": "g", "parameters": {"type": "object"}}}

# (case, chat body fields, the param the client is told: the chat field at its own depth)
ERROR_PATHS = [
    (
        "image url in a user message",
        {
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "user", "content": [{"type": "text", "text": "x"}, IMAGE]},
            ]
        },
        "messages[1].content[1].image_url.url",
    ),
    (
        "image url in a system message",
        {"messages": [{"role": "system", "content": [IMAGE]}, {"role": "user", "content": "x"}]},
        "messages[0].content[0].image_url.url",
    ),
    (
        "image url in a tool message",
        {
            "messages": [
                {"role": "user", "content": "x"},
                CALLED,
                {"role": "tool", "tool_call_id": "c1", "content": [IMAGE]},
            ]
        },
        "messages[2].content[0].image_url.url",
    ),
    (
        "image detail",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "data:,", "detail": "huge"}}],
                }
            ]
        },
        "messages[0].content[0].image_url.detail",
    ),
    (
        "file without id or data",
        {"messages": [{"role": "user", "content": [{"type": "file", "file": {"filename": "a.pdf"}}]}]},
        "messages[0].content[0].file.file_id",
    ),
    (
        "tool parameters",
        {
            "messages": [{"role": "user", "content": "x"}],
            "tools": [TOOL, {"type": "function", "function": {"name": "g", "parameters": "x"}}],
        },
        "tools[1].function.parameters",
    ),
    (
        "tool function",
        {"messages": [{"role": "user", "content": "x"}], "tools": [TOOL, SECOND_TOOL, {"type": "function"}]},
        "tools[2].function",
    ),
    (
        "json schema name",
        {
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "bad name!", "schema": {"type": "object"}},
            },
        },
        "response_format.json_schema.name",
    ),
    (
        "json schema missing",
        {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}},
        "response_format.json_schema",
    ),
]


@pytest.mark.parametrize(("case", "fields", "param"), ERROR_PATHS, ids=[row[0] for row in ERROR_PATHS])
def test_an_error_names_the_chat_field_at_its_depth(case: str, fields: dict[str, Any], param: str) -> None:
    # Refused by the chat translation itself, or by the shared Responses translation and renamed
    # through the path map: either way the client reads its own field, never a Responses one.
    with pytest.raises(InvalidRequestError) as caught:
        chat = chat_request({"model": "m", **fields})
        try:
            build_generate_request(chat.request)
        except InvalidRequestError as error:
            raise error.renamed(chat.chat_param) from None
    assert caught.value.param == param, caught.value.message
    assert f"'{param}'" in caught.value.message
    assert "input" not in caught.value.message and "text.format" not in caught.value.message


def test_the_typed_body_is_translated_without_a_second_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    from vlmserve.responses import _create_request

    messages = [{"role": "user", "content": [{"type": "text", "text": "x"}]}]
    chat = chat_request({"model": "m", "messages": messages, "tools": [TOOL]})

    def parse_again(body: object) -> Any:
        raise AssertionError("the typed body was parsed again")

    monkeypatch.setattr(_create_request, "parse_body", parse_again)
    translated = build_generate_request(chat.request)
    # What is kept for storage is the JSON the typed input stands for (only the fields set).
    assert translated.input_items == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]}
    ]
    assert [tool["name"] for tool in translated.echo.to_json()["tools"]] == ["f"]


def test_the_typed_body_refuses_a_bad_field_under_the_other_apis_name() -> None:
    paths = PathMap()
    paths.add("input", "messages")
    paths.add("input[0].content[0].detail", "messages[0].content[0].image_url.detail")
    image = {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "huge"}
    fields = {"model": "m", "input": [{"type": "message", "role": "user", "content": [image]}]}
    with pytest.raises(InvalidRequestError) as caught:
        translated_body(fields, paths)
    assert caught.value.param == "messages[0].content[0].image_url.detail"
    assert caught.value.message.startswith("Invalid value for 'messages[0].content[0].image_url.detail'")

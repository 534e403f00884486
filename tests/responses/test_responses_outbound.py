"""Contract -> Responses JSON (docs/responses-api.md, "Output", going back out): tool-result images
survive, in order, with detail."""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Callable
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from tests._openresponses import assert_valid, spec
from tests.responses.responses_testkit import (
    BLUE,
    GREEN,
    GREEN_URL,
    RED,
    RED_URL,
    function_call,
    function_output,
    image_part,
    input_image,
    input_text,
    json_part,
    message,
    text_part,
)
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.responses import (
    build_generate_request,
    input_to_messages,
    messages_to_items,
    result_to_output_items,
    usage_from_contract,
)


def tool(parts: list[pb.Part], kind: pb.ToolKind.ValueType = pb.TOOL_KIND_FUNCTION) -> pb.Message:
    output = pb.ToolOutput(call_id="call_1", kind=kind, parts=pb.PartList(parts=parts))
    return pb.Message(role=pb.ROLE_TOOL, tool_output=output)


def decoded(part: dict[str, Any]) -> bytes:
    header, _, payload = part["image_url"].partition(",")
    assert header == "data:image/png;base64"
    return base64.b64decode(payload)


def test_image_only_tool_result_keeps_its_image() -> None:
    [item] = messages_to_items([tool([image_part(RED)])])
    assert item["type"] == "function_call_output"
    assert item["output"] != ""
    [part] = item["output"]
    assert part["type"] == "input_image"
    assert part["detail"] == "auto"
    assert decoded(part) == RED


def test_image_and_unsupported_parts_keep_order() -> None:
    parts = [
        text_part("a"),
        image_part(RED, pb.IMAGE_DETAIL_HIGH),
        json_part('{"type": "input_audio", "x": 1}'),
        image_part(GREEN),
    ]
    [item] = messages_to_items([tool(parts)])
    output = item["output"]
    assert [p["type"] for p in output] == ["input_text", "input_image", "input_audio", "input_image"]
    assert [decoded(p) for p in output if p["type"] == "input_image"] == [RED, GREEN]
    assert [p["detail"] for p in output if p["type"] == "input_image"] == ["high", "auto"]
    assert output[2] == {"type": "input_audio", "x": 1}


def test_custom_tool_output_with_image_has_detail() -> None:
    [item] = messages_to_items(
        [tool([text_part("patched"), image_part(BLUE, pb.IMAGE_DETAIL_UNSPECIFIED)], pb.TOOL_KIND_CUSTOM)]
    )
    assert item["type"] == "custom_tool_call_output"
    assert item["output"][0] == {"type": "input_text", "text": "patched"}
    assert item["output"][1]["detail"] == "auto"  # required on InputImageContent
    assert decoded(item["output"][1]) == BLUE


def test_string_tool_output_stays_a_string() -> None:
    message_ = pb.Message(role=pb.ROLE_TOOL, tool_output=pb.ToolOutput(call_id="c", text="plain"))
    assert messages_to_items([message_]) == [
        {"type": "function_call_output", "call_id": "c", "output": "plain"}
    ]


ROUND_TRIPS: list[tuple[str, list[dict[str, Any]]]] = [
    ("text", [message("user", "hi")]),
    ("user image", [message("user", [input_text("a"), input_image(RED_URL, "low")])]),
    ("system and developer", [message("system", "s"), message("developer", [input_text("d")])]),
    (
        "assistant text and calls",
        [
            message("user", "q"),
            message("assistant", [{"type": "output_text", "text": "x"}]),
            function_call("a"),
            function_call("b", "g"),
        ],
    ),
    (
        "tool output with image",
        [function_call(), function_output([input_text("captured"), input_image(GREEN_URL, "high")])],
    ),
    ("image-only tool output", [function_call(), function_output([input_image(RED_URL)])]),
    (
        "unknown tool output part",
        [function_call(), function_output([{"type": "foo", "v": [1]}, input_image(RED_URL)])],
    ),
    (
        "custom tool",
        [
            {"type": "custom_tool_call", "call_id": "p", "name": "patch", "input": "diff"},
            {"type": "custom_tool_call_output", "call_id": "p", "output": [input_image(RED_URL)]},
        ],
    ),
]


@pytest.mark.parametrize(("case", "items"), ROUND_TRIPS, ids=[row[0] for row in ROUND_TRIPS])
def test_items_round_trip_through_the_contract(case: str, items: list[dict[str, Any]]) -> None:
    messages = input_to_messages(items)
    assert input_to_messages(messages_to_items(messages)) == messages


def test_every_image_in_items_has_detail() -> None:
    items = messages_to_items(
        input_to_messages(
            [
                message("user", [input_image(RED_URL)]),
                function_call(),
                function_output([input_image(RED_URL)]),
            ]
        )
    )
    images = [
        part
        for item in items
        for part in (item.get("content") or item.get("output") or [])
        if part["type"] == "input_image"
    ]
    assert len(images) == 2
    assert all(part["detail"] == "auto" for part in images)


def output_items(result: pb.GenerateResult, **kwargs: Any) -> list[dict[str, Any]]:
    """The output items as the JSON the server sends."""
    return [item.to_json() for item in result_to_output_items(result, **kwargs)]


def ids() -> Callable[[str], str]:
    counter = itertools.count()
    return lambda prefix: f"{prefix}_{next(counter)}"


def test_result_text_becomes_a_message_item() -> None:
    result = pb.GenerateResult(text="It is red.", finish_reason=pb.FINISH_REASON_STOP)
    assert output_items(result, new_id=ids()) == [
        {
            "type": "message",
            "id": "msg_0",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "It is red.", "annotations": [], "logprobs": []}],
        }
    ]


def test_length_stop_marks_the_message_incomplete() -> None:
    result = pb.GenerateResult(text="It is", finish_reason=pb.FINISH_REASON_LENGTH)
    [item] = output_items(result, new_id=ids())
    assert item["status"] == "incomplete"


def test_tool_calls_become_function_call_items_after_the_text() -> None:
    result = pb.GenerateResult(
        text="Let me look.",
        tool_calls=[
            pb.ToolCall(id="call_a", name="view_image", arguments='{"path": "a.png"}'),
            pb.ToolCall(name="ls", arguments="{}"),
        ],
        finish_reason=pb.FINISH_REASON_TOOL_CALLS,
    )
    message_item, first, second = output_items(result, new_id=ids())
    assert message_item["type"] == "message"
    assert first == {
        "id": "fc_1",
        "type": "function_call",
        "call_id": "call_a",
        "name": "view_image",
        "arguments": '{"path": "a.png"}',
        "status": "completed",
    }
    assert second["call_id"] == "call_3"  # made when the engine gave none
    assert second["name"] == "ls"


def test_only_tool_calls_means_no_empty_message() -> None:
    result = pb.GenerateResult(tool_calls=[pb.ToolCall(id="c", name="f", arguments="{}")])
    assert [item["type"] for item in output_items(result, new_id=ids())] == ["function_call"]


def test_calls_go_back_out_under_the_clients_names() -> None:
    translated = build_generate_request(
        {
            "input": "go",
            "tools": [
                {
                    "type": "namespace",
                    "name": "agents",
                    "description": "",
                    "tools": [{"type": "function", "name": "spawn"}],
                },
                {"type": "custom", "name": "apply_patch"},
            ],
        }
    )
    result = pb.GenerateResult(
        tool_calls=[
            pb.ToolCall(id="c1", name="spawn", arguments="{}"),
            pb.ToolCall(id="c2", name="apply_patch", arguments=json.dumps({"input": "*** Begin Patch"})),
        ]
    )
    spawn, patch = output_items(result, new_id=ids(), offered_tools=translated.tools.offered)
    assert (spawn["type"], spawn["name"], spawn["namespace"]) == ("function_call", "spawn", "agents")
    assert (patch["type"], patch["name"], patch["input"], patch["call_id"]) == (
        "custom_tool_call",
        "apply_patch",
        "*** Begin Patch",
        "c2",
    )


def test_usage_from_contract() -> None:
    usage = pb.Usage(input_tokens=10, output_tokens=5, cached_tokens=4, image_count=1)
    assert usage_from_contract(usage).to_json() == {
        "input_tokens": 10,
        "output_tokens": 5,
        "total_tokens": 15,
        "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }


def test_output_items_validate_against_open_responses() -> None:
    result = pb.GenerateResult(text="hi", tool_calls=[pb.ToolCall(id="c", name="f", arguments="{}")])
    message_item, call_item = output_items(result, new_id=ids())
    assert_valid(message_item, "Message")
    assert_valid(call_item, "FunctionCall")
    assert_valid(usage_from_contract(pb.Usage(input_tokens=1)).to_json(), "Usage")


def test_tool_output_items_validate_against_open_responses() -> None:
    [item] = messages_to_items([tool([text_part("a"), image_part(RED)])])
    assert_valid(item, "FunctionCallOutputItemParam")
    assert_valid(item["output"][1], "InputImageContent")


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {
            "reasoning": {"summary": "auto"},
            "text": {"verbosity": "low"},
            "store": False,
            "tool_choice": "required",
        },
        {
            "reasoning": {"effort": "minimal"},
            "tool_choice": {"type": "function", "name": "f"},
            "temperature": 0,
        },
        {
            "tool_choice": {
                "type": "allowed_tools",
                "mode": "auto",
                "tools": [{"type": "function", "name": "f"}],
            }
        },
        {"metadata": {"k": "v"}, "max_output_tokens": 5, "instructions": "x", "previous_response_id": "r"},
    ],
)
def test_echo_fields_validate_against_response_resource(extra: dict[str, Any]) -> None:
    tools = [{"type": "function", "name": "f"}, {"type": "web_search"}, {"type": "custom", "name": "c"}]
    echo = build_generate_request({"input": "hi", "tools": tools, **extra}).echo.to_json()
    components = spec()["components"]
    properties = components["schemas"]["ResponseResource"]["properties"]
    for name, value in echo.items():
        jsonschema.validate(value, {**properties[name], "components": components})

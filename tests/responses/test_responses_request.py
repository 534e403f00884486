"""build_generate_request: a whole Responses body -> GenerateRequest + echo fields."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import pytest

from tests.responses.responses_testkit import (
    RED,
    RED_URL,
    function_call,
    function_output,
    images_of,
    input_image,
    input_text,
    message,
)
from vlmserve.engine.prep.lowering import IMAGE_FOLLOW_UP_MARKER, lower_messages
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.responses import IncludeValue, InvalidRequestError, build_generate_request, input_to_messages

CODEX_DATA = Path(__file__).resolve().parent.parent / "codex" / "data"


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "default", "input": "hi", **fields}


def fn(name: str, **extra: Any) -> dict[str, Any]:
    return {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}, **extra}


def test_a_screenshot_tool_request_reaches_the_engine_as_sent_and_renders_lowered() -> None:
    translated = build_generate_request(
        {
            "model": "q",
            "input": [
                message("user", [input_text("Take a screenshot and tell me its dominant color.")]),
                function_call("c1", "screenshot"),
                function_output([input_text("captured"), input_image(RED_URL)], "c1"),
            ],
            "tools": [fn("screenshot")],
        }
    )
    sent = translated.request.messages
    # The engine gets the conversation as sent (the screenshot inside the tool output) ...
    assert [m.role for m in sent] == [pb.ROLE_USER, pb.ROLE_ASSISTANT, pb.ROLE_TOOL]
    assert [p.image.data for p in sent[2].tool_output.parts.parts if p.HasField("image")] == [RED]
    # ... and lowers it where it renders the template.
    messages = lower_messages(sent)
    assert [m.role for m in messages] == [pb.ROLE_USER, pb.ROLE_ASSISTANT, pb.ROLE_TOOL, pb.ROLE_USER]
    assert messages[2].tool_output.text == f"captured\n{IMAGE_FOLLOW_UP_MARKER}"
    assert images_of(messages[3]) == [RED]
    assert [t.function.name for t in translated.request.tools] == ["screenshot"]


def test_sampling_fields_map() -> None:
    request = build_generate_request(body(max_output_tokens=64, temperature=0.5, top_p=0.9)).request
    assert request.sampling.max_tokens == 64
    assert request.sampling.temperature == pytest.approx(0.5)
    assert request.sampling.top_p == pytest.approx(0.9)


def test_unset_sampling_fields_stay_unset() -> None:
    sampling = build_generate_request(body()).request.sampling
    assert not sampling.HasField("max_tokens")
    assert not sampling.HasField("temperature")
    assert not sampling.HasField("top_p")


def test_defaults_and_echo_fields() -> None:
    translated = build_generate_request(body())
    echo = translated.echo.to_json()
    assert echo["tool_choice"] == "auto"
    assert echo["store"] is True
    assert echo["truncation"] == "disabled"
    assert echo["text"] == {"format": {"type": "text"}}
    assert echo["parallel_tool_calls"] is True
    assert echo["metadata"] == {}
    assert translated.stream is False
    assert not translated.request.HasField("parallel_tool_calls")


def test_instructions_lead_and_are_echoed() -> None:
    translated = build_generate_request(body(instructions="Be brief."))
    assert translated.request.messages[0] == pb.Message(
        role=pb.ROLE_SYSTEM, parts=[pb.Part(text=pb.TextPart(text="Be brief."))]
    )
    assert translated.echo.to_json()["instructions"] == "Be brief."


def test_string_input_is_stored_as_one_message_item() -> None:
    assert build_generate_request(body(input="hello")).input_items == [
        {"type": "message", "role": "user", "content": "hello"}
    ]


def test_function_tools_with_strict() -> None:
    params = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 10}}, "required": ["n"]}
    translated = build_generate_request(
        body(tools=[fn("count", strict=True, description="Count.", parameters=params)])
    )
    [tool] = translated.request.tools
    assert tool.function.name == "count"
    assert tool.function.description == "Count."
    assert tool.function.strict is True
    assert json.loads(tool.function.parameters_json) == params
    assert tool.function.parameters_json == json.dumps(params)  # key order kept


def test_namespace_tools_are_offered_like_top_level_ones() -> None:
    namespace = {
        "type": "namespace",
        "name": "agents",
        "description": "Sub-agents.",
        "tools": [fn("spawn"), fn("wait")],
    }
    translated = build_generate_request(body(tools=[fn("exec"), namespace]))
    assert [t.function.name for t in translated.request.tools] == ["exec", "spawn", "wait"]
    assert translated.tools.offered["spawn"].namespace == "agents"


def test_colliding_namespaced_names_are_qualified() -> None:
    ns_a = {"type": "namespace", "name": "a", "description": "", "tools": [fn("search")]}
    ns_b = {"type": "namespace", "name": "b", "description": "", "tools": [fn("search")]}
    translated = build_generate_request(body(tools=[ns_a, ns_b]))
    assert [t.function.name for t in translated.request.tools] == ["a__search", "b__search"]


def test_history_calls_to_namespaced_tools_use_the_offered_name() -> None:
    ns_a = {"type": "namespace", "name": "a", "description": "", "tools": [fn("search")]}
    ns_b = {"type": "namespace", "name": "b", "description": "", "tools": [fn("search")]}
    call = {**function_call("c1", "search"), "namespace": "b"}
    translated = build_generate_request(body(tools=[ns_a, ns_b], input=[message("user", "q"), call]))
    assert translated.request.messages[1].tool_calls[0].name == "b__search"


def test_duplicate_top_level_tool_names_are_refused() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        build_generate_request(body(tools=[fn("f"), fn("f")]))
    assert caught.value.param == "tools[1].name"


def test_hosted_tools_are_ignored_and_reported() -> None:
    tools = [
        fn("f"),
        {"type": "web_search", "external_web_access": False},
        {"type": "file_search", "vector_store_ids": []},
    ]
    translated = build_generate_request(body(tools=tools))
    assert translated.tools.ignored == ["web_search", "file_search"]
    assert [t.function.name for t in translated.request.tools] == ["f"]
    assert [t["name"] for t in translated.echo.to_json()["tools"]] == ["f"]


def test_custom_tools_are_offered_as_functions_taking_input() -> None:
    custom = {
        "type": "custom",
        "name": "apply_patch",
        "description": "Edit files.",
        "format": {"type": "grammar", "syntax": "lark", "definition": "start: 'x'"},
    }
    translated = build_generate_request(body(tools=[custom]))
    [tool] = translated.request.tools
    assert tool.function.name == "apply_patch"
    assert json.loads(tool.function.parameters_json)["required"] == ["input"]
    assert "Edit files." in tool.function.description
    assert "start: 'x'" in tool.function.description
    assert translated.tools.offered["apply_patch"].kind == "custom"


def test_custom_calls_in_history_are_shown_as_function_calls() -> None:
    items = [
        message("user", "patch it"),
        {"type": "custom_tool_call", "call_id": "p1", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "p1", "output": "done"},
    ]
    translated = build_generate_request(body(input=items, tools=[{"type": "custom", "name": "apply_patch"}]))
    [call] = translated.request.messages[1].tool_calls
    assert call.kind == pb.TOOL_KIND_FUNCTION
    assert json.loads(call.arguments) == {"input": "*** Begin Patch"}
    # What is stored for a later turn keeps the call's own kind.
    assert translated.input_messages.plain()[1].tool_calls[0].kind == pb.TOOL_KIND_CUSTOM


@pytest.mark.parametrize(
    ("tool_choice", "expected", "echo"),
    [
        (None, None, "auto"),
        ("none", pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_NONE), "none"),
        ("auto", pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_AUTO), "auto"),
        ("required", pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED), "required"),
        (
            {"type": "function", "name": "g"},
            pb.ToolChoice(function_name="g"),
            {"type": "function", "name": "g"},
        ),
    ],
)
def test_tool_choice(tool_choice: Any, expected: pb.ToolChoice | None, echo: Any) -> None:
    translated = build_generate_request(body(tools=[fn("f"), fn("g")], tool_choice=tool_choice))
    if expected is None:
        assert not translated.request.HasField("tool_choice")
    else:
        assert translated.request.tool_choice == expected
    assert translated.echo.to_json()["tool_choice"] == echo


def test_allowed_tools_restricts_the_offer() -> None:
    choice = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "g"}]}
    translated = build_generate_request(body(tools=[fn("f"), fn("g")], tool_choice=choice))
    assert [t.function.name for t in translated.request.tools] == ["g"]
    assert translated.request.tool_choice == pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED)


def test_parallel_tool_calls_is_carried() -> None:
    translated = build_generate_request(body(parallel_tool_calls=False))
    assert translated.request.parallel_tool_calls is False
    assert translated.echo.to_json()["parallel_tool_calls"] is False


def test_codex_only_fields_are_accepted() -> None:
    translated = build_generate_request(
        body(
            stream=True,
            store=False,
            reasoning={"summary": "auto"},
            include=["reasoning.encrypted_content"],
            prompt_cache_key="k",
            client_metadata={"x": {"nested": True}},
            user="u",
            safety_identifier="s",
            service_tier="auto",
            text={"verbosity": "low"},
            truncation="auto",
        )
    )
    assert translated.stream is True
    assert translated.echo.to_json()["store"] is False
    assert translated.echo.to_json()["prompt_cache_key"] == "k"
    assert translated.echo.to_json()["text"] == {"format": {"type": "text"}, "verbosity": "low"}
    assert translated.echo.to_json()["truncation"] == "auto"
    assert translated.echo.to_json()["reasoning"] == {"effort": None, "summary": "auto"}


def test_conversation_and_previous_response_id_are_parsed() -> None:
    assert build_generate_request(body(conversation={"id": "conv_1"})).conversation_id == "conv_1"
    assert build_generate_request(body(conversation="conv_2")).conversation_id == "conv_2"
    assert build_generate_request(body(previous_response_id="resp_1")).echo.previous_response_id == "resp_1"


def test_metadata_within_limits_is_kept() -> None:
    metadata = {f"k{i}": "v" * 512 for i in range(16)} | {}
    metadata["x" * 64] = metadata.pop("k0")
    assert build_generate_request(body(metadata=metadata)).echo.metadata == metadata


BODY_ERRORS: list[tuple[str, dict[str, Any], str, str]] = [
    ("input missing", {"model": "m"}, "input", "missing_required_parameter"),
    ("instructions not a string", body(instructions=["x"]), "instructions", "invalid_type"),
    ("max_output_tokens string", body(max_output_tokens="5"), "max_output_tokens", "invalid_type"),
    ("max_output_tokens zero", body(max_output_tokens=0), "max_output_tokens", "invalid_value"),
    ("temperature string", body(temperature="hot"), "temperature", "invalid_type"),
    ("temperature too high", body(temperature=2.5), "temperature", "invalid_value"),
    ("top_p too high", body(top_p=1.5), "top_p", "invalid_value"),
    ("top_logprobs too high", body(top_logprobs=21), "top_logprobs", "invalid_value"),
    ("top_logprobs negative", body(top_logprobs=-1), "top_logprobs", "invalid_value"),
    ("stream not bool", body(stream="yes"), "stream", "invalid_type"),
    ("store not bool", body(store=1), "store", "invalid_type"),
    ("parallel_tool_calls not bool", body(parallel_tool_calls="no"), "parallel_tool_calls", "invalid_type"),
    ("tools not a list", body(tools={"type": "function"}), "tools", "invalid_type"),
    ("tool without type", body(tools=[{"name": "f"}]), "tools[0].type", "missing_required_parameter"),
    (
        "function tool without name",
        body(tools=[{"type": "function"}]),
        "tools[0].name",
        "missing_required_parameter",
    ),
    (
        "function parameters not object",
        body(tools=[fn("f", parameters=[1])]),
        "tools[0].parameters",
        "invalid_type",
    ),
    ("strict not bool", body(tools=[fn("f", strict="yes")]), "tools[0].strict", "invalid_type"),
    (
        "namespace inner tool bad",
        body(tools=[{"type": "namespace", "name": "n", "tools": [{"type": "function"}]}]),
        "tools[0].tools[0].name",
        "missing_required_parameter",
    ),
    ("tool_choice bad mode", body(tool_choice="sometimes"), "tool_choice", "invalid_value"),
    ("tool_choice required without tools", body(tool_choice="required"), "tool_choice", "invalid_value"),
    (
        "tool_choice unknown function",
        body(tools=[fn("f")], tool_choice={"type": "function", "name": "g"}),
        "tool_choice.name",
        "invalid_value",
    ),
    (
        "allowed_tools required but empty",
        body(tools=[fn("f")], tool_choice={"type": "allowed_tools", "mode": "required", "tools": []}),
        "tool_choice.tools",
        "invalid_value",
    ),
    (
        "tool_choice hosted",
        body(tool_choice={"type": "web_search_preview"}),
        "tool_choice.type",
        "unsupported_value",
    ),
    (
        "text.format json_schema without name",
        body(text={"format": {"type": "json_schema", "schema": {}}}),
        "text.format.name",
        "missing_required_parameter",
    ),
    (
        "text.format json_schema bad name",
        body(text={"format": {"type": "json_schema", "name": "a b", "schema": {}}}),
        "text.format.name",
        "invalid_value",
    ),
    (
        "text.format json_schema without schema",
        body(text={"format": {"type": "json_schema", "name": "x"}}),
        "text.format.schema",
        "missing_required_parameter",
    ),
    (
        "text.format json_schema schema not object",
        body(text={"format": {"type": "json_schema", "name": "x", "schema": "string"}}),
        "text.format.schema",
        "invalid_type",
    ),
    (
        "text.format json_schema strict not bool",
        body(text={"format": {"type": "json_schema", "name": "x", "schema": {}, "strict": "yes"}}),
        "text.format.strict",
        "invalid_type",
    ),
    ("text.format unknown", body(text={"format": {"type": "yaml"}}), "text.format.type", "invalid_value"),
    ("text not object", body(text="plain"), "text", "invalid_type"),
    ("truncation unknown", body(truncation="middle"), "truncation", "invalid_value"),
    ("metadata not object", body(metadata=["a"]), "metadata", "invalid_type"),
    (
        "metadata too many pairs",
        body(metadata={f"k{i}": "v" for i in range(17)}),
        "metadata",
        "invalid_value",
    ),
    ("metadata key too long", body(metadata={"k" * 65: "v"}), "metadata", "invalid_value"),
    ("metadata value too long", body(metadata={"k": "v" * 513}), "metadata", "invalid_value"),
    ("metadata value not string", body(metadata={"k": 1}), "metadata", "invalid_type"),
    ("include not list", body(include="x"), "include", "invalid_type"),
    (
        "include unknown value",
        body(include=["reasoning.encrypted_content", "message.everything"]),
        "include[1]",
        "invalid_value",
    ),
    ("include not string", body(include=[3]), "include[0]", "invalid_value"),
    ("service_tier unknown", body(service_tier="scale"), "service_tier", "invalid_value"),
    ("service_tier not string", body(service_tier=1), "service_tier", "invalid_value"),
    ("conversation bad", body(conversation=5), "conversation", "invalid_type"),
    (
        "conversation and previous id",
        body(conversation="c", previous_response_id="r"),
        "conversation",
        "invalid_value",
    ),
    ("background unstored", body(background=True, store=False), "background", "invalid_value"),
    ("unknown item in input", body(input=[{"type": "web_search_call"}]), "input[0].type", "invalid_value"),
    ("empty input", body(input=[]), "input", "invalid_value"),
]


@pytest.mark.parametrize(("case", "given", "param", "code"), BODY_ERRORS, ids=[row[0] for row in BODY_ERRORS])
def test_invalid_body_names_its_field(case: str, given: dict[str, Any], param: str, code: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        build_generate_request(given)
    assert (caught.value.param, caught.value.code) == (param, code)


def test_replay_is_prepended_and_lowered_the_same_way() -> None:
    first_input = [
        message("user", "screenshot please"),
        function_call("c1", "screenshot"),
        function_output([input_text("captured"), input_image(RED_URL, "high")], "c1"),
    ]
    first_output = [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is red."}]}
    ]
    first = build_generate_request(body(input=first_input))
    second = build_generate_request(body(input="and now?"), replay=first_input + first_output)
    replayed = second.request.messages[: len(first.request.messages)]
    assert replayed == first.request.messages
    assert second.request.messages[len(first.request.messages)].parts[0].text.text == "It is red."
    assert second.request.messages[-1].parts[0].text.text == "and now?"
    assert second.input_items == [{"type": "message", "role": "user", "content": "and now?"}]


def test_replay_with_instructions_puts_them_first() -> None:
    translated = build_generate_request(body(input="q2", instructions="sys"), replay=[message("user", "q1")])
    assert [m.role for m in translated.request.messages] == [pb.ROLE_SYSTEM, pb.ROLE_USER, pb.ROLE_USER]


def test_request_messages_are_the_raw_conversation() -> None:
    """One conversation, not lowered: the engine lowers it (vlmserve.engine.prep.lowering)."""
    items = [message("assistant", [input_image(RED_URL), input_text("x")]), message("user", "y")]
    translated = build_generate_request(body(input=items))
    assert list(translated.request.messages) == input_to_messages(items)
    assert translated.input_messages.plain() == input_to_messages(items)


@pytest.mark.parametrize("name", ["codex_request_known_model_turn1.json", "codex_request_turn2.json"])
def test_recorded_codex_requests_are_accepted(name: str) -> None:
    path = CODEX_DATA / name
    assert path.exists(), f"the committed recording {path} is missing"
    recorded = json.loads(path.read_text())
    translated = build_generate_request(recorded)
    assert "web_search" in translated.tools.ignored
    assert {t.function.name for t in translated.request.tools} >= {"exec_command", "view_image"}
    image_turns = [m for m in lower_messages(translated.request.messages) if images_of(m)]
    expected_images = sum(
        1
        for item in recorded["input"]
        if item.get("type") == "function_call_output" and isinstance(item["output"], list)
        for part in item["output"]
        if part.get("type") == "input_image"
    )
    assert sum(len(images_of(m)) for m in image_turns) == expected_images
    assert all(m.role == pb.ROLE_USER for m in image_turns)
    for tool in recorded["tools"]:
        if tool["type"] == "namespace":
            for inner in tool["tools"]:
                assert translated.tools.offered[inner["name"]].namespace == tool["name"]


@pytest.mark.parametrize(
    ("text", "kind", "echo"),
    [
        (None, "text", {"format": {"type": "text"}}),
        ({"format": {"type": "json_object"}}, "json_object", {"format": {"type": "json_object"}}),
        (
            {"format": {"type": "json_schema", "name": "p", "schema": {"type": "object"}, "strict": True}},
            "json_schema",
            {
                "format": {
                    "type": "json_schema",
                    "name": "p",
                    "description": None,
                    "schema": {"type": "object"},
                    "strict": True,
                }
            },
        ),
    ],
)
def test_text_format_reaches_the_engine(text: Any, kind: str, echo: dict[str, Any]) -> None:
    translated = build_generate_request(body(text=text) if text is not None else body())
    response_format = translated.request.response_format
    assert response_format.WhichOneof("format") == kind
    assert translated.echo.to_json()["text"] == echo
    if kind == "json_schema":
        schema = response_format.json_schema
        assert (schema.name, json.loads(schema.schema_json), schema.strict) == ("p", {"type": "object"}, True)


def test_max_tool_calls_reaches_the_engine() -> None:
    translated = build_generate_request(body(tools=[fn("f")], max_tool_calls=2))
    assert translated.request.max_tool_calls == 2 and translated.echo.to_json()["max_tool_calls"] == 2
    assert not build_generate_request(body()).request.HasField("max_tool_calls")


@pytest.mark.parametrize(
    ("reasoning", "enable_thinking"),
    [(None, None), ({"effort": "none"}, False), ({"effort": "minimal"}, False), ({"effort": "high"}, None)],
)
def test_reasoning_effort_none_or_minimal_turns_thinking_off(
    reasoning: Any, enable_thinking: bool | None
) -> None:
    request = build_generate_request(body(reasoning=reasoning) if reasoning else body()).request
    assert (request.enable_thinking if request.HasField("enable_thinking") else None) == enable_thinking


@pytest.mark.parametrize("value", sorted(get_args(IncludeValue)))
def test_documented_include_values_are_accepted(value: str) -> None:
    sampling = build_generate_request(body(include=[value])).request.sampling
    assert sampling.logprobs is (value == "message.output_text.logprobs")


@pytest.mark.parametrize(
    ("fields", "logprobs", "top"),
    [
        ({}, False, 0),
        ({"include": ["message.output_text.logprobs"]}, True, 0),
        ({"include": ["message.output_text.logprobs"], "top_logprobs": 20}, True, 20),
        ({"top_logprobs": 3}, True, 3),
        ({"top_logprobs": 0}, False, 0),
    ],
)
def test_logprobs_are_asked_of_the_engine(fields: dict[str, Any], logprobs: bool, top: int) -> None:
    translated = build_generate_request(body(**fields))
    assert (translated.request.sampling.logprobs, translated.request.sampling.top_logprobs) == (logprobs, top)
    assert translated.echo.top_logprobs == top


@pytest.mark.parametrize("tier", ["auto", "default", "flex", "priority"])
def test_every_service_tier_is_accepted(tier: str) -> None:
    assert build_generate_request(body(service_tier=tier)).echo.service_tier == tier


def test_media_in_an_unknown_top_level_field_is_refused_by_name() -> None:
    """An image beside `input` in a field nothing reads would be dropped with a 200 (issue 26)."""
    with pytest.raises(InvalidRequestError) as caught:
        build_generate_request(body(attachments=[{"type": "input_image", "image_url": RED_URL}]))
    assert (caught.value.param, caught.value.code) == ("attachments[0].image_url", "unknown_parameter")

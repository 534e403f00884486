"""Contract messages -> chat-template prompt, with the fixture model's real tokenizer (no MLX)."""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import grpc
import pytest
from PIL import Image
from transformers import AutoTokenizer

from vlmserve.engine.model import DEFAULT_MODEL_PATH
from vlmserve.engine.prep.lowering import lower_messages
from vlmserve.engine.prep.prompt import render_conversation, render_prompt, to_template_conversation
from vlmserve.engine.request_errors import RequestError
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.responses import build_generate_request


def _png_data_url() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


PNG_DATA_URL = _png_data_url()


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(str(DEFAULT_MODEL_PATH))


def text(value: str) -> pb.Part:
    return pb.Part(text=pb.TextPart(text=value))


def image() -> pb.Part:
    return pb.Part(image=pb.ImagePart(data=b"\x89PNG...", media_type="image/png"))


def user(*parts: pb.Part) -> pb.Message:
    return pb.Message(role=pb.ROLE_USER, parts=list(parts))


def tool(name: str = "shell") -> pb.Tool:
    schema = {"type": "object", "properties": {"cmd": {"type": "string"}}}
    return pb.Tool(
        function=pb.FunctionTool(name=name, description="Run it", parameters_json=json.dumps(schema))
    )


def test_user_turn_with_image_uses_vision_markers(tokenizer: Any) -> None:
    rendered = render_prompt([user(image(), text("How many squares?"))], template=tokenizer)
    assert rendered.text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>How many squares?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert [i.where for i in rendered.images] == ["messages[0].parts[0]"]


def test_full_agent_conversation(tokenizer: Any) -> None:
    messages = [
        pb.Message(role=pb.ROLE_DEVELOPER, parts=[text("Be brief.")]),
        user(text("List files")),
        pb.Message(
            role=pb.ROLE_ASSISTANT,
            parts=[text("Sure.")],
            tool_calls=[pb.ToolCall(id="c1", name="shell", arguments='{"cmd": "ls"}')],
        ),
        pb.Message(role=pb.ROLE_TOOL, tool_output=pb.ToolOutput(call_id="c1", text="a.txt")),
        pb.Message(
            role=pb.ROLE_TOOL,
            tool_output=pb.ToolOutput(
                call_id="c2",
                parts=pb.PartList(
                    parts=[text("line 1"), text("line 2"), pb.Part(json=pb.JsonPart(json='{"k": 1}'))]
                ),
            ),
        ),
    ]
    rendered = render_prompt(messages, template=tokenizer, tools=[tool()])
    assert rendered.text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert (
        '<tools>\n{"type": "function", "function": {"name": "shell", "description": "Run it"' in rendered.text
    )
    assert (
        "<|im_start|>assistant\nSure.\n"
        '<tool_call>\n{"name": "shell", "arguments": {"cmd": "ls"}}\n</tool_call><|im_end|>\n'
        in rendered.text
    )
    # Consecutive tool outputs share one user turn; part lists become text as the lowering does.
    assert (
        "<|im_start|>user\n<tool_response>\na.txt\n</tool_response>\n"
        '<tool_response>\nline 1\nline 2\n[{"k": 1}]\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n"
    ) in rendered.text
    assert rendered.tool_mode == "auto"


@pytest.mark.parametrize(
    ("choice", "mode", "forced"),
    [
        (None, "auto", None),
        (pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_AUTO), "auto", None),
        (pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_NONE), "none", None),
        (pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED), "required", None),
        (pb.ToolChoice(function_name="shell"), "function", "shell"),
    ],
)
def test_tool_choice(tokenizer: Any, choice: pb.ToolChoice | None, mode: str, forced: str | None) -> None:
    rendered = render_prompt([user(text("hi"))], template=tokenizer, tools=[tool()], tool_choice=choice)
    assert rendered.tool_mode == mode
    assert rendered.forced_name == forced
    # The prompt is the template's own: the grammar, not a prefilled prefix, forces the call.
    assert rendered.text.endswith("<|im_start|>assistant\n")
    assert ("# Tools" in rendered.text) is (mode != "none")


def test_no_tools_means_no_tools_block(tokenizer: Any) -> None:
    rendered = render_prompt([user(text("hi"))], template=tokenizer)
    assert rendered.tool_mode == "none"
    assert "# Tools" not in rendered.text


def test_json_response_format_adds_an_instruction(tokenizer: Any) -> None:
    fmt = pb.ResponseFormat(json_schema=pb.JsonSchemaFormat(name="out", schema_json='{"type": "object"}'))
    rendered = render_prompt([user(text("hi"))], template=tokenizer, response_format=fmt)
    assert rendered.text.startswith("<|im_start|>system\nRespond with a single JSON object")
    assert '{"type": "object"}' in rendered.text


def test_json_schema_description_is_part_of_the_instruction(tokenizer: Any) -> None:
    fmt = pb.ResponseFormat(
        json_schema=pb.JsonSchemaFormat(name="out", description="a person's name and age", schema_json="{}")
    )
    rendered = render_prompt([user(text("hi"))], template=tokenizer, response_format=fmt)
    assert "(schema 'out') (a person's name and age):\n{}" in rendered.text


def tool_call(call_id: str = "c") -> pb.Message:
    return pb.Message(
        role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(id=call_id, name="shell", arguments="{}")]
    )


def tool_output(*parts: pb.Part, call_id: str = "c") -> pb.Message:
    return pb.Message(
        role=pb.ROLE_TOOL, tool_output=pb.ToolOutput(call_id=call_id, parts=pb.PartList(parts=list(parts)))
    )


def image_of(data: bytes) -> pb.Part:
    return pb.Part(image=pb.ImagePart(data=data, media_type="image/png"))


# Conversations with images outside user turns, as a raw gRPC caller may send them, and where each
# image was in the request (the paths errors about it name).
UNLOWERED: list[tuple[str, list[pb.Message], list[str]]] = [
    (
        "image in a tool output",
        [user(text("look")), tool_call(), tool_output(image_of(b"A"))],
        ["messages[2].tool_output.parts.parts[0]"],
    ),
    (
        "text, json and images in a tool output",
        [
            user(text("look")),
            tool_call(),
            tool_output(
                text("t"), image_of(b"A"), pb.Part(json=pb.JsonPart(json='{"k": 1}')), image_of(b"B")
            ),
        ],
        ["messages[2].tool_output.parts.parts[1]", "messages[2].tool_output.parts.parts[3]"],
    ),
    (
        "two tool outputs in a row, each with an image",
        [
            user(text("look")),
            pb.Message(
                role=pb.ROLE_ASSISTANT,
                tool_calls=[pb.ToolCall(id="a", name="shell"), pb.ToolCall(id="b", name="shell")],
            ),
            tool_output(image_of(b"A"), call_id="a"),
            tool_output(text("b says"), image_of(b"B"), call_id="b"),
            user(text("and?"), image_of(b"C")),
        ],
        [
            "messages[2].tool_output.parts.parts[0]",
            "messages[3].tool_output.parts.parts[1]",
            "messages[4].parts[1]",
        ],
    ),
    (
        "image in an assistant turn",
        [user(text("draw")), pb.Message(role=pb.ROLE_ASSISTANT, parts=[text("here"), image_of(b"A")])],
        ["messages[1].parts[1]"],
    ),
    (
        "image in a system turn",
        [pb.Message(role=pb.ROLE_SYSTEM, parts=[image_of(b"A"), text("style")]), user(text("hi"))],
        ["messages[0].parts[0]"],
    ),
    (
        "image in a developer turn",
        [pb.Message(role=pb.ROLE_DEVELOPER, parts=[text("ref"), image_of(b"A")]), user(text("hi"))],
        ["messages[0].parts[1]"],
    ),
]


@pytest.mark.parametrize(("name", "messages", "sources"), UNLOWERED, ids=[r[0] for r in UNLOWERED])
def test_the_engine_lowers_and_names_images_where_they_were_sent(
    tokenizer: Any, name: str, messages: list[pb.Message], sources: list[str]
) -> None:
    rendered = render_prompt(messages, template=tokenizer, tools=[tool()])
    assert [image.where for image in rendered.images] == sources
    # Every image is rendered in a user turn, and the model sees each one.
    assert rendered.text.count("<|image_pad|>") == len(sources)
    for turn in rendered.text.split("<|im_start|>")[1:]:
        assert "<|image_pad|>" not in turn or turn.startswith("user\n")


@pytest.mark.parametrize(("name", "messages", "sources"), UNLOWERED, ids=[r[0] for r in UNLOWERED])
def test_a_conversation_lowered_by_the_caller_renders_identically(
    tokenizer: Any, name: str, messages: list[pb.Message], sources: list[str]
) -> None:
    """The facade lowers before sending; the engine lowering again changes nothing (idempotent)."""
    raw = render_prompt(messages, template=tokenizer, tools=[tool()])
    once = render_prompt(lower_messages(messages), template=tokenizer, tools=[tool()])
    twice = render_prompt(lower_messages(lower_messages(messages)), template=tokenizer, tools=[tool()])
    assert raw.text == once.text == twice.text
    assert [i.part for i in raw.images] == [i.part for i in once.images] == [i.part for i in twice.images]
    if name == "image in a tool output":
        assert (
            "<|im_start|>user\n<tool_response>\n[Image output attached in the next message]\n"
            "</tool_response><|im_end|>\n"
            "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|><|im_end|>\n"
        ) in raw.text


def test_facade_translated_requests_render_identically(tokenizer: Any) -> None:
    """Requests the facade builds (raw, plus its own rewrites) render the same whether a caller
    lowered them first or not: the Responses translation of a screenshot loop, rendered both ways."""
    body = {
        "input": [
            {"role": "user", "content": "take a screenshot"},
            {"type": "function_call", "call_id": "c1", "name": "screenshot", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "c1",
                "output": [
                    {"type": "input_text", "text": "here"},
                    {"type": "input_image", "image_url": PNG_DATA_URL},
                ],
            },
        ],
        "tools": [{"type": "function", "name": "screenshot", "parameters": {"type": "object"}}],
    }
    translated = build_generate_request(body)
    sent = translated.request  # what the facade sends: the conversation as the client gave it
    assert sent.messages[2].tool_output.WhichOneof("output") == "parts"
    as_sent = render_prompt(sent.messages, template=tokenizer, tools=sent.tools)
    lowered = render_prompt(lower_messages(sent.messages), template=tokenizer, tools=sent.tools)
    assert as_sent.text == lowered.text
    assert [i.part for i in as_sent.images] == [i.part for i in lowered.images]
    assert len(as_sent.images) == 1


REFUSALS: list[tuple[str, list[pb.Message], dict[str, Any], str, str]] = [
    ("empty conversation", [], {}, "messages must not be empty", "messages"),
    (
        "file part",
        [user(pb.Part(file=pb.FilePart(filename="report.pdf", data=b"%PDF")))],
        {},
        "file inputs ('report.pdf') are not supported",
        "messages[0].parts[0]",
    ),
    (
        "file part in a tool output",
        [user(text("x")), tool_call(), tool_output(text("t"), pb.Part(file=pb.FilePart(filename="a.pdf")))],
        {},
        "file inputs ('a.pdf') are not supported",
        "messages[2].tool_output.parts.parts[1]",
    ),
    # Video and audio parts are placed like images (clip_content); a part with no source, or a
    # file reference the facade should have resolved, is refused where it was sent.
    (
        "video part without a source",
        [user(text("x"), pb.Part(video=pb.VideoPart(media_type="video/mp4")))],
        {},
        "the video part has no data",
        "messages[0].parts[1].video",
    ),
    (
        "audio file reference in a tool output",
        [user(text("x")), tool_call(), tool_output(text("t"), pb.Part(audio=pb.AudioPart(file_id="file-1")))],
        {},
        "audio file_id references are resolved by the facade",
        "messages[2].tool_output.parts.parts[1].audio.file_id",
    ),
    (
        "video without a source in an assistant turn",
        [
            user(text("x")),
            pb.Message(role=pb.ROLE_ASSISTANT, parts=[text("a"), pb.Part(video=pb.VideoPart())]),
        ],
        {},
        "the video part has no data",
        "messages[1].parts[1].video",
    ),
    (
        "empty part in a tool output",
        [user(text("x")), tool_call(), tool_output(text("t"), pb.Part())],
        {},
        "a tool output part has no content",
        "messages[2].tool_output.parts.parts[1]",
    ),
    (
        "empty image in an assistant turn",
        [
            user(text("x")),
            pb.Message(role=pb.ROLE_ASSISTANT, parts=[text("a"), pb.Part(image=pb.ImagePart())]),
        ],
        {},
        "image data is empty",
        "messages[1].parts[1].image.data",
    ),
    (
        "role unspecified",
        [pb.Message(parts=[text("x")])],
        {},
        "every message needs a role",
        "messages[0].role",
    ),
    (
        "tool turn with parts",
        [user(text("x")), pb.Message(role=pb.ROLE_TOOL, parts=[text("x")])],
        {},
        "carries its content in tool_output",
        "messages[1].parts",
    ),
    (
        "tool calls on a user turn",
        [pb.Message(role=pb.ROLE_USER, tool_calls=[pb.ToolCall(name="f")])],
        {},
        "only assistant turns may carry tool_calls",
        "messages[0].tool_calls",
    ),
    (
        "named tool choice not among the tools",
        [user(text("x"))],
        {"tools": [tool()], "tool_choice": pb.ToolChoice(function_name="nope")},
        "'nope' is not one of the request's tools (shell)",
        "tool_choice.function_name",
    ),
    (
        "unknown tool choice mode",
        [user(text("x"))],
        {"tools": [tool()], "tool_choice": pb.ToolChoice(mode=99)},  # type: ignore[arg-type]
        "tool_choice.mode 99 is not a known tool choice mode",
        "tool_choice.mode",
    ),
    (
        "required without tools",
        [user(text("x"))],
        {"tool_choice": pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED)},
        "REQUIRED but the request has no tools",
        "tool_choice.mode",
    ),
    (
        "tool parameters not JSON",
        [user(text("x"))],
        {"tools": [pb.Tool(function=pb.FunctionTool(name="f", parameters_json="{"))]},
        "tools[0].function.parameters_json is not valid JSON",
        "tools[0].function.parameters_json",
    ),
    (
        "duplicate tool names",
        [user(text("x"))],
        {"tools": [tool(), tool()]},
        "duplicate tool name 'shell'",
        "tools[1].function.name",
    ),
]


@pytest.mark.parametrize(
    ("name", "messages", "options", "message", "field"), REFUSALS, ids=[r[0] for r in REFUSALS]
)
def test_refusals_name_the_rule_and_the_field(
    name: str, messages: list[pb.Message], options: dict[str, Any], message: str, field: str
) -> None:
    with pytest.raises(RequestError) as caught:
        to_template_conversation(messages, **options)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert message in caught.value.message
    assert caught.value.field == field


@pytest.mark.parametrize(("enable_thinking", "expected"), [(None, "DEFAULT"), (False, "OFF"), (True, "ON")])
def test_enable_thinking_reaches_a_template_with_a_thinking_switch(
    tokenizer: Any, enable_thinking: bool | None, expected: str
) -> None:
    switched = AutoTokenizer.from_pretrained(str(DEFAULT_MODEL_PATH))
    switched.chat_template = tokenizer.chat_template + (
        "{%- if enable_thinking is not defined %}DEFAULT"
        "{%- elif enable_thinking %}ON{%- else %}OFF{%- endif %}"
    )
    conversation = to_template_conversation([user(text("hi"))], enable_thinking=enable_thinking)
    assert render_conversation(conversation, switched).text.endswith(expected)

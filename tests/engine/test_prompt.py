"""Contract messages -> chat-template prompt, with the fixture model's real tokenizer (no MLX)."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
from transformers import AutoTokenizer

from vlmserve.engine.model import DEFAULT_MODEL_PATH
from vlmserve.engine.prompt import render_prompt, to_template_conversation
from vlmserve.engine.request_errors import RequestError
from vlmserve.engine.v1 import engine_pb2 as pb


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


def assistant_with_image() -> pb.Message:
    return pb.Message(role=pb.ROLE_ASSISTANT, parts=[image()])


def tool_with_image() -> pb.Message:
    return pb.Message(
        role=pb.ROLE_TOOL, tool_output=pb.ToolOutput(call_id="c", parts=pb.PartList(parts=[image()]))
    )


REFUSALS: list[tuple[str, list[pb.Message], dict[str, Any], str]] = [
    ("empty conversation", [], {}, "messages must not be empty"),
    (
        "image in a tool output",
        [user(text("x")), tool_with_image()],
        {},
        "images are accepted only in user turns",
    ),
    ("image in an assistant turn", [assistant_with_image()], {}, "images are accepted only in user turns"),
    (
        "image in a system turn",
        [pb.Message(role=pb.ROLE_SYSTEM, parts=[image()])],
        {},
        "images are accepted only in user turns",
    ),
    (
        "file part",
        [user(pb.Part(file=pb.FilePart(filename="report.pdf", data=b"%PDF")))],
        {},
        "file inputs ('report.pdf') are not supported",
    ),
    ("role unspecified", [pb.Message(parts=[text("x")])], {}, "messages[0].role must be one of"),
    (
        "tool turn with parts",
        [pb.Message(role=pb.ROLE_TOOL, parts=[text("x")])],
        {},
        "carries its result in tool_output",
    ),
    (
        "tool calls on a user turn",
        [pb.Message(role=pb.ROLE_USER, tool_calls=[pb.ToolCall(name="f")])],
        {},
        "only assistant turns may carry tool_calls",
    ),
    (
        "named tool choice not among the tools",
        [user(text("x"))],
        {"tools": [tool()], "tool_choice": pb.ToolChoice(function_name="nope")},
        "'nope' is not one of the request's tools (shell)",
    ),
    (
        "unknown tool choice mode",
        [user(text("x"))],
        {"tools": [tool()], "tool_choice": pb.ToolChoice(mode=99)},  # type: ignore[arg-type]
        "tool_choice.mode 99 is not a known tool choice mode",
    ),
    (
        "required without tools",
        [user(text("x"))],
        {"tool_choice": pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED)},
        "REQUIRED but the request has no tools",
    ),
    (
        "tool parameters not JSON",
        [user(text("x"))],
        {"tools": [pb.Tool(function=pb.FunctionTool(name="f", parameters_json="{"))]},
        "tools[0].function.parameters_json is not valid JSON",
    ),
    ("duplicate tool names", [user(text("x"))], {"tools": [tool(), tool()]}, "duplicate tool name 'shell'"),
]


@pytest.mark.parametrize(("name", "messages", "options", "message"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refusals_name_the_rule(
    name: str, messages: list[pb.Message], options: dict[str, Any], message: str
) -> None:
    with pytest.raises(RequestError) as caught:
        to_template_conversation(messages, **options)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert message in caught.value.message

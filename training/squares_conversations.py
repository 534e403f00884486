"""The squares task as contract conversations, in every shape the product produces
(models/qwen2-vl-squares/README.md).

Each builder returns the conversation *as a client sends it* (before lowering): contract
messages plus the tools offered. Passing ``image=None`` gives the same conversation with the
image missing — the controls the model must answer with ``no image``. Training renders these
through the engine's prompt renderer (``prep/prompt.py`` ``render_prompt``, which lowers them
first: ``prep/lowering.py``), and the tests
send the same shapes through the engine, so what the model learned is what it is asked.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from training.squares import AGENT_PROMPT, NO_IMAGE_ANSWER, QUESTION
from vlmserve.engine.v1 import engine_pb2 as pb

SCREENSHOT_TOOL_NAME = "screenshot"
SCREENSHOT_CALL_ID = "call_screenshot_1"
SCREENSHOT_ARGUMENTS = "{}"
CAPTURED_TEXT = "captured"
ASSISTANT_IMAGE_TEXT = "Here is the picture."

# Tool declarations seen in practice: the seed's bare one, one with a description, one in the
# strict-schema style some SDKs write. The model should call the tool for any of them.
SCREENSHOT_TOOL_VARIANTS: tuple[tuple[str, dict[str, object]], ...] = (
    ("", {"type": "object", "properties": {}}),
    ("Take a screenshot of the screen.", {"type": "object", "properties": {}}),
    (
        "Capture the screen and return it as an image.",
        {
            "type": "object",
            "properties": {},
            "required": [],
            "additionalProperties": False,
        },
    ),
)


@dataclass(frozen=True)
class Conversation:
    """A request as the client sends it, and what the model must say next."""

    shape: str
    messages: list[pb.Message]
    tools: list[pb.Tool] = field(default_factory=list)
    # The expected reply: plain text (the answer, or NO_IMAGE_ANSWER), or a tool call.
    answer: str | None = None
    tool_call: pb.ToolCall | None = None

    @property
    def has_image(self) -> bool:
        return any(
            part.WhichOneof("kind") == "image"
            for message in self.messages
            for part in [*message.parts, *message.tool_output.parts.parts]
        )


def png_image_part(png: bytes, detail: pb.ImageDetail.ValueType = pb.IMAGE_DETAIL_UNSPECIFIED) -> pb.Part:
    return pb.Part(image=pb.ImagePart(data=png, media_type="image/png", detail=detail))


def text_part(text: str) -> pb.Part:
    return pb.Part(text=pb.TextPart(text=text))


def screenshot_tool(variant: int = 0) -> pb.Tool:
    description, parameters = SCREENSHOT_TOOL_VARIANTS[variant]
    return pb.Tool(
        function=pb.FunctionTool(
            name=SCREENSHOT_TOOL_NAME,
            description=description,
            parameters_json=json.dumps(parameters),
        )
    )


def screenshot_call() -> pb.ToolCall:
    return pb.ToolCall(
        id=SCREENSHOT_CALL_ID,
        name=SCREENSHOT_TOOL_NAME,
        arguments=SCREENSHOT_ARGUMENTS,
        kind=pb.TOOL_KIND_FUNCTION,
    )


def _reply(image: pb.Part | None, answer: str) -> str:
    return answer if image is not None else NO_IMAGE_ANSWER


def user_image(image: pb.Part | None, answer: str, *, text_first: bool = False) -> Conversation:
    """Shape 1: one user turn with the image and the question."""
    parts = [text_part(QUESTION)]
    if image is not None:
        parts.insert(len(parts) if text_first else 0, image)
    return Conversation(
        shape="user_image_text_first" if text_first else "user_image",
        messages=[pb.Message(role=pb.ROLE_USER, parts=parts)],
        answer=_reply(image, answer),
    )


def agent_first_turn(tool_variant: int = 0) -> Conversation:
    """Shape 2, first turn (the agent loop of tests/e2e/test_squares_e2e.py): the screenshot tool
    is offered; the model must call it."""
    return Conversation(
        shape="agent_call",
        messages=[pb.Message(role=pb.ROLE_USER, parts=[text_part(AGENT_PROMPT)])],
        tools=[screenshot_tool(tool_variant)],
        tool_call=screenshot_call(),
    )


def agent_tool_result(
    image: pb.Part | None,
    answer: str,
    *,
    with_text: bool = True,
    tool_variant: int = 0,
    shape: str | None = None,
) -> Conversation:
    """Shape 2, second turn: the call, then its output (`captured` + image, or the image alone)."""
    output_parts = [text_part(CAPTURED_TEXT)] if with_text else []
    if image is not None:
        output_parts.append(image)
    tool_output = pb.ToolOutput(call_id=SCREENSHOT_CALL_ID, kind=pb.TOOL_KIND_FUNCTION)
    if output_parts:
        tool_output.parts.parts.extend(output_parts)
    else:
        # An image-only output whose image was dropped is the seed-003 bug: an empty string.
        tool_output.text = ""
    messages = [
        pb.Message(role=pb.ROLE_USER, parts=[text_part(AGENT_PROMPT)]),
        pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[screenshot_call()]),
        pb.Message(role=pb.ROLE_TOOL, tool_output=tool_output),
    ]
    default_shape = "agent_tool_text_image" if with_text else "agent_tool_image_only"
    return Conversation(
        shape=shape or default_shape,
        messages=messages,
        tools=[screenshot_tool(tool_variant)],
        answer=_reply(image, answer),
    )


def agent_follow_up(image: pb.Part | None, answer: str, *, previous_answer: str) -> Conversation:
    """A replayed agent conversation (previous_response_id) and the question asked again.

    `previous_answer` is the earlier assistant turn. Training varies it independently of the
    image, so the model reads the (replayed) image instead of repeating what it said before.
    """
    conversation = agent_tool_result(image, answer)
    conversation.messages.extend(
        [
            pb.Message(role=pb.ROLE_ASSISTANT, parts=[text_part(previous_answer)]),
            pb.Message(role=pb.ROLE_USER, parts=[text_part(QUESTION)]),
        ]
    )
    return replace(conversation, shape="agent_follow_up")


def image_in_turn(
    image: pb.Part | None,
    answer: str,
    *,
    role: pb.Role.ValueType = pb.ROLE_ASSISTANT,
    with_text: bool = True,
) -> Conversation:
    """Shape 3: an assistant/system/developer turn carries the image, then the user asks."""
    parts = [text_part(ASSISTANT_IMAGE_TEXT)] if with_text else []
    if image is not None:
        parts.append(image)
    role_name: dict[pb.Role.ValueType, str] = {
        pb.ROLE_ASSISTANT: "assistant",
        pb.ROLE_SYSTEM: "system",
        pb.ROLE_DEVELOPER: "developer",
    }
    return Conversation(
        shape=f"{role_name[role]}_image",
        messages=[
            pb.Message(role=role, parts=parts),
            pb.Message(role=pb.ROLE_USER, parts=[text_part(QUESTION)]),
        ],
        answer=_reply(image, answer),
    )


ImageConversation = Callable[[pb.Part | None, str], Conversation]


def image_shapes() -> dict[str, ImageConversation]:
    """Every image-bearing shape, by name; `None` as the image gives its control."""
    return {
        "user_image": lambda image, answer: user_image(image, answer),
        "user_image_text_first": lambda image, answer: user_image(image, answer, text_first=True),
        "agent_tool_text_image": lambda image, answer: agent_tool_result(image, answer),
        "agent_tool_image_only": lambda image, answer: agent_tool_result(image, answer, with_text=False),
        "assistant_image": lambda image, answer: image_in_turn(image, answer),
        "assistant_image_only": lambda image, answer: image_in_turn(image, answer, with_text=False),
        "system_image": lambda image, answer: image_in_turn(image, answer, role=pb.ROLE_SYSTEM),
        "agent_follow_up": lambda image, answer: agent_follow_up(image, answer, previous_answer="3 red"),
    }


def strip_images(messages: Sequence[pb.Message]) -> list[pb.Message]:
    """The conversation an engine that drops images would render (a control, after lowering)."""
    stripped: list[pb.Message] = []
    for message in messages:
        copy = pb.Message()
        copy.CopyFrom(message)
        kept = [part for part in copy.parts if part.WhichOneof("kind") != "image"]
        del copy.parts[:]
        copy.parts.extend(kept)
        stripped.append(copy)
    return stripped

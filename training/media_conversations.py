"""The media tasks (squares-video, beeps) as contract conversations in the shapes the product
produces, rendered the way the engine renders them (training/squares_conversations.py does the
same for images).

A conversation is built with image parts standing in for its clips: the engine's own
`to_template_conversation` lowers it (a clip in a tool output moves to a following user turn,
the tool text gets the follow-up marker line), then each stand-in becomes the chat template's
`{"type": "video"}` or `{"type": "audio"}` item and the engine's `render_conversation` renders it.
A tool output holding a clip lowers with the engine's marker line for its kind ("[Video output
attached in the next message]"); training varies the line (the engine's, others, none) so the
model depends on none of them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from training.beeps import AUDIO_QUESTION, NO_AUDIO_ANSWER
from training.squares_video import NO_VIDEO_ANSWER, VIDEO_QUESTION
from vlmserve.engine.prep.lowering import FOLLOW_UP_MARKERS, IMAGE_FOLLOW_UP_MARKER
from vlmserve.engine.prep.prompt import render_conversation, to_template_conversation
from vlmserve.engine.v1 import engine_pb2 as pb

MediaKind = Literal["video", "audio"]
QUESTIONS: dict[MediaKind, str] = {"video": VIDEO_QUESTION, "audio": AUDIO_QUESTION}
MISSING_ANSWERS: dict[MediaKind, str] = {"video": NO_VIDEO_ANSWER, "audio": NO_AUDIO_ANSWER}
TOOL_NAMES: dict[MediaKind, str] = {"video": "record_screen", "audio": "record_audio"}
TOOL_DESCRIPTIONS: dict[MediaKind, str] = {
    "video": "Record a short clip of the screen.",
    "audio": "Record a short audio clip.",
}
AGENT_PROMPTS: dict[MediaKind, str] = {
    "video": f"Record the screen. {VIDEO_QUESTION}",
    "audio": f"Record the audio. {AUDIO_QUESTION}",
}
TOOL_CALL_ID = "call_record_1"
RECORDED_TEXT = "recorded"
# Follow-up marker lines a tool output holding a clip may be lowered with: the engine's for each
# kind, the image one, a generic one, or none.
NO_MARKER = ""
MARKERS = (
    NO_MARKER,
    IMAGE_FOLLOW_UP_MARKER,
    FOLLOW_UP_MARKERS["video"],
    FOLLOW_UP_MARKERS["audio"],
    "[Media output attached in the next message]",
)
# A stand-in part for a clip (replaced after lowering; its bytes are never decoded).
_STAND_IN = pb.Part(image=pb.ImagePart(data=b"clip", media_type="image/png"))


@dataclass(frozen=True)
class MediaConversation:
    """A request as a client sends it (clips as stand-ins), and its clips' kinds in prompt order."""

    shape: str
    messages: list[pb.Message]
    # The chat template's item per clip: "video", "audio" (or "image" for the image controls).
    media: tuple[str, ...]
    tools: list[pb.Tool] = field(default_factory=list)


def _text(text: str) -> pb.Part:
    return pb.Part(text=pb.TextPart(text=text))


def _user(*parts: pb.Part) -> pb.Message:
    return pb.Message(role=pb.ROLE_USER, parts=list(parts))


def _record_tool(kind: MediaKind) -> pb.Tool:
    parameters = {"type": "object", "properties": {}}
    return pb.Tool(
        function=pb.FunctionTool(
            name=TOOL_NAMES[kind], description=TOOL_DESCRIPTIONS[kind], parameters_json=json.dumps(parameters)
        )
    )


def user_clip(kind: MediaKind, *, text_first: bool = False, present: bool = True) -> MediaConversation:
    """One user turn: the clip and the question (the clip left out when not `present`)."""
    question = _text(QUESTIONS[kind])
    parts = [question] if not present else ([question, _STAND_IN] if text_first else [_STAND_IN, question])
    shape = "user_text_first" if text_first else "user_clip"
    return MediaConversation(shape, [_user(*parts)], (kind,) if present else ())


def tool_clip(kind: MediaKind, *, with_text: bool = True) -> MediaConversation:
    """The agent loop: the question, the assistant's recording call, the clip as its output."""
    call = pb.ToolCall(id=TOOL_CALL_ID, name=TOOL_NAMES[kind], arguments="{}")
    output_parts = [_text(RECORDED_TEXT), _STAND_IN] if with_text else [_STAND_IN]
    messages = [
        _user(_text(AGENT_PROMPTS[kind])),
        pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[call]),
        pb.Message(
            role=pb.ROLE_TOOL,
            tool_output=pb.ToolOutput(call_id=TOOL_CALL_ID, parts=pb.PartList(parts=output_parts)),
        ),
    ]
    shape = "tool_clip_text" if with_text else "tool_clip_only"
    return MediaConversation(shape, messages, (kind,), [_record_tool(kind)])


def follow_up_clip(kind: MediaKind, previous_answer: str) -> MediaConversation:
    """A replayed exchange about an earlier clip, then a new clip and the question again."""
    messages = [
        _user(_STAND_IN, _text(QUESTIONS[kind])),
        pb.Message(role=pb.ROLE_ASSISTANT, parts=[_text(previous_answer)]),
        _user(_STAND_IN, _text(QUESTIONS[kind])),
    ]
    return MediaConversation("follow_up", messages, (kind, kind))


def _with_marker(tool_text: str, marker: str) -> str:
    """The lowered tool text with its image marker line replaced by `marker` (or dropped)."""
    lines = [line for line in tool_text.split("\n") if line != IMAGE_FOLLOW_UP_MARKER]
    if marker and len(lines) < len(tool_text.split("\n")):
        lines.append(marker)
    return "\n".join(lines)


def render(conversation: MediaConversation, template: Any, marker: str | None = None) -> str:
    """The prompt text the engine would render, `<|video|>` / `<|audio|>` where the clips go;
    a tool output's marker line is `marker` (default: the engine's for the clip's kind)."""
    if marker is None:
        marker = FOLLOW_UP_MARKERS.get(conversation.media[-1], NO_MARKER) if conversation.media else NO_MARKER
    converted = to_template_conversation(conversation.messages, tools=conversation.tools)
    kinds = iter(conversation.media)
    messages: list[dict[str, Any]] = []
    for message in converted.messages:
        content = message["content"]
        if isinstance(content, list):
            content = [{"type": next(kinds)} if item == {"type": "image"} else item for item in content]
        elif message["role"] == "tool":
            content = _with_marker(content, marker)
        messages.append({**message, "content": content})
    if next(kinds, None) is not None:
        raise AssertionError("a clip was not placed")
    return render_conversation(replace(converted, messages=messages, images=()), template).text


ShapeBuilder = Callable[[MediaKind, str], MediaConversation]
# shape -> (kind, a previous answer for follow-ups) -> conversation with its clips.
SHAPES: dict[str, ShapeBuilder] = {
    "user_clip": lambda kind, _: user_clip(kind),
    "user_text_first": lambda kind, _: user_clip(kind, text_first=True),
    "tool_clip_text": lambda kind, _: tool_clip(kind),
    "tool_clip_only": lambda kind, _: tool_clip(kind, with_text=False),
    "follow_up": follow_up_clip,
}


def as_image(conversation: MediaConversation) -> MediaConversation:
    """The same conversation with its clips given as images (the single-frame control)."""
    return replace(conversation, media=tuple("image" for _ in conversation.media))


def missing_clip_conversations(kind: MediaKind) -> Sequence[MediaConversation]:
    """The no-media controls for `kind`: the question alone (-> `no video` / `no audio`)."""
    return (user_clip(kind, present=False),)

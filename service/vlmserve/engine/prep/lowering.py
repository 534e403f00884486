"""The image follow-up lowering (docs/responses-api.md, "The image follow-up lowering") on contract
messages: the chat template's rule, so it lives here, where the template is rendered
(`prompt.py`), and runs once. Callers (the facade, the client library, raw gRPC clients) send the
conversation as the client gave it; errors name their paths in that conversation.

Chat templates only render image placeholders inside user turns, and tool turns only take
text. So, before a conversation is rendered:

* a tool output given as a part list becomes text: its text parts joined by "\\n", the parts
  that are neither text nor media as one JSON-array line, and a marker line for each kind of
  media it held (images, video, audio: `FOLLOW_UP_MARKERS`); its media then follow in a new
  user turn inserted right after it;
* an assistant, system or developer turn keeps its text and its media move to a new user
  turn right after it (no marker line);
* user turns keep their media where they are.

File, video and audio parts are placed like images (video and audio are rendered by the
family's processor, prep/clip_inputs.py; files are refused by name), so they are never silently
turned into text or dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vlmserve.engine.request_errors import invalid_argument
from vlmserve.engine.v1 import engine_pb2 as pb

IMAGE_FOLLOW_UP_MARKER = "[Image output attached in the next message]"
VIDEO_FOLLOW_UP_MARKER = "[Video output attached in the next message]"
AUDIO_FOLLOW_UP_MARKER = "[Audio output attached in the next message]"
# The line a tool output's text gets per kind of media that follows it, in this order.
FOLLOW_UP_MARKERS = {
    "image": IMAGE_FOLLOW_UP_MARKER,
    "video": VIDEO_FOLLOW_UP_MARKER,
    "audio": AUDIO_FOLLOW_UP_MARKER,
}

_MEDIA_KINDS = frozenset({"image", "file", "video", "audio"})


@dataclass(frozen=True, slots=True)
class LoweredMessage:
    """One message of a lowered conversation and where its content was in the caller's list."""

    message: pb.Message
    # Field path of the message it came from ("messages[2]"), and of each of its parts
    # ("messages[2].tool_output.parts.parts[1]" for an image moved out of a tool output).
    source: str
    part_sources: tuple[str, ...]


def lower_conversation(messages: Sequence[pb.Message]) -> list[LoweredMessage]:
    """The lowering, keeping each part's field path in `messages` (for errors that name it).

    Pure: the input messages are not modified. Idempotent: lowering a lowered conversation
    returns an equal one.
    """
    lowered: list[LoweredMessage] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        media: list[tuple[pb.Part, str]]
        if message.role == pb.ROLE_TOOL:
            tool_message, media = _lower_tool_message(message, where)
            lowered.append(LoweredMessage(tool_message, where, ()))
        elif message.role == pb.ROLE_USER:
            sources = tuple(f"{where}.parts[{n}]" for n in range(len(message.parts)))
            lowered.append(LoweredMessage(_copy(message), where, sources))
            continue
        elif message.role in (pb.ROLE_ASSISTANT, pb.ROLE_SYSTEM, pb.ROLE_DEVELOPER):
            placed = [(part, f"{where}.parts[{n}]") for n, part in enumerate(message.parts)]
            kept = [(part, source) for part, source in placed if part.WhichOneof("kind") not in _MEDIA_KINDS]
            media = [(part, source) for part, source in placed if part.WhichOneof("kind") in _MEDIA_KINDS]
            turn = _copy(message)
            del turn.parts[:]
            turn.parts.extend(part for part, _ in kept)
            lowered.append(LoweredMessage(turn, where, tuple(source for _, source in kept)))
        else:
            raise invalid_argument(
                "every message needs a role (system, developer, user, assistant or tool)",
                field=f"{where}.role",
            )
        if media:
            follow_up = pb.Message(role=pb.ROLE_USER, parts=[part for part, _ in media])
            lowered.append(LoweredMessage(follow_up, where, tuple(source for _, source in media)))
    return lowered


def lower_messages(messages: Sequence[pb.Message]) -> list[pb.Message]:
    """Lower a conversation so that media appear only in user turns and tool outputs are text.

    Pure and idempotent (see `lower_conversation`, which also says where each part came from).
    """
    return [lowered.message for lowered in lower_conversation(messages)]


def tool_output_text(parts: Sequence[pb.Part]) -> str:
    """The text a part-list tool output lowers to (rules 3.1-3.3), media aside: a marker line
    per kind of media that follows (an image's, a video's, an audio clip's)."""
    texts: list[str] = []
    leftovers: list[str] = []
    media: set[str] = set()
    for part in parts:
        kind = part.WhichOneof("kind")
        if kind == "text":
            texts.append(part.text.text)
        elif kind == "json":
            leftovers.append(part.json.json)
        elif kind in FOLLOW_UP_MARKERS:
            media.add(kind)
    lines = list(texts)
    if leftovers:
        # Equals json.dumps(list_of_leftovers) because each JsonPart holds json.dumps(part).
        lines.append("[" + ", ".join(leftovers) + "]")
    lines += [marker for kind, marker in FOLLOW_UP_MARKERS.items() if kind in media]
    return "\n".join(lines)


def _lower_tool_message(message: pb.Message, where: str) -> tuple[pb.Message, list[tuple[pb.Part, str]]]:
    if len(message.parts):
        raise invalid_argument(
            "a tool message carries its content in tool_output, not in parts", field=f"{where}.parts"
        )
    turn = _copy(message)
    if message.tool_output.WhichOneof("output") != "parts":
        return turn, []
    parts = message.tool_output.parts.parts
    sources = [f"{where}.tool_output.parts.parts[{n}]" for n in range(len(parts))]
    for part, source in zip(parts, sources, strict=True):
        if part.WhichOneof("kind") is None:
            # Refused rather than skipped: the caller sent a part and it would vanish.
            raise invalid_argument("a tool output part has no content", field=source)
    turn.tool_output.text = tool_output_text(parts)  # replaces the `parts` arm of the oneof
    media = [
        (_copy_part(part), source)
        for part, source in zip(parts, sources, strict=True)
        if part.WhichOneof("kind") in _MEDIA_KINDS
    ]
    return turn, media


def _copy(message: pb.Message) -> pb.Message:
    copy = pb.Message()
    copy.CopyFrom(message)
    return copy


def _copy_part(part: pb.Part) -> pb.Part:
    copy = pb.Part()
    copy.CopyFrom(part)
    return copy

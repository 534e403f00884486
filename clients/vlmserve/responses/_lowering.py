"""The image follow-up lowering (spec §3, §4) on contract messages.

Chat templates only render image placeholders inside user turns, and tool turns only take
text. So, before a conversation reaches the engine:

* a tool output given as a part list becomes text: its text parts joined by "\\n", the parts
  that are neither text nor media as one JSON-array line, and, when it held images, the
  marker line; its media then follow in a new user turn inserted right after it;
* an assistant, system or developer turn keeps its text and its media move to a new user
  turn right after it (no marker line);
* user turns keep their media where they are.

File parts are placed like images (they are media the engine refuses by name until files
are supported), so they are never silently turned into text.
"""

from __future__ import annotations

from collections.abc import Sequence

from vlmserve.engine.v1 import engine_pb2 as pb

from ._errors import InvalidRequestError

IMAGE_FOLLOW_UP_MARKER = "[Image output attached in the next message]"

_MEDIA_KINDS = frozenset({"image", "file"})


def lower_messages(messages: Sequence[pb.Message]) -> list[pb.Message]:
    """Lower a conversation so that media appear only in user turns and tool outputs are text.

    Pure: the input messages are not modified. Idempotent: lowering a lowered conversation
    returns an equal one.
    """
    lowered: list[pb.Message] = []
    for index, message in enumerate(messages):
        if message.role == pb.ROLE_TOOL:
            tool_message, media = _lower_tool_message(message, index)
            lowered.append(tool_message)
        elif message.role == pb.ROLE_USER:
            lowered.append(_copy(message))
            continue
        elif message.role in (pb.ROLE_ASSISTANT, pb.ROLE_SYSTEM, pb.ROLE_DEVELOPER):
            kept = [part for part in message.parts if part.WhichOneof("kind") not in _MEDIA_KINDS]
            media = [part for part in message.parts if part.WhichOneof("kind") in _MEDIA_KINDS]
            turn = _copy(message)
            del turn.parts[:]
            turn.parts.extend(kept)
            lowered.append(turn)
        else:
            raise InvalidRequestError(
                "every message needs a role (system, developer, user, assistant or tool)",
                param=f"messages[{index}].role",
            )
        if media:
            lowered.append(pb.Message(role=pb.ROLE_USER, parts=media))
    return lowered


def tool_output_text(parts: Sequence[pb.Part]) -> str:
    """The text a part-list tool output lowers to (rules 3.1-3.3), media aside."""
    texts: list[str] = []
    leftovers: list[str] = []
    image_count = 0
    for part in parts:
        kind = part.WhichOneof("kind")
        if kind == "text":
            texts.append(part.text.text)
        elif kind == "json":
            leftovers.append(part.json.json)
        elif kind == "image":
            image_count += 1
    lines = list(texts)
    if leftovers:
        # Equals json.dumps(list_of_leftovers) because each JsonPart holds json.dumps(part).
        lines.append("[" + ", ".join(leftovers) + "]")
    if image_count:
        lines.append(IMAGE_FOLLOW_UP_MARKER)
    return "\n".join(lines)


def _lower_tool_message(message: pb.Message, index: int) -> tuple[pb.Message, list[pb.Part]]:
    if len(message.parts):
        raise InvalidRequestError(
            "a tool message carries its content in tool_output, not in parts",
            param=f"messages[{index}].parts",
        )
    turn = _copy(message)
    if message.tool_output.WhichOneof("output") != "parts":
        return turn, []
    parts = message.tool_output.parts.parts
    turn.tool_output.text = tool_output_text(parts)  # replaces the `parts` arm of the oneof
    media = [_copy_part(part) for part in parts if part.WhichOneof("kind") in _MEDIA_KINDS]
    return turn, media


def _copy(message: pb.Message) -> pb.Message:
    copy = pb.Message()
    copy.CopyFrom(message)
    return copy


def _copy_part(part: pb.Part) -> pb.Part:
    copy = pb.Part()
    copy.CopyFrom(part)
    return copy

"""Responses input items (spec §1) -> raw contract messages, faithful to what the client sent.

Raw means not yet lowered: tool outputs keep their part lists, images stay where the client
put them. `lower_messages` turns these into what the engine renders.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from vlmserve.common.images import ImageLimits
from vlmserve.engine.v1 import engine_pb2 as pb

from ._errors import InvalidRequestError
from ._json import as_list, as_object, join, missing, one_of, optional_str, required_str, wrong_type
from ._media import ImageSource, MediaPolicy
from ._parts import parse_message_part, parse_tool_output_part

ItemResolver = Callable[[str], "Mapping[str, Any] | None"]
# (namespace or None, name) -> the tool name the model is offered; see _tools.
CallNamer = Callable[[str | None, str], str]

INPUT_ITEM_TYPES = (
    "message",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "reasoning",
    "item_reference",
)
MESSAGE_ROLES: dict[str, pb.Role.ValueType] = {
    "user": pb.ROLE_USER,
    "assistant": pb.ROLE_ASSISTANT,
    "system": pb.ROLE_SYSTEM,
    "developer": pb.ROLE_DEVELOPER,
}


def input_to_messages(
    input: str | list[Any],
    *,
    instructions: str | None = None,
    resolve_item: ItemResolver | None = None,
    image_source: ImageSource | None = None,
    image_limits: ImageLimits | None = None,
) -> list[pb.Message]:
    """Translate `input` (and `instructions`) into raw contract messages.

    Raises InvalidRequestError (with the JSON path in `param`) for anything malformed or
    unsupported, and for an input with no content at all. Images count as content.
    """
    media = MediaPolicy(image_source=image_source, limits=image_limits or ImageLimits())
    messages = items_to_messages(input_entries(input), media=media, resolve_item=resolve_item)
    require_content(messages)
    return with_instructions(instructions, messages)


def input_entries(input: object, path: str = "input") -> list[tuple[str, Any]]:
    """(JSON path, item) pairs for `input`; a string is one user message."""
    if isinstance(input, str):
        return [(path, {"type": "message", "role": "user", "content": input})]
    return [(join(path, index), item) for index, item in enumerate(as_list_or_string(input, path))]


def as_list_or_string(value: object, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise wrong_type(path, "a string or an array of input items", value)
    return value


def with_instructions(instructions: str | None, messages: list[pb.Message]) -> list[pb.Message]:
    if not instructions:
        return messages
    system = pb.Message(role=pb.ROLE_SYSTEM, parts=[pb.Part(text=pb.TextPart(text=instructions))])
    return [system, *messages]


def require_content(messages: Sequence[pb.Message], param: str = "input") -> None:
    """An input is empty when it holds no text, no media, no tool call and no tool output."""
    if not any(_has_content(message) for message in messages):
        raise InvalidRequestError(
            f"Invalid value for '{param}': the input is empty; send at least one text, image or tool item.",
            param=param,
            code="invalid_value",
        )


def _has_content(message: pb.Message) -> bool:
    if message.tool_calls or message.HasField("tool_output"):
        return True
    return any(part.WhichOneof("kind") != "text" or part.text.text.strip() for part in message.parts)


def items_to_messages(
    entries: Iterable[tuple[str, Any]],
    *,
    media: MediaPolicy,
    resolve_item: ItemResolver | None = None,
    call_name: CallNamer | None = None,
) -> list[pb.Message]:
    """Translate (JSON path, item) pairs, in order, into raw contract messages."""
    converter = _ItemConverter(media, resolve_item, call_name or _bare_name)
    for path, item in entries:
        converter.add(item, path)
    return converter.messages


def _bare_name(namespace: str | None, name: str) -> str:
    return name


class _ItemConverter:
    def __init__(self, media: MediaPolicy, resolve_item: ItemResolver | None, call_name: CallNamer) -> None:
        self.messages: list[pb.Message] = []
        self._media = media
        self._resolve_item = resolve_item
        self._call_name = call_name

    def add(self, item: object, path: str) -> None:
        obj = as_object(item, path)
        item_type = _item_type(obj, path)
        if item_type == "item_reference":
            obj = self._resolve(obj, path)
            item_type = _item_type(obj, path)
            if item_type == "item_reference":
                raise InvalidRequestError(
                    f"Invalid value for '{join(path, 'id')}': the referenced item is itself a reference.",
                    param=join(path, "id"),
                )
        if item_type == "message":
            self._add_message(obj, path)
        elif item_type == "function_call":
            name = self._call_name(optional_str(obj, "namespace", path), required_str(obj, "name", path))
            self._add_call(obj, path, name, required_str(obj, "arguments", path), pb.TOOL_KIND_FUNCTION)
        elif item_type == "custom_tool_call":
            name = self._call_name(optional_str(obj, "namespace", path), required_str(obj, "name", path))
            self._add_call(obj, path, name, required_str(obj, "input", path), pb.TOOL_KIND_CUSTOM)
        elif item_type == "function_call_output":
            self._add_output(obj, path, pb.TOOL_KIND_FUNCTION)
        elif item_type == "custom_tool_call_output":
            self._add_output(obj, path, pb.TOOL_KIND_CUSTOM)
        # "reasoning": accepted and not rendered; nothing reaches the model from it.

    def _resolve(self, obj: Mapping[str, Any], path: str) -> Mapping[str, Any]:
        item_id = required_str(obj, "id", path)
        found = self._resolve_item(item_id) if self._resolve_item is not None else None
        if found is None:
            raise InvalidRequestError(
                f"Invalid value for '{join(path, 'id')}': no stored item has this id.",
                param=join(path, "id"),
                code="invalid_value",
            )
        return as_object(found, path)

    def _add_message(self, obj: Mapping[str, Any], path: str) -> None:
        role = one_of(required_str(obj, "role", path), tuple(MESSAGE_ROLES), join(path, "role"))
        content = obj.get("content")
        content_path = join(path, "content")
        if content is None:
            raise missing(content_path)
        if isinstance(content, str):
            parts = [pb.Part(text=pb.TextPart(text=content))]
        else:
            parts = [
                parse_message_part(part, join(content_path, index), self._media)
                for index, part in enumerate(as_list(content, content_path))
            ]
        self.messages.append(pb.Message(role=MESSAGE_ROLES[role], parts=parts))

    def _add_call(
        self, obj: Mapping[str, Any], path: str, name: str, arguments: str, kind: pb.ToolKind.ValueType
    ) -> None:
        call = pb.ToolCall(id=required_str(obj, "call_id", path), name=name, arguments=arguments, kind=kind)
        last = self.messages[-1] if self.messages else None
        # Calls join the assistant turn they follow (one turn: text, then its calls), unless
        # that turn has images: those move to a user turn after it, which would separate the
        # calls from their outputs.
        if (
            last is not None
            and last.role == pb.ROLE_ASSISTANT
            and not any(part.WhichOneof("kind") in ("image", "file") for part in last.parts)
        ):
            last.tool_calls.append(call)
        else:
            self.messages.append(pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[call]))

    def _add_output(self, obj: Mapping[str, Any], path: str, kind: pb.ToolKind.ValueType) -> None:
        call_id = required_str(obj, "call_id", path)
        output = obj.get("output")
        output_path = join(path, "output")
        if output is None:
            raise missing(output_path)
        if isinstance(output, str):
            tool_output = pb.ToolOutput(call_id=call_id, kind=kind, text=output)
        elif isinstance(output, list):
            parts = [
                parse_tool_output_part(part, join(output_path, index), self._media)
                for index, part in enumerate(output)
            ]
            tool_output = pb.ToolOutput(call_id=call_id, kind=kind, parts=pb.PartList(parts=parts))
        else:
            raise wrong_type(output_path, "a string or an array of content parts", output)
        self.messages.append(pb.Message(role=pb.ROLE_TOOL, tool_output=tool_output))


def is_item_reference(item: object) -> bool:
    """Whether an input item is an `item_reference` (typed, or a bare `{"id": ...}`)."""
    if not isinstance(item, Mapping):
        return False
    item_type = item.get("type")
    return item_type == "item_reference" or (item_type is None and "role" not in item and "id" in item)


def _item_type(obj: Mapping[str, Any], path: str) -> str:
    item_type = obj.get("type")
    type_path = join(path, "type")
    if item_type is None:
        # Easy-input messages carry only role + content; a bare {"id"} is an item reference.
        if "role" in obj:
            return "message"
        if "id" in obj:
            return "item_reference"
        raise missing(type_path)
    if not isinstance(item_type, str):
        raise wrong_type(type_path, "a string", item_type)
    if item_type not in INPUT_ITEM_TYPES:
        raise InvalidRequestError(
            f"Invalid value for '{type_path}': unsupported input item type; supported: "
            + ", ".join(INPUT_ITEM_TYPES)
            + ".",
            param=type_path,
            code="invalid_value",
        )
    return item_type

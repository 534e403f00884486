"""Responses input items (docs/responses-api.md, Input) -> raw contract messages, as sent.

Raw means not lowered: tool outputs keep their part lists, images stay where the client put
them. The engine lowers them where it renders the chat template (vlmserve.engine.prep.lowering).
Items are validated by their models (`_request_models`); raw JSON items (replayed, referenced)
are validated here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from vlmserve.common.documents import DocumentLimits
from vlmserve.common.images import ImageLimits
from vlmserve.common.wire_encode import HeldTexts
from vlmserve.engine.v1 import engine_pb2 as pb

from ._budget import item_image_count
from ._compaction import KEPT_IMAGES_HEADING, SUMMARY_HEADING
from ._computer import COMPUTER_CALL_NAME, ComputerCallOutputParam, ComputerCallParam, call_actions
from ._errors import InvalidRequestError
from ._input_models import (
    INPUT_ITEM_TYPES,
    CompactionParam,
    CompactionTriggerParam,
    CustomToolCallOutputParam,
    CustomToolCallParam,
    FunctionCallOutputParam,
    FunctionCallParam,
    InputImagePartParam,
    ItemReferenceParam,
    MessageParam,
    ReasoningParam,
    parse_input,
    parse_item,
)
from ._json import join
from ._media import FileSource, ImageSource, MediaPolicy, PdfRenderer
from ._output_models import (
    ComputerCallItem,
    CustomToolCallItem,
    FunctionCallItem,
    OutputItem,
    OutputMessage,
    ReasoningItem,
)
from ._parts import add_message_part, add_tool_output_part, hold
from ._validation import RequestModel

__all__ = [
    "INPUT_ITEM_TYPES",
    "ItemResolver",
    "input_entries",
    "input_to_messages",
    "is_item_reference",
    "items_to_messages",
]

ItemResolver = Callable[[str], "Mapping[str, Any] | None"]
# (namespace or None, name) -> the tool name the model is offered; see _tools.
CallNamer = Callable[[str | None, str], str]

MESSAGE_ROLES: dict[str, pb.Role.ValueType] = {
    "user": pb.ROLE_USER,
    "assistant": pb.ROLE_ASSISTANT,
    "system": pb.ROLE_SYSTEM,
    "developer": pb.ROLE_DEVELOPER,
}


def input_to_messages(
    input: object,
    *,
    instructions: str | None = None,
    resolve_item: ItemResolver | None = None,
    image_source: ImageSource | None = None,
    image_limits: ImageLimits | None = None,
    file_source: FileSource | None = None,
    document_limits: DocumentLimits | None = None,
    pdf_renderer: PdfRenderer | None = None,
    max_images: int | None = None,
    clip_source: ImageSource | None = None,
) -> list[pb.Message]:
    """Translate `input` (and `instructions`) into raw contract messages.

    Raises InvalidRequestError (with the JSON path in `param`) for anything malformed or
    unsupported, for an input with no content at all (images count as content), and for more
    than `max_images` images (None: no bound; PDF pages included).
    """
    media = MediaPolicy.for_request(
        image_source=image_source,
        image_limits=image_limits,
        file_source=file_source,
        document_limits=document_limits,
        pdf_renderer=pdf_renderer,
        max_images=max_images,
        clip_source=clip_source,
    )
    messages = items_to_messages(input_entries(parse_input(input)), media=media, resolve_item=resolve_item)
    require_content(messages)
    return with_instructions(instructions, messages)


def input_entries(input: str | Sequence[Any], path: str = "input") -> list[tuple[str, Any]]:
    """(JSON path, item) pairs for a validated `input`; a string is one user message."""
    if isinstance(input, str):
        return [(path, MessageParam(role="user", content=input))]
    return [(join(path, index), item) for index, item in enumerate(input)]


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
    """Translate (JSON path, item) pairs, in order, into raw contract messages; their images are
    charged to `media.budget`, all of them before any is decoded."""
    typed = typed_items(entries, media=media, resolve_item=resolve_item)
    media.budget.check_images()
    return typed_items_to_messages(typed, media=media, call_name=call_name)


def typed_items(
    entries: Iterable[tuple[str, Any]], *, media: MediaPolicy, resolve_item: ItemResolver | None = None
) -> list[tuple[str, Any]]:
    """(JSON path, item) pairs validated (raw JSON items: replayed, referenced), references
    resolved, and the images of their image parts counted in `media.budget` (checked by the caller,
    once every item the request holds is counted)."""
    typed: list[tuple[str, Any]] = []
    for path, item in entries:
        if not isinstance(item, RequestModel):
            item = parse_item(item, path)
        if isinstance(item, ItemReferenceParam):
            item = _resolve(item, path, resolve_item)
        media.budget.count_images(item_image_count(item))
        typed.append((path, item))
    return typed


def after_latest_compaction(typed: Sequence[tuple[str, Any]]) -> tuple[list[tuple[str, Any]], bool]:
    """The items a prompt holds when the input carries a compaction item: the latest one covers
    everything before it (and the turns an earlier response or conversation would replay), so
    only system and developer messages before it stay. Whether there was one."""
    latest = next(
        (index for index in range(len(typed) - 1, -1, -1) if isinstance(typed[index][1], CompactionParam)),
        None,
    )
    if latest is None:
        return list(typed), False
    kept = [
        entry
        for entry in typed[:latest]
        if isinstance(entry[1], MessageParam) and entry[1].role in ("system", "developer")
    ]
    return [*kept, *typed[latest:]], True


def after_latest_summary(history: Sequence[pb.Message]) -> Sequence[pb.Message]:
    """Earlier turns from the latest compaction summary on (a compacted turn stored its input
    compacted; what came before it is covered by its summary)."""
    for index in range(len(history) - 1, -1, -1):
        message = history[index]
        if (
            message.role == pb.ROLE_ASSISTANT
            and message.parts
            and message.parts[0].HasField("text")
            and message.parts[0].text.text.startswith(SUMMARY_HEADING)
        ):
            return history[index:]
    return history


def typed_items_to_messages(
    typed: Iterable[tuple[str, Any]],
    *,
    media: MediaPolicy,
    call_name: CallNamer | None = None,
    held: HeldTexts | None = None,
    part_paths: dict[str, str] | None = None,
) -> list[pb.Message]:
    """Items from `typed_items`, in order, as raw contract messages (images decoded here).
    With `held`, long texts are held there and their markers put in the messages. `part_paths`
    gets where each content and tool output part came from (`messages[1].parts[0]` ->
    `input[0].content[0]`, indexes of the returned list), for the engine's errors."""
    converter = _ItemConverter(media, call_name or bare_call_name, held)
    for path, item in typed:
        converter.add(item, path)
    if part_paths is not None:
        part_paths.update(converter.part_paths)
    return converter.messages


def output_items_to_messages(
    items: Iterable[OutputItem], *, call_name: CallNamer | None = None
) -> list[pb.Message]:
    """A response's own output, as its result made it (typed, never through JSON), as the raw
    contract messages a later turn replays: the same turn rules as replayed input items."""
    converter = _ItemConverter(MediaPolicy(), call_name or bare_call_name)
    for item in items:
        converter.add_output(item)
    return converter.messages


def bare_call_name(namespace: str | None, name: str) -> str:
    """The call namer without a request's tools: the name as it is."""
    return name


def _resolve(reference: ItemReferenceParam, path: str, resolve_item: ItemResolver | None) -> Any:
    id_path = join(path, "id")
    found = resolve_item(reference.id) if resolve_item is not None else None
    if found is None:
        raise InvalidRequestError(
            f"Invalid value for '{id_path}': no stored item has this id.",
            param=id_path,
            code="invalid_value",
        )
    item = parse_item(found, path)
    if isinstance(item, ItemReferenceParam):
        raise InvalidRequestError(
            f"Invalid value for '{id_path}': the referenced item is itself a reference.", param=id_path
        )
    return item


class _ItemConverter:
    def __init__(self, media: MediaPolicy, call_name: CallNamer, held: HeldTexts | None = None) -> None:
        self.messages: list[pb.Message] = []
        # Contract part path (in `messages`) -> the JSON path of the part it came from.
        self.part_paths: dict[str, str] = {}
        self._media = media
        self._held = held
        self._call_name = call_name
        # Reasoning items waiting for the assistant turn they preceded.
        self._reasoning: list[str] = []

    def add(self, item: object, path: str) -> None:
        """One item from `typed_items` (validated, references resolved)."""
        if isinstance(item, ReasoningParam):
            if item.text:
                self._reasoning.append(item.text)
            return
        if isinstance(item, CompactionTriggerParam):
            raise InvalidRequestError(
                f"Invalid value for '{path}': a compaction_trigger item must be the last input item.",
                param=path,
                code="invalid_value",
            )
        if isinstance(item, CompactionParam):
            # The summary of what came before: the model reads it as its own earlier turn; the
            # screenshots it kept, as a user turn (where templates render images).
            text = SUMMARY_HEADING + item.summary
            self.messages.append(
                pb.Message(role=pb.ROLE_ASSISTANT, parts=[pb.Part(text=pb.TextPart(text=text))])
            )
            images = item.state.images
            if images:
                parts = [pb.Part(text=pb.TextPart(text=KEPT_IMAGES_HEADING))]
                parts += [
                    pb.Part(image=pb.ImagePart(data=image.data, media_type=image.media_type))
                    for image in images
                ]
                self.messages.append(pb.Message(role=pb.ROLE_USER, parts=parts))
        elif isinstance(item, MessageParam):
            self._add_message(item, path)
        elif isinstance(item, FunctionCallParam):
            name = self._call_name(item.namespace, item.name)
            self._add_call(item.call_id, name, item.arguments, pb.TOOL_KIND_FUNCTION)
        elif isinstance(item, CustomToolCallParam):
            name = self._call_name(item.namespace, item.name)
            self._add_call(item.call_id, name, item.input, pb.TOOL_KIND_CUSTOM)
        elif isinstance(item, FunctionCallOutputParam):
            self._add_output(item.call_id, item.output, path, pb.TOOL_KIND_FUNCTION)
        elif isinstance(item, CustomToolCallOutputParam):
            self._add_output(item.call_id, item.output, path, pb.TOOL_KIND_CUSTOM)
        elif isinstance(item, ComputerCallParam):
            for arguments in call_actions(item, path):
                self._add_call(item.call_id, COMPUTER_CALL_NAME, arguments, pb.TOOL_KIND_COMPUTER)
        elif isinstance(item, ComputerCallOutputParam):
            self._add_screenshot(item, path)
        # Thinking not followed by an assistant turn has nothing to belong to: dropped.
        self._reasoning.clear()

    def add_output(self, item: OutputItem) -> None:
        """One item of this server's own output: typed already, so nothing to validate."""
        if isinstance(item, ReasoningItem):
            # As ReasoningParam.text: the content's text, else the summary's.
            texts = [part.text for part in item.content] or [
                str(part.get("text", "")) for part in item.summary
            ]
            text = "\n\n".join(text for text in texts if text)
            if text:
                self._reasoning.append(text)
            return
        if isinstance(item, OutputMessage):
            parts = [pb.Part(text=pb.TextPart(text=part.text)) for part in item.content]
            self.messages.append(
                pb.Message(role=pb.ROLE_ASSISTANT, parts=parts, reasoning_text=self._take_reasoning())
            )
        elif isinstance(item, FunctionCallItem):
            name = self._call_name(item.namespace, item.name)
            self._add_call(item.call_id, name, item.arguments, pb.TOOL_KIND_FUNCTION)
        elif isinstance(item, CustomToolCallItem):
            name = self._call_name(item.namespace, item.name)
            self._add_call(item.call_id, name, item.input, pb.TOOL_KIND_CUSTOM)
        elif isinstance(item, ComputerCallItem):
            for action in item.actions or ([item.action] if item.action is not None else []):
                self._add_call(item.call_id, COMPUTER_CALL_NAME, json.dumps(action), pb.TOOL_KIND_COMPUTER)
        self._reasoning.clear()

    def _take_reasoning(self) -> str:
        text, self._reasoning = "\n\n".join(self._reasoning), []
        return text

    def _add_message(self, item: MessageParam, path: str) -> None:
        content_path = join(path, "content")
        role = MESSAGE_ROLES[item.role]
        reasoning = self._take_reasoning() if role == pb.ROLE_ASSISTANT else ""
        # Parts are added in place: a part built apart is copied into the message.
        message = pb.Message(role=role, reasoning_text=reasoning)
        if isinstance(item.content, str):
            message.parts.add().text.text = hold(self._held, item.content)
        else:
            where = f"messages[{len(self.messages)}].parts"
            for index, part in enumerate(item.content):
                first = len(message.parts)
                add_message_part(message.parts, part, join(content_path, index), self._media, self._held)
                for added in range(first, len(message.parts)):
                    self.part_paths[f"{where}[{added}]"] = join(content_path, index)
        self.messages.append(message)

    def _add_call(self, call_id: str, name: str, arguments: str, kind: pb.ToolKind.ValueType) -> None:
        call = pb.ToolCall(id=call_id, name=name, arguments=arguments, kind=kind)
        last = self.messages[-1] if self.messages else None
        reasoning = self._take_reasoning()
        # Calls join the assistant turn they follow (one turn: text, then its calls), unless
        # that turn has images: those move to a user turn after it, which would separate the
        # calls from their outputs; or thinking came between them: it opens a turn of its own.
        if (
            not reasoning
            and last is not None
            and last.role == pb.ROLE_ASSISTANT
            and not any(part.WhichOneof("kind") in ("image", "file") for part in last.parts)
        ):
            last.tool_calls.append(call)
        else:
            self.messages.append(
                pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[call], reasoning_text=reasoning)
            )

    def _add_screenshot(self, item: ComputerCallOutputParam, path: str) -> None:
        """The screenshot is the call's output: one image, read (data: URL, file, fetch policy)
        and lowered exactly as an image in a function call's output."""
        screenshot = item.output
        part = InputImagePartParam(
            type="input_image", image_url=screenshot.image_url, file_id=screenshot.file_id
        )
        message = pb.Message(
            role=pb.ROLE_TOOL, tool_output=pb.ToolOutput(call_id=item.call_id, kind=pb.TOOL_KIND_COMPUTER)
        )
        message.tool_output.parts.SetInParent()
        add_tool_output_part(
            message.tool_output.parts.parts, part, join(path, "output"), self._media, self._held
        )
        self.messages.append(message)

    def _add_output(
        self, call_id: str, output: str | list[Any], path: str, kind: pb.ToolKind.ValueType
    ) -> None:
        output_path = join(path, "output")
        message = pb.Message(role=pb.ROLE_TOOL, tool_output=pb.ToolOutput(call_id=call_id, kind=kind))
        tool_output = message.tool_output
        if isinstance(output, str):
            tool_output.text = hold(self._held, output)
        else:
            tool_output.parts.SetInParent()
            where = f"messages[{len(self.messages)}].tool_output.parts.parts"
            for index, part in enumerate(output):
                path = join(output_path, index)
                first = len(tool_output.parts.parts)
                add_tool_output_part(tool_output.parts.parts, part, path, self._media, self._held)
                for added in range(first, len(tool_output.parts.parts)):
                    self.part_paths[f"{where}[{added}]"] = path
        self.messages.append(message)


def is_item_reference(item: object) -> bool:
    """Whether an input item is an `item_reference` (`type` given, or a bare `{"id": ...}`; or a
    parsed `ItemReferenceParam`)."""
    if isinstance(item, ItemReferenceParam):
        return True
    if not isinstance(item, Mapping):
        return False
    item_type = item.get("type")
    return item_type == "item_reference" or (item_type is None and "role" not in item and "id" in item)

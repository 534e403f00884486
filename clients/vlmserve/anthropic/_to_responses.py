"""A Messages request as the Responses body that means the same (one translation).

Every Anthropic field maps onto a Responses field whose handling already exists: content blocks
-> input items and parts (images under the same decoding and remote-image policy, documents as
`input_file`, so PDFs become page text + page images), `tool_use` -> `function_call`,
`tool_result` -> `function_call_output` with the same part lists and image lowering, thinking ->
reasoning items, tools / tool_choice -> the grammar-enforced function tools; or onto engine
settings the Responses API has no field for (`stop_sequences`, `top_k`, the thinking switch:
the request's `extras`). What neither can carry is a 400 naming the Anthropic field.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from vlmserve.responses import CreateRequest, EngineExtras, InvalidRequestError, PathMap, translated_body

from ._computer import ComputerToolParam, responses_tool, to_responses_action
from ._request_models import (
    Base64SourceParam,
    ContentBlock,
    ContentSourceParam,
    CustomToolParam,
    DocumentBlockParam,
    FileSourceParam,
    ImageBlockParam,
    MessagesBody,
    OtherBlockParam,
    OtherSourceParam,
    OtherToolParam,
    PlainTextSourceParam,
    RedactedThinkingBlockParam,
    TextBlockParam,
    ThinkingBlockParam,
    ThinkingDisabledParam,
    ThinkingEnabledParam,
    ToolChoiceAnyParam,
    ToolChoiceNoneParam,
    ToolChoiceToolParam,
    ToolResultBlockParam,
    ToolUseBlockParam,
    URLSourceParam,
    parse_messages_body,
)

# What the model reads ahead of a tool result the client marked `is_error` (Responses outputs
# have no such flag, and it must not be dropped).
TOOL_ERROR_PREFIX = "[tool error]"
DEFAULT_DOCUMENT_NAME = "document"

# A part's field in the Responses body -> the Anthropic block's.
_PART_FIELDS = (
    (".image_url", ".source"),
    (".file_data", ".source.data"),
    (".file_id", ".source.file_id"),
    (".file_url", ".source.url"),
)
# Responses body fields the Messages request spells otherwise (the rest are spelt alike).
_BODY_FIELDS = (
    ("max_output_tokens", "max_tokens"),
    ("text.format", "output_format"),
    ("parallel_tool_calls", "tool_choice.disable_parallel_tool_use"),
    ("stop", "stop_sequences"),
    ("instructions", "system"),
)


@dataclass
class MessagesRequest:
    """A parsed Messages request: the create request it means (its Responses body, typed, and the
    engine settings that body has no field for), and whether it streams."""

    request: CreateRequest
    stream: bool = False
    # Each Responses field written -> the Anthropic path it came from (`input[3]` -> `messages[1]`).
    paths: PathMap = field(default_factory=PathMap)

    def anthropic_param(self, param: str) -> str:
        """A Responses field path (from the shared translation) as the Anthropic field it came
        from; a field both APIs spell alike (`temperature`) as it is."""
        return self.paths.rename(param)


def _unsupported(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"Invalid value for '{param}': {message}", param=param, code="unsupported_value"
    )


class _Items:
    """Builds the Responses input items, recording in `paths` where each item and part came from."""

    def __init__(self, paths: PathMap) -> None:
        self.items: list[dict[str, Any]] = []
        self._paths = paths
        self._parts: list[dict[str, Any]] = []
        self._part_origins: list[str] = []
        self._role = ""
        self._where = ""

    def add(self, item: dict[str, Any], where: str, part_origins: list[str] | None = None) -> None:
        self.flush()
        self._append(item, where, part_origins or [])

    def part(self, role: str, where: str, parts: list[tuple[dict[str, Any], str]]) -> None:
        """Parts of a message being gathered (flushed by the next item or role change)."""
        if self._role != role:
            self.flush()
            self._role, self._where = role, where
        for part, origin in parts:
            self._parts.append(part)
            self._part_origins.append(origin)

    def flush(self) -> None:
        if self._parts:
            item = {"type": "message", "role": self._role, "content": self._parts}
            self._append(item, self._where, self._part_origins)
        self._parts, self._part_origins, self._role = [], [], ""

    def _append(self, item: dict[str, Any], where: str, part_origins: list[str]) -> None:
        # A block's inner Responses fields (`call_id`, a part's `detail`) name the block itself.
        path = f"input[{len(self.items)}]"
        self.items.append(item)
        self._paths.add(path, where, extends=False)
        if item["type"] == "function_call":
            self._paths.add(f"{path}.arguments", f"{where}.input", extends=False)
        parts = "output" if item["type"] == "function_call_output" else "content"
        if part_origins:
            self._paths.add_parts(f"{path}.{parts}", part_origins, _PART_FIELDS)


def _data_url(media_type: str, data: str) -> str:
    return f"data:{media_type};base64,{data}"


def _image_part(block: ImageBlockParam, at: str) -> dict[str, Any]:
    source = block.source
    if isinstance(source, Base64SourceParam):
        return {
            "type": "input_image",
            "image_url": _data_url(source.media_type, source.data),
            "detail": "auto",
        }
    if isinstance(source, URLSourceParam):
        # The same remote-image policy as /v1/responses decides (fetched safely, or a 400).
        return {"type": "input_image", "image_url": source.url, "detail": "auto"}
    if isinstance(source, FileSourceParam):
        return {"type": "input_image", "file_id": source.file_id, "detail": "auto"}
    assert isinstance(source, OtherSourceParam)
    raise _unsupported(f"{at}.source.type", f"'{source.type}' image sources are not supported.")


def _document_parts(block: DocumentBlockParam, at: str) -> list[tuple[dict[str, Any], str]]:
    """A document as `input_file` (PDF pages -> page text + image, text -> framed text)."""
    source = block.source
    name = block.title or DEFAULT_DOCUMENT_NAME
    parts: list[tuple[dict[str, Any], str]] = []
    if block.context:
        parts.append(
            ({"type": "input_text", "text": f"[context of {name}]\n{block.context}"}, f"{at}.context")
        )
    if isinstance(source, Base64SourceParam):
        file = {
            "type": "input_file",
            "file_data": _data_url(source.media_type, source.data),
            "filename": name,
        }
        parts.append((file, at))
    elif isinstance(source, PlainTextSourceParam):
        data = base64.b64encode(source.data.encode("utf-8")).decode("ascii")
        parts.append(
            ({"type": "input_file", "file_data": _data_url("text/plain", data), "filename": name}, at)
        )
    elif isinstance(source, URLSourceParam):
        # Refused by the shared rule (file URLs are not fetched), naming `source.url`.
        parts.append(({"type": "input_file", "file_url": source.url, "filename": name}, at))
    elif isinstance(source, FileSourceParam):
        parts.append(({"type": "input_file", "file_id": source.file_id, "filename": name}, at))
    elif isinstance(source, ContentSourceParam):
        if block.title:
            parts.append(({"type": "input_text", "text": f"[document {name}]"}, f"{at}.title"))
        content = source.content
        if isinstance(content, str):
            parts.append(({"type": "input_text", "text": content}, f"{at}.source.content"))
        else:
            for index, inner in enumerate(content):
                where = f"{at}.source.content[{index}]"
                if isinstance(inner, TextBlockParam):
                    parts.append(({"type": "input_text", "text": inner.text}, where))
                elif isinstance(inner, ImageBlockParam):
                    parts.append((_image_part(inner, where), where))
                else:
                    raise _unsupported(
                        f"{where}.type", f"'{inner.type}' blocks are not supported in a document."
                    )
    else:
        assert isinstance(source, OtherSourceParam)
        raise _unsupported(f"{at}.source.type", f"'{source.type}' document sources are not supported.")
    return parts


# Block types clients try for video and audio (other APIs' part names among them).
_CLIP_BLOCKS = frozenset({"video", "audio", "input_video", "input_audio", "video_url", "audio_url"})


def _clip_hint(block_type: str) -> str | None:
    """Anthropic's Messages API has no video or audio block: say where they can go."""
    if block_type not in _CLIP_BLOCKS:
        return None
    return (
        f"'{block_type}' blocks are not supported: Anthropic Messages has no video or audio block; "
        "send video and audio on /v1/chat/completions or /v1/responses (docs/video-audio.md)."
    )


def _content_parts(block: object, at: str, *, text_type: str) -> list[tuple[dict[str, Any], str]] | None:
    """A text, image or document block as parts; None for any other block."""
    if isinstance(block, TextBlockParam):
        return [({"type": text_type, "text": block.text}, at)]
    if isinstance(block, ImageBlockParam):
        return [(_image_part(block, at), at)]
    if isinstance(block, DocumentBlockParam):
        return _document_parts(block, at)
    return None


def _tool_output(block: ToolResultBlockParam, at: str) -> tuple[str | list[dict[str, Any]], list[str]]:
    content = block.content
    if content is None or isinstance(content, str):
        text = content or ""
        if block.is_error:
            text = f"{TOOL_ERROR_PREFIX}\n{text}" if text else TOOL_ERROR_PREFIX
        return text, []
    parts: list[tuple[dict[str, Any], str]] = []
    if block.is_error:
        parts.append(({"type": "input_text", "text": TOOL_ERROR_PREFIX}, f"{at}.is_error"))
    for index, inner in enumerate(content):
        where = f"{at}.content[{index}]"
        converted = _content_parts(inner, where, text_type="input_text")
        if converted is None:
            raise _unsupported(
                f"{where}.type",
                _clip_hint(inner.type) or f"'{inner.type}' blocks are not supported in a tool_result.",
            )
        parts.extend(converted)
    return [part for part, _ in parts], [origin for _, origin in parts]


def _add_blocks(
    items: _Items, role: str, blocks: list[ContentBlock], where: str, computer: frozenset[str]
) -> None:
    text_type = "output_text" if role == "assistant" else "input_text"
    for index, block in enumerate(blocks):
        at = f"{where}.content[{index}]"
        parts = _content_parts(block, at, text_type=text_type)
        if parts is not None:
            items.part(role, where, parts)
        elif isinstance(block, ToolResultBlockParam) and role == "user":
            output, origins = _tool_output(block, at)
            item = {"type": "function_call_output", "call_id": block.tool_use_id, "output": output}
            items.add(item, at, origins)
        elif isinstance(block, ToolUseBlockParam) and role == "assistant" and block.name in computer:
            action = to_responses_action(block.input, f"{at}.input")
            items.add({"type": "computer_call", "call_id": block.id, "action": action}, at)
        elif isinstance(block, ToolUseBlockParam) and role == "assistant":
            arguments = json.dumps(block.input, ensure_ascii=False)
            items.add(
                {"type": "function_call", "call_id": block.id, "name": block.name, "arguments": arguments}, at
            )
        elif isinstance(block, ThinkingBlockParam) and role == "assistant":
            reasoning = {
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": block.thinking}],
            }
            items.add(reasoning, at)
        elif isinstance(block, RedactedThinkingBlockParam) and role == "assistant":
            # Encrypted by another server: kept as a reasoning item's encrypted_content, which (as
            # on /v1/responses) nothing here can read.
            items.add({"type": "reasoning", "summary": [], "encrypted_content": block.data}, at)
        else:
            known = not isinstance(block, OtherBlockParam)
            message = f"'{block.type}' blocks are " + (
                f"not allowed in a {role} message." if known else "not supported by this server."
            )
            raise _unsupported(f"{at}.type", _clip_hint(block.type) or message)
    items.flush()


def _input_items(body: MessagesBody, paths: PathMap) -> list[dict[str, Any]]:
    items = _Items(paths)
    system = body.system
    if isinstance(system, str) and system:
        items.add(
            {"type": "message", "role": "system", "content": [{"type": "input_text", "text": system}]},
            "system",
            ["system"],
        )
    elif isinstance(system, list) and system:
        parts = [
            ({"type": "input_text", "text": block.text}, f"system[{index}]")
            for index, block in enumerate(system)
        ]
        items.part("system", "system", parts)
        items.flush()
    for index, message in enumerate(body.messages):
        where = f"messages[{index}]"
        if isinstance(message.content, str):
            text_type = "output_text" if message.role == "assistant" else "input_text"
            items.part(
                message.role, where, [({"type": text_type, "text": message.content}, f"{where}.content")]
            )
            items.flush()
        else:
            _add_blocks(items, message.role, message.content, where, _computer_names(body))
    return items.items


def _computer_names(body: MessagesBody) -> frozenset[str]:
    """The computer tool's name, when the request declares one: its `tool_use` blocks are
    computer calls."""
    return frozenset(tool.name for tool in body.tools or () if isinstance(tool, ComputerToolParam))


def _tools(body: MessagesBody, paths: PathMap) -> list[dict[str, Any]] | None:
    if body.tools is None:
        return None
    tools: list[dict[str, Any]] = []
    for index, tool in enumerate(body.tools):
        paths.add(f"tools[{index}].parameters", f"tools[{index}].input_schema")
        if isinstance(tool, OtherToolParam):
            raise _unsupported(
                f"tools[{index}].type",
                f"'{tool.type}' is a server tool, which this server cannot run; "
                "declare a custom tool (name, description, input_schema) and run it in the client.",
            )
        if isinstance(tool, ComputerToolParam):
            tools.append(responses_tool(tool))
            continue
        assert isinstance(tool, CustomToolParam)
        tools.append(
            {
                "type": "function",
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.input_schema,
                "strict": tool.strict,
            }
        )
    return tools


def _tool_choice(body: MessagesBody) -> tuple[Any, bool | None]:
    """The Responses tool_choice and parallel_tool_calls."""
    choice = body.tool_choice
    if choice is None:
        return None, None
    if isinstance(choice, ToolChoiceNoneParam):
        return "none", None
    parallel = False if getattr(choice, "disable_parallel_tool_use", None) else None
    if isinstance(choice, ToolChoiceAnyParam):
        return "required", parallel
    if isinstance(choice, ToolChoiceToolParam):
        if choice.name in _computer_names(body):
            return {"type": "computer_use_preview"}, parallel
        return {"type": "function", "name": choice.name}, parallel
    return "auto", parallel


def _thinking(body: MessagesBody) -> bool | None:
    thinking = body.thinking
    if thinking is None:
        return None
    if isinstance(thinking, ThinkingDisabledParam):
        return False
    if (
        isinstance(thinking, ThinkingEnabledParam)
        and body.max_tokens is not None
        and thinking.budget_tokens >= body.max_tokens
    ):
        raise InvalidRequestError(
            "Invalid value for 'thinking.budget_tokens': must be less than 'max_tokens'.",
            param="thinking.budget_tokens",
        )
    return True


def _text_format(body: MessagesBody) -> dict[str, Any] | None:
    output_format = body.output_format
    if output_format is None and body.output_config is not None:
        output_format = body.output_config.format
    if output_format is None:
        return None
    return {
        "format": {"type": "json_schema", "name": "output", "schema": output_format.schema_, "strict": True}
    }


def _refuse_unsupported(body: MessagesBody) -> None:
    if body.mcp_servers:
        raise _unsupported(
            "mcp_servers", "MCP servers are not run by this server; declare their tools as custom tools."
        )
    if body.container is not None:
        raise _unsupported("container", "code execution containers are not supported by this server.")


def messages_request(raw: object, *, count_tokens: bool = False) -> MessagesRequest:
    """Validate a Messages body and translate it (InvalidRequestError naming the field)."""
    body = parse_messages_body(raw, count_tokens=count_tokens)
    _refuse_unsupported(body)
    stream = bool(body.stream) and not count_tokens
    paths = PathMap()
    # An input path no item recorded (the shared translation's `input`) names `messages`.
    paths.add("input", "messages", extends=False)
    for path, origin in _BODY_FIELDS:
        paths.add(path, origin)
    tool_choice, parallel = _tool_choice(body)
    responses_body: dict[str, Any] = {
        "model": body.model,
        "input": _input_items(body, paths),
        "store": False,
        "stream": stream,
    }
    optional: dict[str, Any] = {
        "tools": _tools(body, paths),
        "tool_choice": tool_choice,
        "parallel_tool_calls": parallel,
        "text": _text_format(body),
        "max_output_tokens": body.max_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
    }
    responses_body.update({key: value for key, value in optional.items() if value is not None})
    extras = EngineExtras(
        stop=tuple(body.stop_sequences or ()), top_k=body.top_k, enable_thinking=_thinking(body)
    )
    return MessagesRequest(
        request=CreateRequest(translated_body(responses_body, paths), extras),
        stream=stream,
        paths=paths,
    )

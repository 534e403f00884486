"""A finished response as an Anthropic `Message`: exact models of what goes out.

The shapes are Anthropic's (`anthropic.types.Message`, checked against the SDK in the tests);
they are written here so that the client library does not need the SDK.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeAlias

from pydantic import Field

from vlmserve.responses import (
    ComputerCallItem,
    FunctionCallItem,
    OutboundModel,
    OutputMessage,
    ReasoningItem,
    ResponseResource,
    Usage,
)

from ._computer import from_responses_action

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class TextBlock(OutboundModel):
    # No `citations` key (none are made): the AI SDK's schema refuses `"citations": null`.
    type: Literal["text"] = "text"
    text: str


class ThinkingBlock(OutboundModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    # Anthropic signs its thinking so that it can check a replay; nothing here checks it.
    signature: str = ""


class ToolUseBlock(OutboundModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


ContentBlock: TypeAlias = TextBlock | ThinkingBlock | ToolUseBlock


class MessageUsage(OutboundModel):
    # Prompt tokens not read from the prefix cache (Anthropic counts cached ones apart).
    input_tokens: int
    output_tokens: int
    # The engine keeps prompts' KV without being asked (no cache_control breakpoints needed) and
    # writing it costs nothing extra: no token is counted as a cache write.
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    service_tier: Literal["standard"] = "standard"


class Message(OutboundModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    content: list[ContentBlock] = Field(default_factory=list)
    model: str
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: MessageUsage


class TokenCount(OutboundModel):
    """`POST /v1/messages/count_tokens`."""

    input_tokens: int


def message_id(response_id: str) -> str:
    """The message's id: the response id with Anthropic's prefix (`resp_x` -> `msg_x`)."""
    return "msg_" + response_id.removeprefix("resp_")


def message_usage(usage: Usage | None) -> MessageUsage:
    if usage is None:
        return MessageUsage(input_tokens=0, output_tokens=0)
    cached = usage.input_tokens_details.cached_tokens
    return MessageUsage(
        input_tokens=usage.input_tokens - cached,
        output_tokens=usage.output_tokens,
        cache_read_input_tokens=cached,
    )


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the `input` object (the grammar makes them a JSON object; anything
    else, which only an unconstrained call could produce, is given back under `arguments`)."""
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return {"arguments": arguments}
    return parsed if isinstance(parsed, dict) else {"arguments": parsed}


def computer_tool_use(item: ComputerCallItem) -> ToolUseBlock:
    """A computer call as the computer tool's `tool_use` (Anthropic's actions)."""
    return ToolUseBlock(id=item.call_id, name="computer", input=from_responses_action(item.action or {}))


def stop_reason(resource: ResponseResource, stop_sequence: str | None) -> StopReason:
    if resource.incomplete_details is not None and resource.incomplete_details.reason == "max_output_tokens":
        return "max_tokens"
    if any(
        isinstance(item, FunctionCallItem | ComputerCallItem) and item.status == "completed"
        for item in resource.output
    ):
        return "tool_use"
    if stop_sequence:
        return "stop_sequence"
    return "end_turn"


def content_blocks(resource: ResponseResource) -> list[ContentBlock]:
    """The output items as content blocks, in order. A call the token limit cut off is left out
    (its input is unfinished); `stop_reason` is then `max_tokens`."""
    blocks: list[ContentBlock] = []
    for item in resource.output:
        if isinstance(item, ReasoningItem):
            text = "".join(part.text for part in item.content)
            if text:
                blocks.append(ThinkingBlock(thinking=text))
        elif isinstance(item, OutputMessage):
            text = "".join(part.text for part in item.content)
            if text:
                blocks.append(TextBlock(text=text))
        elif isinstance(item, FunctionCallItem) and item.status == "completed":
            blocks.append(ToolUseBlock(id=item.call_id, name=item.name, input=tool_input(item.arguments)))
        elif isinstance(item, ComputerCallItem) and item.status == "completed" and item.action is not None:
            blocks.append(computer_tool_use(item))
    return blocks


def anthropic_message(resource: ResponseResource, *, stop_sequence: str | None = None) -> Message:
    """A finished response as the Message it answers (`stop_sequence`: the one that ended it)."""
    reason = stop_reason(resource, stop_sequence)
    return Message(
        id=message_id(resource.id),
        content=content_blocks(resource),
        model=resource.model,
        stop_reason=reason,
        stop_sequence=stop_sequence if reason == "stop_sequence" else None,
        usage=message_usage(resource.usage),
    )

"""A response's stream events as Anthropic's Messages stream, in its order.

`message_start` (and a `ping`), then per content block `content_block_start`, its deltas
(`text_delta`, `thinking_delta`, `input_json_delta`) and `content_block_stop`, then
`message_delta` (stop reason, usage) and `message_stop`. A `ping` also goes out whenever the
engine has been quiet for a while (a long prompt still prefilling). Tool-call markup never
reaches a text block: the engine streams calls apart from text, and a call the token limit cut
off ends its block where it stopped (`stop_reason: max_tokens`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from vlmserve.responses import (
    ComputerCallItem,
    ErrorEvent,
    FunctionCallArgumentsDeltaEvent,
    FunctionCallItem,
    OutputItemEvent,
    OutputMessage,
    OutputTextDeltaEvent,
    ReasoningItem,
    ReasoningTextDeltaEvent,
    ResponseLifecycleEvent,
    ResponseResource,
)

from ._errors import anthropic_error_type
from ._message import (
    Message,
    MessageUsage,
    computer_tool_use,
    message_id,
    message_usage,
    stop_reason,
    tool_input,
)

StreamEvent = tuple[str, dict[str, Any]]


@dataclass
class _Block:
    index: int
    kind: str
    started: bool = False
    # A tool_use block: how far its arguments are a JSON object (what was sent of them).
    arguments: _ObjectPrefix | None = None


class _ObjectPrefix:
    """Tracks whether text fed piece by piece is still the start of one JSON object: strings,
    escapes and nesting followed in one pass (O(n) in all), values not checked. A stream's
    `input_json_delta`s must add up to JSON a client can parse (the Anthropic SDK raises on
    anything else, and Anthropic streams nothing else): the arguments of a call the model wrote
    malformed (issue 39.9) are sent only as far as they are an object's start."""

    def __init__(self) -> None:
        self.sent = 0  # characters accepted (and sent)
        self.broken = False
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._closed = False

    def accept(self, text: str) -> str:
        """The part of `text` that keeps the whole a JSON object's start (all of it, or less
        once it stops being one; nothing after that)."""
        if self.broken:
            return ""
        for index, char in enumerate(text):
            if not self._step(char):
                self.broken = True
                text = text[:index]
                break
        self.sent += len(text)
        return text

    def _step(self, char: str) -> bool:
        if self._in_string:
            if self._escape:
                self._escape = False
            elif char == "\\":
                self._escape = True
            elif char == '"':
                self._in_string = False
            return True
        if char.isspace():
            return True
        if self._closed or (self._depth == 0 and char != "{"):
            return False  # text after the object, or one that is not an object
        if char == '"':
            self._in_string = True
        elif char in "{[":
            self._depth += 1
        elif char in "}]":
            self._depth -= 1
            self._closed = self._depth == 0
        return True


@dataclass
class EventWriter:
    """Turns one response's stream events into Anthropic stream events `(type, data)`."""

    response_id: str
    model: str
    _started: bool = False
    _blocks: dict[str, _Block] = field(default_factory=dict)
    _count: int = 0

    def reserve_blocks(self, count: int) -> None:
        """Content blocks the caller sends itself first (a compaction block): indexes after them."""
        self._count += count

    def events(self, event: Any) -> list[StreamEvent]:
        """The stream events one Responses event becomes (none for most)."""
        if isinstance(event, ResponseLifecycleEvent):
            if event.type != "response.in_progress":
                return []
            if not self._started:
                self._started = True
                return [self._message_start(), _ping()]
            return [_ping()]  # a heartbeat: the engine is still working (a long prefill)
        if isinstance(event, OutputItemEvent):
            item = event.item
            if event.type == "response.output_item.added":
                if isinstance(item, FunctionCallItem):
                    block = self._open(item.id, "tool_use")
                    block.arguments = _ObjectPrefix()
                    start = {"type": "tool_use", "id": item.call_id, "name": item.name, "input": {}}
                    return [self._start(block, start)]
                if isinstance(item, ComputerCallItem):
                    # A computer call comes whole: its input in one delta.
                    block = self._open(item.id, "tool_use")
                    use = computer_tool_use(item)
                    start = {"type": "tool_use", "id": use.id, "name": use.name, "input": {}}
                    delta = {"type": "input_json_delta", "partial_json": json.dumps(use.input)}
                    return [
                        self._start(block, start),
                        (
                            "content_block_delta",
                            {"type": "content_block_delta", "index": block.index, "delta": delta},
                        ),
                    ]
                if isinstance(item, ReasoningItem):
                    self._open(item.id, "thinking")
                elif isinstance(item, OutputMessage):
                    self._open(item.id, "text")
                return []
            closed = self._blocks.pop(item.id) if item.id in self._blocks else None
            if closed is None or not closed.started:
                return []
            events: list[StreamEvent] = []
            if (
                isinstance(item, FunctionCallItem)
                and item.status == "completed"
                and closed.arguments is not None
                and closed.arguments.sent == 0
                and item.arguments.strip()
            ):
                # Arguments that never were an object's start: the input as a whole message
                # gives it (tool_input), in one delta.
                delta = {"type": "input_json_delta", "partial_json": json.dumps(tool_input(item.arguments))}
                events.append(
                    (
                        "content_block_delta",
                        {"type": "content_block_delta", "index": closed.index, "delta": delta},
                    )
                )
            events.append(("content_block_stop", {"type": "content_block_stop", "index": closed.index}))
            return events
        if isinstance(event, OutputTextDeltaEvent) and event.delta:
            return self._delta(event.item_id, "text", {"type": "text_delta", "text": event.delta})
        if isinstance(event, ReasoningTextDeltaEvent) and event.delta:
            return self._delta(event.item_id, "thinking", {"type": "thinking_delta", "thinking": event.delta})
        if isinstance(event, FunctionCallArgumentsDeltaEvent) and event.delta:
            tool_use = self._blocks.get(event.item_id)
            piece = tool_use.arguments.accept(event.delta) if tool_use and tool_use.arguments else ""
            if not piece:
                return []
            return self._delta(event.item_id, "tool_use", {"type": "input_json_delta", "partial_json": piece})
        if isinstance(event, ErrorEvent):
            return [error_event(event.error.message, event.error.code, status=None)]
        return []

    def last(self, resource: ResponseResource, *, stop_sequence: str | None = None) -> list[StreamEvent]:
        """`message_delta` with the stop reason and the usage, then `message_stop`."""
        reason = stop_reason(resource, stop_sequence)
        usage = message_usage(resource.usage).to_json()
        usage.pop("service_tier")
        delta = {
            "type": "message_delta",
            "delta": {
                "stop_reason": reason,
                "stop_sequence": stop_sequence if reason == "stop_sequence" else None,
            },
            "usage": usage,
        }
        return [("message_delta", delta), ("message_stop", {"type": "message_stop"})]

    def _message_start(self) -> StreamEvent:
        # The prompt's size is known only with the engine's result: `message_delta` gives the
        # full usage (its counts replace these, as Anthropic's cumulative ones do).
        message = Message(
            id=message_id(self.response_id),
            model=self.model,
            usage=MessageUsage(input_tokens=0, output_tokens=0),
        )
        return ("message_start", {"type": "message_start", "message": message.to_json()})

    def _open(self, item_id: str, kind: str) -> _Block:
        block = self._blocks[item_id] = _Block(index=-1, kind=kind)
        return block

    def _start(self, block: _Block, content: dict[str, Any]) -> StreamEvent:
        block.index, block.started = self._count, True
        self._count += 1
        return (
            "content_block_start",
            {"type": "content_block_start", "index": block.index, "content_block": content},
        )

    def _delta(self, item_id: str, kind: str, delta: dict[str, Any]) -> list[StreamEvent]:
        block = self._blocks.get(item_id)
        if block is None or block.kind != kind:
            return []
        events: list[StreamEvent] = []
        if not block.started:
            # Text and thinking blocks start with their first text: an empty one is never sent.
            start = (
                {"type": "text", "text": ""}
                if kind == "text"
                else {"type": "thinking", "thinking": "", "signature": ""}
            )
            events.append(self._start(block, start))
        events.append(
            ("content_block_delta", {"type": "content_block_delta", "index": block.index, "delta": delta})
        )
        return events


def _ping() -> StreamEvent:
    return ("ping", {"type": "ping"})


def error_event(message: str, code: str | None, *, status: int | None) -> StreamEvent:
    """A failure in the middle of a stream: Anthropic's `error` event."""
    return (
        "error",
        {"type": "error", "error": {"type": anthropic_error_type(status, code), "message": message}},
    )

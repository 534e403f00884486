"""The Responses streaming events for one generation, in OpenAI's order, and the final resource.

Both the streaming and the non-streaming endpoint drive this one state machine, so a streamed
response and a plain one always agree. Items and events are the translation package's exact
models (`message_output_item`, `tool_call_output_item`, `ResponseStreamEvent`); only the
in-progress states, which exist only while streaming, are made here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade.http.errors import APIError
from vlmserve.facade.responses import ids
from vlmserve.responses import (
    ContentPartEvent,
    CustomToolCallInputDeltaEvent,
    CustomToolCallInputDoneEvent,
    ErrorEvent,
    FunctionCallArgumentsDeltaEvent,
    FunctionCallArgumentsDoneEvent,
    IncompleteDetails,
    IncompleteReason,
    ItemStatus,
    LifecycleEventType,
    LogProb,
    OfferedTool,
    OutputItem,
    OutputItemEvent,
    OutputTextDeltaEvent,
    OutputTextDoneEvent,
    ReasoningTextContent,
    ReasoningTextDeltaEvent,
    ReasoningTextDoneEvent,
    ResponseError,
    ResponseLifecycleEvent,
    ResponseResource,
    ResponseStatus,
    ResponseStreamEvent,
    logprobs_from_contract,
    message_output_item,
    output_text_part,
    reasoning_output_item,
    tool_call_output_item,
    usage_from_contract,
)

Event = ResponseStreamEvent

TERMINAL_STATUSES = frozenset({"completed", "incomplete", "failed", "cancelled"})


@dataclass
class _OpenMessage:
    item_id: str
    output_index: int
    text: str = ""
    # The text's tokens (when the request asked for logprobs).
    logprobs: list[LogProb] = field(default_factory=list)


@dataclass
class _OpenCall:
    """A function call whose arguments are streaming (`GenerateChunk.tool_call_delta`)."""

    item_id: str
    output_index: int
    arguments: str = ""


@dataclass
class ResponseEvents:
    """Feed it engine messages; it returns the events to send and keeps `resource` up to date."""

    resource: ResponseResource
    offered_tools: Mapping[str, OfferedTool] = field(default_factory=dict)
    new_id: Callable[[str], str] = ids.new_id
    _sequence: int = 0
    _created: bool = False
    _output: list[OutputItem] = field(default_factory=list)
    _message: _OpenMessage | None = None
    # The reasoning item being streamed (thinking models), closed when the answer starts.
    _reasoning: _OpenMessage | None = None
    _reasoning_streamed: str = ""
    # Whitespace the model wrote before anything visible: it opens no message on its own, since a
    # turn that only calls tools often starts with a newline.
    _leading: str = ""
    _leading_logprobs: list[LogProb] = field(default_factory=list)
    # Engine token logprobs streamed so far (the rest of the final result's were never streamed).
    _logprobs_streamed: int = 0
    _calls_sent: int = 0
    # Calls whose arguments are streaming, by engine call id; calls that cannot stream (custom
    # tools: their input is not the arguments' text) come whole.
    _open_calls: dict[str, _OpenCall] = field(default_factory=dict)
    _whole_calls: set[str] = field(default_factory=set)
    # All text streamed so far, to tell what of the engine's final text was never streamed.
    _streamed: str = ""

    @property
    def finished(self) -> bool:
        return self.resource.status in TERMINAL_STATUSES

    def snapshot(self) -> ResponseResource:
        """The resource as it stands, output items included (a copy of the resource and its
        list of items; the items themselves are shared).

        Shallow on purpose: an output item is never changed once it is in `_output` (a change
        replaces it), and the resource's fields are only ever assigned, so a copy of the top
        level is a stable view. A deep copy, for every lifecycle event and store write, was
        the largest per-response cost with logprobs (every token's 21 models copied again)."""
        return self.resource.model_copy(update={"output": list(self._output)})

    def created(self) -> list[Event]:
        """`response.created`, with the status the response has; in the background, then
        `response.queued` (as OpenAI)."""
        self._created = True
        events = [self._lifecycle("response.created")]
        if self.resource.status == "queued":
            events.append(self._lifecycle("response.queued"))
        return events

    def start(self) -> list[Event]:
        """Generation begins: `response.created` unless sent already, then `response.in_progress`."""
        events = [] if self._created else self.created()
        self.resource.status = "in_progress"
        return [*events, self._lifecycle("response.in_progress")]

    def heartbeat(self) -> list[Event]:
        """Nothing new yet (a long prefill): a `response.in_progress` event as a sign of life."""
        return [self._lifecycle("response.in_progress")]

    def chunk(self, chunk: pb.GenerateChunk) -> list[Event]:
        kind = chunk.WhichOneof("kind")
        if kind == "text" and (chunk.text or chunk.logprobs):
            return self._text(chunk.text, chunk.logprobs)
        if kind == "reasoning_text" and chunk.reasoning_text:
            return self._reasoning_text(chunk.reasoning_text)
        if kind == "tool_call_delta":
            return self._tool_call_delta(chunk.tool_call_delta)
        if kind == "tool_call":
            events = self._close_reasoning() + self._close_message("completed")
            if chunk.tool_call.id in self._open_calls:
                return events + self._close_call(chunk.tool_call)
            return events + self._tool_call(chunk.tool_call)
        return []

    def complete(self, result: pb.GenerateResult) -> list[Event]:
        """The engine's final result: close what is open, emit what was not streamed, finish."""
        events: list[Event] = []
        reasoning = result.reasoning_text
        if (
            reasoning.startswith(self._reasoning_streamed)
            and len(reasoning) > len(self._reasoning_streamed)
            and not self._streamed
            and self._calls_sent == 0
        ):
            events += self._reasoning_text(reasoning[len(self._reasoning_streamed) :])
        events += self._close_reasoning()
        if result.text.startswith(self._streamed) and len(result.text) > len(self._streamed):
            events += self._text(
                result.text[len(self._streamed) :], result.logprobs[self._logprobs_streamed :]
            )
        unsent_calls = list(result.tool_calls[self._calls_sent :])
        if self._message is None and not unsent_calls and self._calls_sent == 0 and not self._open_calls:
            # A turn always has a message when it calls no tool, even an empty one.
            events += self._open_message()
        length = result.finish_reason == pb.FINISH_REASON_LENGTH
        events += self._close_message("incomplete" if length else "completed")
        for call in unsent_calls:
            events += self._tool_call(call)
        events += self._abandon_open_calls()
        self.resource.usage = usage_from_contract(result.usage)
        if result.finish_reason == pb.FINISH_REASON_CANCELLED:
            return events + self._finish("cancelled", "response.incomplete", "cancelled")
        if length:
            return events + self._finish("incomplete", "response.incomplete", "max_output_tokens")
        return events + self._finish("completed", "response.completed", None)

    def cancel(self) -> list[Event]:
        """Stopped before the engine's result (cancel endpoint or client gone)."""
        events = self._close_reasoning() + self._close_message("incomplete") + self._abandon_open_calls()
        return events + self._finish("cancelled", "response.incomplete", "cancelled")

    def fail(self, error: APIError) -> list[Event]:
        """A mid-stream failure: an `error` event, then `response.failed`."""
        if self._reasoning is not None:
            self._output.append(reasoning_output_item(self._reasoning.text, item_id=self._reasoning.item_id))
            self._reasoning = None
        if self._message is not None:
            # Keep what was produced, marked unfinished, without the closing events of a success.
            self._output.append(
                message_output_item(
                    self._message.text,
                    item_id=self._message.item_id,
                    status="incomplete",
                    logprobs=self._message.logprobs,
                )
            )
            self._message = None
        for call in self._open_calls.values():  # as far as written, without closing events
            self._output[call.output_index] = self._output[call.output_index].model_copy(
                update={"status": "incomplete", "arguments": call.arguments}
            )
        self._open_calls.clear()
        events: list[Event] = [ErrorEvent(sequence_number=self._next(), error=error.payload())]
        self.resource.status = "failed"
        self.resource.error = ResponseError(code=error.code or "server_error", message=error.message)
        return [*events, self._lifecycle("response.failed")]

    # ---- internals ---------------------------------------------------------------------------

    def _next(self) -> int:
        sequence = self._sequence
        self._sequence += 1
        return sequence

    def _lifecycle(self, event_type: LifecycleEventType) -> Event:
        return ResponseLifecycleEvent(type=event_type, sequence_number=self._next(), response=self.snapshot())

    def _text(self, text: str, entries: Sequence[pb.TokenLogprob] = ()) -> list[Event]:
        events: list[Event] = []
        self._streamed += text
        self._logprobs_streamed += len(entries)
        logprobs = logprobs_from_contract(entries)
        if self._message is None:
            self._leading += text
            self._leading_logprobs += logprobs
            if not self._leading.strip():
                return events
            text, self._leading = self._leading, ""
            logprobs, self._leading_logprobs = self._leading_logprobs, []
            events += self._close_reasoning()
            events += self._open_message()
        assert self._message is not None
        self._message.text += text
        self._message.logprobs += logprobs
        events.append(self._text_delta(self._message, text, logprobs))
        return events

    def _reasoning_text(self, text: str) -> list[Event]:
        events: list[Event] = []
        self._reasoning_streamed += text
        reasoning = self._reasoning
        if reasoning is None:
            reasoning = self._reasoning = _OpenMessage(
                item_id=self.new_id(ids.REASONING), output_index=len(self._output)
            )
            added = reasoning_output_item("", item_id=reasoning.item_id)
            added.content = []
            events += [
                OutputItemEvent(
                    type="response.output_item.added",
                    sequence_number=self._next(),
                    output_index=reasoning.output_index,
                    item=added,
                ),
                ContentPartEvent(
                    type="response.content_part.added",
                    sequence_number=self._next(),
                    item_id=reasoning.item_id,
                    output_index=reasoning.output_index,
                    content_index=0,
                    part=ReasoningTextContent(text=""),
                ),
            ]
        reasoning.text += text
        events.append(
            ReasoningTextDeltaEvent(
                sequence_number=self._next(),
                item_id=reasoning.item_id,
                output_index=reasoning.output_index,
                content_index=0,
                delta=text,
            )
        )
        return events

    def _close_reasoning(self) -> list[Event]:
        """Close the reasoning item (the schema gives it no status)."""
        reasoning = self._reasoning
        if reasoning is None:
            return []
        self._reasoning = None
        item = reasoning_output_item(reasoning.text, item_id=reasoning.item_id)
        self._output.append(item)
        where: dict[str, Any] = {
            "item_id": reasoning.item_id,
            "output_index": reasoning.output_index,
            "content_index": 0,
        }
        return [
            ReasoningTextDoneEvent(sequence_number=self._next(), **where, text=reasoning.text),
            ContentPartEvent(
                type="response.content_part.done", sequence_number=self._next(), **where, part=item.content[0]
            ),
            OutputItemEvent(
                type="response.output_item.done",
                sequence_number=self._next(),
                output_index=reasoning.output_index,
                item=item,
            ),
        ]

    def _open_message(self) -> list[Event]:
        self._message = _OpenMessage(item_id=self.new_id(ids.MESSAGE), output_index=len(self._output))
        # Whitespace held back and never followed by text still belongs to the message.
        self._message.text, self._leading = self._leading, ""
        self._message.logprobs, self._leading_logprobs = self._leading_logprobs, []
        added = message_output_item("", item_id=self._message.item_id, status="in_progress")
        added.content = []
        events: list[Event] = [
            OutputItemEvent(
                type="response.output_item.added",
                sequence_number=self._next(),
                output_index=self._message.output_index,
                item=added,
            ),
            ContentPartEvent(
                type="response.content_part.added",
                sequence_number=self._next(),
                item_id=self._message.item_id,
                output_index=self._message.output_index,
                content_index=0,
                part=output_text_part(""),
            ),
        ]
        if self._message.text or self._message.logprobs:
            events.append(self._text_delta(self._message, self._message.text, list(self._message.logprobs)))
        return events

    def _text_delta(self, message: _OpenMessage, text: str, logprobs: list[LogProb]) -> Event:
        return OutputTextDeltaEvent(
            sequence_number=self._next(),
            item_id=message.item_id,
            output_index=message.output_index,
            content_index=0,
            delta=text,
            logprobs=logprobs,
        )

    def _close_message(self, status: ItemStatus) -> list[Event]:
        message = self._message
        if message is None:
            return []
        self._message = None
        item = message_output_item(
            message.text, item_id=message.item_id, status=status, logprobs=message.logprobs
        )
        self._output.append(item)
        where: dict[str, Any] = {
            "item_id": message.item_id,
            "output_index": message.output_index,
            "content_index": 0,
        }
        return [
            OutputTextDoneEvent(
                sequence_number=self._next(), **where, text=message.text, logprobs=message.logprobs
            ),
            ContentPartEvent(
                type="response.content_part.done", sequence_number=self._next(), **where, part=item.content[0]
            ),
            OutputItemEvent(
                type="response.output_item.done",
                sequence_number=self._next(),
                output_index=message.output_index,
                item=item,
            ),
        ]

    def _tool_call(self, call: pb.ToolCall) -> list[Event]:
        item = tool_call_output_item(call, new_id=self.new_id, offered_tools=self.offered_tools)
        index = len(self._output)
        self._output.append(item)
        self._calls_sent += 1
        where: dict[str, Any] = {"item_id": item.id, "output_index": index}
        if item.type == "computer_call":
            # As OpenAI streams one: added (in progress) and done, nothing in between.
            return [
                OutputItemEvent(
                    type="response.output_item.added",
                    sequence_number=self._next(),
                    output_index=index,
                    item=item.model_copy(update={"status": "in_progress"}),
                ),
                OutputItemEvent(
                    type="response.output_item.done",
                    sequence_number=self._next(),
                    output_index=index,
                    item=item,
                ),
            ]
        added = OutputItemEvent(
            type="response.output_item.added",
            sequence_number=self._next(),
            output_index=index,
            item=item.model_copy(update={"status": "in_progress", _streamed_field(item): ""}),
        )
        arguments: list[Event]
        if item.type == "custom_tool_call":
            arguments = [
                CustomToolCallInputDeltaEvent(sequence_number=self._next(), **where, delta=item.input),
                CustomToolCallInputDoneEvent(sequence_number=self._next(), **where, input=item.input),
            ]
        else:
            arguments = [
                FunctionCallArgumentsDeltaEvent(sequence_number=self._next(), **where, delta=item.arguments),
                FunctionCallArgumentsDoneEvent(
                    sequence_number=self._next(), **where, arguments=item.arguments
                ),
            ]
        done = OutputItemEvent(
            type="response.output_item.done", sequence_number=self._next(), output_index=index, item=item
        )
        return [added, *arguments, done]

    def _tool_call_delta(self, delta: pb.ToolCallDelta) -> list[Event]:
        """A call's streamed arguments: the first delta adds the item, each one its text."""
        events: list[Event] = []
        call = self._open_calls.get(delta.id)
        if call is None:
            if delta.id in self._whole_calls:
                return []
            named = pb.ToolCall(id=delta.id, name=delta.name, kind=pb.TOOL_KIND_FUNCTION)
            item = tool_call_output_item(named, new_id=self.new_id, offered_tools=self.offered_tools)
            if item.type == "custom_tool_call":
                self._whole_calls.add(delta.id)
                return []
            events = self._close_reasoning() + self._close_message("completed")
            call = self._open_calls[delta.id] = _OpenCall(item.id, len(self._output))
            opened = item.model_copy(update={"status": "in_progress", "arguments": ""})
            self._output.append(opened)
            events.append(
                OutputItemEvent(
                    type="response.output_item.added",
                    sequence_number=self._next(),
                    output_index=call.output_index,
                    item=opened,
                )
            )
        if delta.arguments:
            call.arguments += delta.arguments
            events.append(
                FunctionCallArgumentsDeltaEvent(
                    sequence_number=self._next(),
                    item_id=call.item_id,
                    output_index=call.output_index,
                    delta=delta.arguments,
                )
            )
        return events

    def _close_call(self, whole: pb.ToolCall) -> list[Event]:
        """The streamed call is complete: its item under the id it was announced with."""
        call = self._open_calls.pop(whole.id)
        item = tool_call_output_item(whole, new_id=self.new_id, offered_tools=self.offered_tools)
        item = item.model_copy(update={"id": call.item_id})
        self._output[call.output_index] = item
        self._calls_sent += 1
        where: dict[str, Any] = {"item_id": call.item_id, "output_index": call.output_index}
        return [
            FunctionCallArgumentsDoneEvent(sequence_number=self._next(), **where, arguments=whole.arguments),
            OutputItemEvent(
                type="response.output_item.done",
                sequence_number=self._next(),
                output_index=call.output_index,
                item=item,
            ),
        ]

    def _abandon_open_calls(self) -> list[Event]:
        """Calls the output ended inside of (the token limit): `incomplete`, as far as written."""
        events: list[Event] = []
        for call in self._open_calls.values():
            item = self._output[call.output_index].model_copy(
                update={"status": "incomplete", "arguments": call.arguments}
            )
            self._output[call.output_index] = item
            events.append(
                OutputItemEvent(
                    type="response.output_item.done",
                    sequence_number=self._next(),
                    output_index=call.output_index,
                    item=item,
                )
            )
        self._open_calls.clear()
        return events

    def _finish(
        self, status: ResponseStatus, event_type: LifecycleEventType, incomplete: IncompleteReason | None
    ) -> list[Event]:
        self.resource.status = status
        self.resource.incomplete_details = (
            None if incomplete is None else IncompleteDetails(reason=incomplete)
        )
        self.resource.completed_at = int(time.time())
        return [self._lifecycle(event_type)]


def _streamed_field(item: OutputItem) -> str:
    """The field a tool call item's deltas fill in."""
    return "input" if item.type == "custom_tool_call" else "arguments"

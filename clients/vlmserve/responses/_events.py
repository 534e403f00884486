"""Responses streaming events, as exact models (what one SSE `data:` line carries).

Each event's `type` is also its SSE `event:` name; `sequence_number` counts from 0 per response.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ._output_models import (
    LogProb,
    OutboundModel,
    OutputItem,
    OutputTextContent,
    ReasoningTextContent,
    ResponseResource,
)


class _Event(OutboundModel):
    sequence_number: int


LifecycleEventType = Literal[
    "response.created",
    "response.queued",
    "response.in_progress",
    "response.completed",
    "response.incomplete",
    "response.failed",
]


class ResponseLifecycleEvent(_Event):
    """The response as it stands: created, still running (also a heartbeat) or finished."""

    type: LifecycleEventType
    response: ResponseResource


class OutputItemEvent(_Event):
    type: Literal["response.output_item.added", "response.output_item.done"]
    output_index: int
    item: OutputItem


class _InItem(_Event):
    item_id: str
    output_index: int


class ContentPartEvent(_InItem):
    type: Literal["response.content_part.added", "response.content_part.done"]
    content_index: int
    part: Annotated[OutputTextContent | ReasoningTextContent, Field(discriminator="type")]


class OutputTextDeltaEvent(_InItem):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    content_index: int
    delta: str
    logprobs: list[LogProb] = Field(default_factory=list)


class OutputTextDoneEvent(_InItem):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    content_index: int
    text: str
    logprobs: list[LogProb] = Field(default_factory=list)


class ReasoningTextDeltaEvent(_InItem):
    type: Literal["response.reasoning_text.delta"] = "response.reasoning_text.delta"
    content_index: int
    delta: str


class ReasoningTextDoneEvent(_InItem):
    type: Literal["response.reasoning_text.done"] = "response.reasoning_text.done"
    content_index: int
    text: str


class FunctionCallArgumentsDeltaEvent(_InItem):
    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    delta: str


class FunctionCallArgumentsDoneEvent(_InItem):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    arguments: str


class CustomToolCallInputDeltaEvent(_InItem):
    type: Literal["response.custom_tool_call_input.delta"] = "response.custom_tool_call_input.delta"
    delta: str


class CustomToolCallInputDoneEvent(_InItem):
    type: Literal["response.custom_tool_call_input.done"] = "response.custom_tool_call_input.done"
    input: str


class ErrorPayload(OutboundModel):
    """The OpenAI error object: the `error` of an error event and of every HTTP error body."""

    type: str
    code: str | None
    message: str
    param: str | None


class ErrorEvent(_Event):
    type: Literal["error"] = "error"
    error: ErrorPayload


ResponseStreamEvent = Annotated[
    ResponseLifecycleEvent
    | OutputItemEvent
    | ContentPartEvent
    | OutputTextDeltaEvent
    | OutputTextDoneEvent
    | ReasoningTextDeltaEvent
    | ReasoningTextDoneEvent
    | FunctionCallArgumentsDeltaEvent
    | FunctionCallArgumentsDoneEvent
    | CustomToolCallInputDeltaEvent
    | CustomToolCallInputDoneEvent
    | ErrorEvent,
    Field(discriminator="type"),
]

"""A response (resource or stream events) as a chat completion or its chunks: exact models."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from vlmserve.responses import (
    FunctionCallArgumentsDeltaEvent,
    FunctionCallItem,
    LogProb,
    OutboundModel,
    OutputItemEvent,
    OutputMessage,
    OutputTextDeltaEvent,
    ReasoningItem,
    ReasoningTextDeltaEvent,
    ResponseResource,
    Usage,
)

FinishReason = Literal["stop", "length", "tool_calls", "content_filter"]

# A thinking model's reasoning, in the field DeepSeek's API and vLLM use (not OpenAI's: its chat
# completions never return reasoning); absent when there is none.
_REASONING = Field(default=None, exclude_if=lambda value: value is None)
# A stream chunk's key that this chunk does not set: left out, as OpenAI does. Clients merge
# chunks key by key, so an explicit null would overwrite what an earlier chunk set (the openai
# SDK's `chat.completions.stream()` then fails on a tool call whose `type` became null).
_UNSET = Field(default=None, exclude_if=lambda value: value is None)


class FunctionCall(OutboundModel):
    name: str
    arguments: str


class ToolCall(OutboundModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(OutboundModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = _REASONING
    refusal: None = None
    tool_calls: list[ToolCall] | None = None


class ChoiceLogprobs(OutboundModel):
    """`logprobs: true`: the content's tokens (the Responses output_text part's, same shape)."""

    content: list[LogProb] | None
    refusal: None = None


class Choice(OutboundModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: ChoiceLogprobs | None = None


class PromptTokensDetails(OutboundModel):
    cached_tokens: int = 0


class CompletionTokensDetails(OutboundModel):
    reasoning_tokens: int = 0


class CompletionUsage(OutboundModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)
    completion_tokens_details: CompletionTokensDetails = Field(default_factory=CompletionTokensDetails)


class ChatCompletion(OutboundModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage | None
    service_tier: str | None = None
    system_fingerprint: None = None


class FunctionCallDelta(OutboundModel):
    # The name on a call's first chunk only, which carries the first piece of its arguments too.
    name: str | None = _UNSET
    arguments: str


class ToolCallDelta(OutboundModel):
    index: int
    # On a call's first chunk only.
    id: str | None = _UNSET
    type: Literal["function"] | None = _UNSET
    function: FunctionCallDelta


class ChunkDelta(OutboundModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = _REASONING
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(OutboundModel):
    index: int = 0
    delta: ChunkDelta
    finish_reason: FinishReason | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(OutboundModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: CompletionUsage | None = None
    service_tier: str | None = None
    system_fingerprint: None = None


def completion_id(response_id: str) -> str:
    """The chat completion's id: the response id with OpenAI's prefix (`resp_x` -> `chatcmpl-x`)."""
    return "chatcmpl-" + response_id.removeprefix("resp_")


def completion_usage(usage: Usage | None) -> CompletionUsage | None:
    if usage is None:
        return None
    return CompletionUsage(
        prompt_tokens=usage.input_tokens,
        completion_tokens=usage.output_tokens,
        total_tokens=usage.total_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.input_tokens_details.cached_tokens),
        completion_tokens_details=CompletionTokensDetails(
            reasoning_tokens=usage.output_tokens_details.reasoning_tokens
        ),
    )


def finish_reason(resource: ResponseResource) -> FinishReason:
    if resource.incomplete_details is not None and resource.incomplete_details.reason == "max_output_tokens":
        return "length"
    if any(isinstance(item, FunctionCallItem) for item in resource.output):
        return "tool_calls"
    return "stop"


def chat_completion(resource: ResponseResource, *, logprobs: bool = False) -> ChatCompletion:
    """A finished response as the chat completion it answers (with `logprobs`: its tokens).
    A call the token limit cut off is left out, as on Messages (its arguments are unfinished:
    `""` or part of an object, which a client would run); `finish_reason` is then `length`."""
    parts = [part for item in resource.output if isinstance(item, OutputMessage) for part in item.content]
    text = "".join(part.text for part in parts)
    calls = [
        ToolCall(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments))
        for item in resource.output
        if isinstance(item, FunctionCallItem) and item.status == "completed"
    ]
    reasoning = "".join(
        part.text for item in resource.output if isinstance(item, ReasoningItem) for part in item.content
    )
    has_message = any(isinstance(item, OutputMessage) for item in resource.output)
    message = AssistantMessage(
        content=text if has_message or not calls else None,
        reasoning_content=reasoning or None,
        tool_calls=calls or None,
    )
    return ChatCompletion(
        id=completion_id(resource.id),
        created=resource.created_at,
        model=resource.model,
        choices=[
            Choice(
                message=message,
                finish_reason=finish_reason(resource),
                logprobs=ChoiceLogprobs(content=[entry for part in parts for entry in part.logprobs])
                if logprobs
                else None,
            )
        ],
        usage=completion_usage(resource.usage),
        service_tier=resource.service_tier,
    )


class ChunkWriter:
    """Turns one response's stream events into chat completion chunks, in order.

    A call's first chunk (its id, type and name) waits for the first piece of its arguments and
    carries it: a call the token limit cuts off before it wrote any is never sent, so no client
    is left holding a call whose `arguments` is `""` (one cut off later has `finish_reason`
    `length`, and its arguments as far as written, as OpenAI streams them)."""

    def __init__(
        self, response_id: str, created: int, model: str, *, include_usage: bool, logprobs: bool = False
    ) -> None:
        self._base: dict[str, Any] = {"id": completion_id(response_id), "created": created, "model": model}
        self._include_usage = include_usage
        self._logprobs = logprobs
        self._tool_index: dict[str, int] = {}
        # Calls announced (output_item.added) whose first chunk waits for their first arguments.
        self._waiting_calls: dict[str, FunctionCallItem] = {}
        self._role_sent = False

    def _chunk(self, delta: ChunkDelta, finish: FinishReason | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(**self._base, choices=[ChunkChoice(delta=delta, finish_reason=finish)])

    def _opened(self, chunks: list[ChatCompletionChunk]) -> list[ChatCompletionChunk]:
        """The role rides on the first chunk, as OpenAI sends it: a text answer opens with a chunk
        of its own (role, content ""); an answer that opens with a tool call (or reasoning) carries
        the role on that chunk, content null. Clients start a text part on content "": an empty
        one before a call misleads them (the AI SDK shows an empty text)."""
        if not chunks or self._role_sent:
            return chunks
        self._role_sent = True
        delta = chunks[0].choices[0].delta
        if delta.tool_calls is not None or delta.reasoning_content is not None:
            delta.role = "assistant"
            return chunks
        return [self._chunk(ChunkDelta(role="assistant", content="")), *chunks]

    def plain_text(self, event: Any) -> str | None:
        """The text of an event whose chunks are exactly `[text_chunk(text)]` (a text delta after
        the role's chunk, no logprobs asked): what a streamed token nearly always is, which the
        route then writes from a template of that chunk. None for any other event."""
        if type(event) is OutputTextDeltaEvent and event.delta and self._role_sent and not self._logprobs:
            return event.delta
        return None

    def text_chunk(self, text: str) -> ChatCompletionChunk:
        """The chunk of a text delta, the role already sent."""
        return self._chunk(ChunkDelta(content=text))

    def chunks(self, event: Any) -> list[ChatCompletionChunk]:
        """The chunks one event becomes (none for most lifecycle events)."""
        return self._opened(self._event_chunks(event))

    def _event_chunks(self, event: Any) -> list[ChatCompletionChunk]:
        if isinstance(event, OutputTextDeltaEvent):
            if self._logprobs and (event.delta or event.logprobs):
                chunk = self._chunk(ChunkDelta(content=event.delta))
                chunk.choices[0].logprobs = ChoiceLogprobs(content=event.logprobs)
                return [chunk]
            return [self._chunk(ChunkDelta(content=event.delta))] if event.delta else []
        if isinstance(event, ReasoningTextDeltaEvent):
            return [self._chunk(ChunkDelta(reasoning_content=event.delta))] if event.delta else []
        if isinstance(event, OutputItemEvent) and isinstance(event.item, FunctionCallItem):
            item = event.item
            if event.type == "response.output_item.added":
                self._waiting_calls[item.id] = item
                return []
            # Done: a whole call that never had arguments still goes out (with what it has); a
            # call cut off before its first piece does not.
            if item.id in self._waiting_calls and item.status == "completed":
                return [self._first_call_chunk(item.id, item.arguments)]
            self._waiting_calls.pop(item.id, None)
            return []
        if isinstance(event, FunctionCallArgumentsDeltaEvent):
            if not event.delta:
                return []
            if event.item_id in self._waiting_calls:
                return [self._first_call_chunk(event.item_id, event.delta)]
            index = self._tool_index.setdefault(event.item_id, len(self._tool_index))
            call = ToolCallDelta(index=index, function=FunctionCallDelta(arguments=event.delta))
            return [self._chunk(ChunkDelta(tool_calls=[call]))]
        return []

    def _first_call_chunk(self, item_id: str, arguments: str) -> ChatCompletionChunk:
        item = self._waiting_calls.pop(item_id)
        index = self._tool_index.setdefault(item_id, len(self._tool_index))
        call = ToolCallDelta(
            index=index,
            id=item.call_id,
            type="function",
            function=FunctionCallDelta(name=item.name, arguments=arguments),
        )
        return self._chunk(ChunkDelta(tool_calls=[call]))

    def last(self, resource: ResponseResource) -> list[ChatCompletionChunk]:
        """The finish chunk, then (when asked for) the usage chunk with no choices."""
        chunks = self._opened([self._chunk(ChunkDelta(), finish_reason(resource))])
        if self._include_usage:
            chunks.append(
                ChatCompletionChunk(**self._base, choices=[], usage=completion_usage(resource.usage))
            )
        return chunks

"""A whole `POST /v1/responses` body -> a contract GenerateRequest (the conversation as sent; the
engine lowers it where it renders the chat template)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vlmserve.common.clips import DEFAULT_MAX_CLIP_BYTES
from vlmserve.common.documents import DocumentLimits
from vlmserve.common.images import ImageLimits
from vlmserve.common.wire_encode import HeldMessages, HeldTexts, OutgoingRequest
from vlmserve.engine.v1 import engine_pb2 as pb

from ._budget import contract_image_count
from ._computer import check_call_outputs
from ._create_request import CreateRequest, parse_create_request
from ._errors import InvalidRequestError
from ._items import (
    ItemResolver,
    after_latest_compaction,
    after_latest_summary,
    input_entries,
    output_items_to_messages,
    require_content,
    typed_items,
    typed_items_to_messages,
    with_instructions,
)
from ._json import (
    as_object,
)
from ._media import FileSource, ImageSource, MediaPolicy, PdfRenderer
from ._output_models import OutputItem, RequestEcho
from ._request_models import ConversationParam, CreateResponseBody
from ._text_format import parse_text
from ._tools import ParsedToolChoice, ToolSet, parse_tool_choice, parse_tools
from ._video_defaults import parse_mm_processor_kwargs

# A part of a contract message, as the engine names it in an error (and what follows it).
_ENGINE_PART = re.compile(r"messages\[(\d+)\]((?:\.tool_output\.parts)?\.parts\[\d+\])")
METADATA_MAX_PAIRS = 16
# The include value that asks for output_text parts' token logprobs.
LOGPROBS_INCLUDE = "message.output_text.logprobs"
METADATA_MAX_KEY_CHARS = 64
METADATA_MAX_VALUE_CHARS = 512


@dataclass(frozen=True)
class TranslatedRequest:
    """A validated Responses request, ready for the engine, plus what the response echoes."""

    # For the engine: the one conversation (instructions, replayed turns, input), images where
    # the client put them; the engine lowers it. `model` is left for the caller to set. With the
    # texts it holds apart, when the caller asked for them held (`build_generate_request`'s
    # `held`): measured, encoded and sent only through it.
    outgoing: OutgoingRequest
    # `input` as a list of items (a string input becomes one user message item): what to store.
    input_items: list[Any]
    # `input` as contract messages, its tool calls under their own kinds (the request's show
    # custom calls as functions): what a later turn replays instead of translating the items again.
    # They hold the request's markers, and its held texts travel with them.
    input_messages: HeldMessages
    # The request fields a ResponseResource echoes (`store` and `background` among them).
    echo: RequestEcho
    # The tools offered (name -> the tool as declared, for result_to_output_items to give calls
    # back under the client's names), and the hosted ones left out of the prompt.
    tools: ToolSet
    conversation_id: str | None = None
    stream: bool = False
    user: str | None = None
    # Where each part of the input's messages came from (`messages[1].parts[0]`, indexes of the
    # input's own messages -> `input[0].content[0]`), and how many messages the input made: the
    # engine names a part it refuses by its place in the request (`engine_part_path`).
    input_part_paths: Mapping[str, str] = field(default_factory=dict)
    input_message_count: int = 0

    @property
    def request(self) -> pb.GenerateRequest:
        """The contract message, for a caller that sends it itself: only when no texts are held
        (`build_generate_request` without `held`; else ValueError)."""
        return self.outgoing.plain()

    def engine_part_path(self, engine_field: str, request_messages: int) -> tuple[str, str] | None:
        """The part an engine error names (`messages[7].tool_output.parts.parts[1]…`, in a request
        of `request_messages` messages, the input's last) as (that contract path, the client's
        path `input[2].output[1]`); None for anything but a part of this request's input."""
        match = _ENGINE_PART.match(engine_field)
        if match is None:
            return None
        index = int(match.group(1)) - (request_messages - self.input_message_count)
        if index < 0:
            return None
        path = self.input_part_paths.get(f"messages[{index}]{match.group(2)}")
        return (match.group(0), path) if path is not None else None

    def output_messages(self, items: Sequence[OutputItem]) -> list[pb.Message]:
        """A response's output items as raw contract messages, tool calls under the names this
        request offered them: what a later turn replays."""
        return output_items_to_messages(items, call_name=self.tools.call_name)


_REASONING_EFFORTS = ("none", "low", "medium", "high", "xhigh")
_REASONING_SUMMARIES = ("auto", "concise", "detailed")


def _reasoning_echo(reasoning: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """`reasoning` as the Open Responses schema allows it back: known effort and summary, else null."""
    if reasoning is None:
        return None
    effort = reasoning.get("effort")
    summary = reasoning.get("summary")
    return {
        "effort": effort if effort in _REASONING_EFFORTS else None,
        "summary": summary if summary in _REASONING_SUMMARIES else None,
    }


def build_generate_request(
    body: CreateRequest | CreateResponseBody | Mapping[str, Any],
    *,
    resolve_item: ItemResolver | None = None,
    image_source: ImageSource | None = None,
    image_limits: ImageLimits | None = None,
    replay: Sequence[Any] = (),
    history: Sequence[pb.Message] = (),
    file_source: FileSource | None = None,
    document_limits: DocumentLimits | None = None,
    pdf_renderer: PdfRenderer | None = None,
    max_images: int | None = None,
    held: HeldTexts | None = None,
    clip_source: ImageSource | None = None,
    clip_max_bytes: int = DEFAULT_MAX_CLIP_BYTES,
) -> TranslatedRequest:
    """Validate a Responses request body and translate it for the engine.

    Earlier turns (from previous_response_id or a conversation) come as `history`, the raw
    contract messages they were translated to when they were new (`input_messages`,
    `output_messages`), and/or as `replay`, their raw input (and output) items, translated here
    again. Both go before `input`, in that order, and the engine lowers them all the same way, so
    a replayed conversation reaches the model exactly as it did the first time.

    `file_source` looks up files named by `file_id` (none: only inline `file_data` files);
    `document_limits` bounds files and the PDF pages rendered (docs/responses-api.md, Files);
    `pdf_renderer` renders them (none: `render_pdf`, in this process). `max_images` bounds the
    images of the whole conversation, earlier turns and PDF pages included (None: no bound).
    `clip_source` fetches remote video and audio URLs (none: refused), `clip_max_bytes` bounds
    each clip. `held`: the input's long texts are held there, their markers in the request (for a caller
    that sends it with `vlmserve.common.wire_encode.encode`; the result's `held`).
    A parsed `body` (`CreateRequest`, or a typed body) is not parsed again; a `CreateRequest`'s
    engine extras are set last.
    """
    create = _create_request(body)
    parsed = create.body
    tools = parse_tools(parsed.tools)
    choice = parse_tool_choice(parsed.tool_choice, tools)
    instructions = parsed.instructions
    media = MediaPolicy.for_request(
        image_source=image_source,
        image_limits=image_limits,
        file_source=file_source,
        document_limits=document_limits,
        pdf_renderer=pdf_renderer,
        max_images=max_images,
        clip_source=clip_source,
        clip_max_bytes=clip_max_bytes,
        video_defaults=parse_mm_processor_kwargs(parsed.mm_processor_kwargs),
    )
    input_items = typed_items(input_entries(parsed.input), media=media, resolve_item=resolve_item)
    # A compaction item covers what came before it, earlier turns included: they are not sent.
    input_items, compacted = after_latest_compaction(input_items)
    if compacted:
        history, replay = (), ()
    history = after_latest_summary(history)
    # Every image the turns hold is counted before the first is decoded or fetched.
    media.budget.count_images(contract_image_count(history))
    replay_items = typed_items(
        [(f"replay[{index}]", item) for index, item in enumerate(replay)],
        media=media,
        resolve_item=resolve_item,
    )
    media.budget.check_images()
    replayed = typed_items_to_messages(replay_items, media=media, call_name=tools.call_name)
    check_call_outputs([*history, *replayed], input_items)
    part_paths: dict[str, str] = {}
    current = typed_items_to_messages(
        input_items, media=media, call_name=tools.call_name, held=held, part_paths=part_paths
    )
    require_content(current)
    input_message_count = len(current)
    conversation = with_instructions(instructions, [*history, *replayed, *current])

    conversation_param = parsed.conversation
    conversation_id = (
        conversation_param.id if isinstance(conversation_param, ConversationParam) else conversation_param
    )
    if parsed.previous_response_id is not None and conversation_id is not None:
        raise InvalidRequestError(
            "Use either 'previous_response_id' or 'conversation', not both.", param="conversation"
        )
    _reject_unsupported(parsed)
    text, response_format = parse_text(parsed.text)
    sampling = pb.SamplingParams(
        max_tokens=parsed.max_output_tokens,
        temperature=parsed.temperature,
        top_p=parsed.top_p,
        # Asked for by the include value; `top_logprobs` > 0 implies it (what would it be for else).
        logprobs=LOGPROBS_INCLUDE in (parsed.include or ()) or bool(parsed.top_logprobs),
        top_logprobs=parsed.top_logprobs or 0,
    )
    request = pb.GenerateRequest(
        tools=tools.contract_tools(choice.allowed),
        sampling=sampling,
        response_format=response_format,
        max_tool_calls=parsed.max_tool_calls,
    )
    # One message at a time (CopyFrom: a copy; the constructor's list, MergeFrom, serializes
    # each message on the way), and the input's are then the request's own: a 30 MiB text is
    # held once, not in `current` and again in the request (docs/hardening.md, "Memory per
    # request byte").
    for message in conversation:
        request.messages.add().CopyFrom(message)
    input_messages = _input_messages(request, current)
    del conversation, current
    _custom_calls_as_function_calls(request.messages)  # the request's copies, not `history`'s
    if choice.choice is not None:
        request.tool_choice.CopyFrom(choice.choice)
    if parsed.reasoning is not None and parsed.reasoning.effort in ("none", "minimal"):
        # The least reasoning there is: the template's thinking switch off, where it has one.
        request.enable_thinking = False
    if parsed.parallel_tool_calls is not None:
        request.parallel_tool_calls = parsed.parallel_tool_calls
    create.extras.apply(request)

    return TranslatedRequest(
        outgoing=OutgoingRequest(request, held),
        input_items=_raw_items(create.stored_input()),
        input_messages=HeldMessages(input_messages, held),
        echo=_echo(parsed, tools, choice, text),
        tools=tools,
        conversation_id=conversation_id,
        stream=bool(parsed.stream),
        user=parsed.user,
        input_part_paths=part_paths,
        input_message_count=input_message_count,
    )


def _echo(
    parsed: CreateResponseBody, tools: ToolSet, choice: ParsedToolChoice, text: dict[str, Any]
) -> RequestEcho:
    """The request fields a ResponseResource echoes, with schema-valid defaults."""
    reasoning = None if parsed.reasoning is None else parsed.reasoning.model_dump()
    return RequestEcho.model_validate(
        {
            "instructions": parsed.instructions,
            "previous_response_id": parsed.previous_response_id,
            "tools": tools.echo(choice.allowed),
            "tool_choice": choice.echo,
            "truncation": parsed.truncation or "disabled",
            "parallel_tool_calls": parsed.parallel_tool_calls is not False,
            "text": text,
            "temperature": 1.0 if parsed.temperature is None else parsed.temperature,
            "top_p": 1.0 if parsed.top_p is None else parsed.top_p,
            "top_logprobs": parsed.top_logprobs or 0,
            "reasoning": _reasoning_echo(reasoning),
            "max_output_tokens": parsed.max_output_tokens,
            "max_tool_calls": parsed.max_tool_calls,
            "store": parsed.store is not False,
            "background": bool(parsed.background),
            "service_tier": parsed.service_tier or "default",
            "metadata": parse_metadata(parsed.metadata),
            "safety_identifier": parsed.safety_identifier,
            "prompt_cache_key": parsed.prompt_cache_key,
        }
    )


def _create_request(body: CreateRequest | CreateResponseBody | Mapping[str, Any]) -> CreateRequest:
    if isinstance(body, CreateRequest):
        return body
    if isinstance(body, CreateResponseBody):
        return CreateRequest(body)
    return parse_create_request(body)


def _raw_items(value: Any) -> list[Any]:
    """`input` as the client sent it, as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value)


def _input_messages(request: pb.GenerateRequest, current: Sequence[pb.Message]) -> list[pb.Message]:
    """The input's messages, as stored for replays: the request's own (its last ones), except
    those the request shows differently (custom calls as functions), which stay apart. The
    request's are views into it: whoever keeps them beyond the request copies them
    (`MessageCache.put`)."""
    first = len(request.messages) - len(current)
    return [
        message if _has_custom_calls(message) else request.messages[first + index]
        for index, message in enumerate(current)
    ]


def _has_custom_calls(message: pb.Message) -> bool:
    return any(call.kind == pb.TOOL_KIND_CUSTOM for call in message.tool_calls)


def _custom_calls_as_function_calls(messages: Iterable[pb.Message]) -> None:
    """Custom tools are offered as functions taking {"input": string}; show past calls that way
    (in place)."""
    for message in messages:
        for call in message.tool_calls:
            if call.kind == pb.TOOL_KIND_CUSTOM:
                call.arguments = json.dumps({"input": call.arguments}, ensure_ascii=False)
                call.kind = pb.TOOL_KIND_FUNCTION


def _reject_unsupported(body: CreateResponseBody) -> None:
    if body.background and body.store is False:
        raise InvalidRequestError(
            "Invalid value for 'background': background responses must be stored; send 'store': true.",
            param="background",
            code="invalid_value",
        )
    for penalty in ("presence_penalty", "frequency_penalty"):
        if getattr(body, penalty):
            raise InvalidRequestError(
                f"Invalid value for '{penalty}': only 0 is supported.",
                param=penalty,
                code="unsupported_value",
            )
    if body.prompt is not None:
        raise InvalidRequestError(
            "Invalid value for 'prompt': stored prompt templates are not supported; send 'input'.",
            param="prompt",
            code="unsupported_value",
        )


def parse_metadata(value: object) -> dict[str, str]:
    """Validate `metadata`: at most 16 string pairs, keys <= 64 and values <= 512 characters."""
    if value is None:
        return {}
    metadata = as_object(value, "metadata")
    if len(metadata) > METADATA_MAX_PAIRS:
        raise InvalidRequestError(
            f"Invalid value for 'metadata': at most {METADATA_MAX_PAIRS} key-value pairs.", param="metadata"
        )
    for key, item in metadata.items():
        if len(key) > METADATA_MAX_KEY_CHARS:
            raise InvalidRequestError(
                f"Invalid value for 'metadata': keys are at most {METADATA_MAX_KEY_CHARS} characters.",
                param="metadata",
            )
        if not isinstance(item, str):
            raise InvalidRequestError(
                "Invalid value for 'metadata': values must be strings.", param="metadata", code="invalid_type"
            )
        if len(item) > METADATA_MAX_VALUE_CHARS:
            raise InvalidRequestError(
                f"Invalid value for 'metadata': values are at most {METADATA_MAX_VALUE_CHARS} characters.",
                param="metadata",
            )
    return dict(metadata)

"""A whole `POST /v1/responses` body -> a contract GenerateRequest (messages lowered)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vlmserve.common.images import ImageLimits
from vlmserve.engine.v1 import engine_pb2 as pb

from ._errors import InvalidRequestError
from ._items import (
    ItemResolver,
    input_entries,
    items_to_messages,
    require_content,
    with_instructions,
)
from ._json import (
    as_list,
    as_object,
    join,
    missing,
    one_of,
    optional_bool,
    optional_int,
    optional_number,
    optional_object,
    optional_str,
    wrong_type,
)
from ._lowering import lower_messages
from ._media import ImageSource, MediaPolicy
from ._output_models import RequestEcho
from ._tools import OfferedTool, parse_tool_choice, parse_tools

METADATA_MAX_PAIRS = 16
METADATA_MAX_KEY_CHARS = 64
METADATA_MAX_VALUE_CHARS = 512


@dataclass(frozen=True)
class TranslatedRequest:
    """A validated Responses request, ready for the engine, plus what the response echoes."""

    # For the engine: messages already lowered. `model` is left for the caller to set.
    request: pb.GenerateRequest
    # The same conversation before lowering (replay + input), images where the client put them.
    raw_messages: list[pb.Message]
    # `input` as a list of items (a string input becomes one user message item): what to store.
    input_items: list[Any]
    # Hosted tools we cannot run, left out of the prompt (types, e.g. "web_search").
    ignored_tools: list[str] = field(default_factory=list)
    # Offered tool name -> the tool as the client declared it (namespace, custom); pass this
    # to result_to_output_items so calls go back out under the client's names.
    offered_tools: Mapping[str, OfferedTool] = field(default_factory=dict)
    model: str | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    conversation_id: str | None = None
    stream: bool = False
    store: bool = True
    truncation: str = "disabled"
    metadata: dict[str, str] = field(default_factory=dict)
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: dict[str, Any] = field(default_factory=lambda: {"format": {"type": "text"}})
    reasoning: dict[str, Any] | None = None
    include: list[str] = field(default_factory=list)
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    user: str | None = None

    def echo_fields(self) -> RequestEcho:
        """The request fields a ResponseResource echoes, with schema-valid defaults."""
        return RequestEcho.model_validate(
            {
                "instructions": self.instructions,
                "previous_response_id": self.previous_response_id,
                "tools": self.tools,
                "tool_choice": self.tool_choice,
                "truncation": self.truncation,
                "parallel_tool_calls": self.parallel_tool_calls,
                "text": self.text,
                "temperature": 1.0 if self.temperature is None else self.temperature,
                "top_p": 1.0 if self.top_p is None else self.top_p,
                "reasoning": _reasoning_echo(self.reasoning),
                "max_output_tokens": self.max_output_tokens,
                "max_tool_calls": self.max_tool_calls,
                "store": self.store,
                "service_tier": self.service_tier or "default",
                "metadata": self.metadata,
                "safety_identifier": self.safety_identifier,
                "prompt_cache_key": self.prompt_cache_key,
            }
        )


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
    body: Mapping[str, Any],
    *,
    resolve_item: ItemResolver | None = None,
    image_source: ImageSource | None = None,
    image_limits: ImageLimits | None = None,
    replay: Sequence[Any] = (),
) -> TranslatedRequest:
    """Validate a Responses request body and translate it for the engine.

    `replay` holds the raw input (and output) items of earlier turns, from
    previous_response_id or a conversation; they go before `input` and are lowered the same
    way, so a replayed conversation reaches the model exactly as it did the first time.
    """
    if not isinstance(body, Mapping):
        raise wrong_type("body", "a JSON object", body)
    tools = parse_tools(body.get("tools"))
    choice = parse_tool_choice(body.get("tool_choice"), tools)
    instructions = optional_str(body, "instructions", "")
    raw_input = body.get("input")
    if raw_input is None:
        raise missing("input")
    media = MediaPolicy(image_source=image_source, limits=image_limits or ImageLimits())
    input_part = input_entries(raw_input)
    replayed = items_to_messages(
        [(f"replay[{index}]", item) for index, item in enumerate(replay)],
        media=media,
        resolve_item=resolve_item,
        call_name=tools.call_name,
    )
    current = items_to_messages(input_part, media=media, resolve_item=resolve_item, call_name=tools.call_name)
    require_content(current)
    raw_messages = with_instructions(instructions, replayed + current)

    previous_response_id = optional_str(body, "previous_response_id", "")
    conversation_id = _conversation_id(body.get("conversation"))
    if previous_response_id is not None and conversation_id is not None:
        raise InvalidRequestError(
            "Use either 'previous_response_id' or 'conversation', not both.", param="conversation"
        )
    _reject_unsupported(body)
    text = _text(body.get("text"))
    max_output_tokens = _positive_int(body, "max_output_tokens")
    temperature = _bounded(body, "temperature", 0.0, 2.0)
    top_p = _bounded(body, "top_p", 0.0, 1.0)
    parallel = optional_bool(body, "parallel_tool_calls", "")

    request = pb.GenerateRequest(
        messages=_custom_calls_as_function_calls(lower_messages(raw_messages)),
        tools=tools.contract_tools(choice.allowed),
        sampling=pb.SamplingParams(max_tokens=max_output_tokens, temperature=temperature, top_p=top_p),
        response_format=pb.ResponseFormat(text=pb.TextFormat()),
    )
    if choice.choice is not None:
        request.tool_choice.CopyFrom(choice.choice)
    if parallel is not None:
        request.parallel_tool_calls = parallel

    return TranslatedRequest(
        request=request,
        raw_messages=raw_messages,
        input_items=[item for _, item in input_part],
        ignored_tools=tools.ignored,
        offered_tools=tools.offered,
        model=optional_str(body, "model", ""),
        instructions=instructions,
        previous_response_id=previous_response_id,
        conversation_id=conversation_id,
        stream=bool(optional_bool(body, "stream", "")),
        store=optional_bool(body, "store", "") is not False,
        truncation=one_of(
            optional_str(body, "truncation", "") or "disabled", ("auto", "disabled"), "truncation"
        ),
        metadata=parse_metadata(body.get("metadata")),
        tools=tools.echo(choice.allowed),
        tool_choice=choice.echo,
        parallel_tool_calls=parallel is not False,
        max_output_tokens=max_output_tokens,
        max_tool_calls=_positive_int(body, "max_tool_calls"),
        temperature=temperature,
        top_p=top_p,
        text=text,
        reasoning=_plain(optional_object(body, "reasoning", "")),
        include=_include(body.get("include")),
        prompt_cache_key=optional_str(body, "prompt_cache_key", ""),
        safety_identifier=optional_str(body, "safety_identifier", ""),
        service_tier=optional_str(body, "service_tier", ""),
        user=optional_str(body, "user", ""),
    )


def _custom_calls_as_function_calls(messages: list[pb.Message]) -> list[pb.Message]:
    """Custom tools are offered as functions taking {"input": string}; show past calls that way."""
    for message in messages:
        for call in message.tool_calls:
            if call.kind == pb.TOOL_KIND_CUSTOM:
                call.arguments = json.dumps({"input": call.arguments}, ensure_ascii=False)
                call.kind = pb.TOOL_KIND_FUNCTION
    return messages


def _conversation_id(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        conversation_id = optional_str(value, "id", "conversation")
        if conversation_id is None:
            raise missing("conversation.id")
        return conversation_id
    raise wrong_type("conversation", "a string or an object with 'id'", value)


def _reject_unsupported(body: Mapping[str, Any]) -> None:
    top_logprobs = optional_int(body, "top_logprobs", "")
    if top_logprobs:
        raise InvalidRequestError(
            "Invalid value for 'top_logprobs': log probabilities are not supported by this server; "
            "omit it or send 0.",
            param="top_logprobs",
            code="unsupported_value",
        )
    if optional_bool(body, "background", ""):
        raise InvalidRequestError(
            "Invalid value for 'background': background responses are not supported.",
            param="background",
            code="unsupported_value",
        )
    for penalty in ("presence_penalty", "frequency_penalty"):
        if optional_number(body, penalty, ""):
            raise InvalidRequestError(
                f"Invalid value for '{penalty}': only 0 is supported.",
                param=penalty,
                code="unsupported_value",
            )
    if body.get("prompt") is not None:
        raise InvalidRequestError(
            "Invalid value for 'prompt': stored prompt templates are not supported; send 'input'.",
            param="prompt",
            code="unsupported_value",
        )


def _text(value: object) -> dict[str, Any]:
    if value is None:
        return {"format": {"type": "text"}}
    text = as_object(value, "text")
    text_format = optional_object(text, "format", "text")
    format_type = optional_str(text_format, "type", "text.format") if text_format is not None else None
    format_type = format_type or "text"
    if format_type in ("json_object", "json_schema"):
        raise InvalidRequestError(
            f"Invalid value for 'text.format': {format_type} output is not supported yet; use "
            "{'type': 'text'} and describe the JSON you want in the instructions.",
            param="text.format",
            code="unsupported_value",
        )
    one_of(format_type, ("text",), "text.format.type")
    verbosity = optional_str(text, "verbosity", "text")
    echo: dict[str, Any] = {"format": {"type": "text"}}
    if verbosity is not None:
        echo["verbosity"] = one_of(verbosity, ("low", "medium", "high"), "text.verbosity")
    return echo


# The contract's token counts are uint32; larger values could not even be sent.
_MAX_COUNT = 2**31 - 1


def _positive_int(body: Mapping[str, Any], key: str) -> int | None:
    value = optional_int(body, key, "")
    if value is not None and value < 1:
        raise InvalidRequestError(f"Invalid value for '{key}': must be at least 1.", param=key)
    if value is not None and value > _MAX_COUNT:
        raise InvalidRequestError(f"Invalid value for '{key}': must be at most {_MAX_COUNT}.", param=key)
    return value


def _bounded(body: Mapping[str, Any], key: str, low: float, high: float) -> float | None:
    value = optional_number(body, key, "")
    if value is not None and not low <= value <= high:
        raise InvalidRequestError(
            f"Invalid value for '{key}': must be between {low:g} and {high:g}.", param=key
        )
    return value


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


def _include(value: object) -> list[str]:
    if value is None:
        return []
    entries = as_list(value, "include")
    for index, entry in enumerate(entries):
        if not isinstance(entry, str):
            raise wrong_type(join("include", index), "a string", entry)
    return list(entries)


def _plain(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if value is None else dict(value)

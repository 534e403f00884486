"""A chat completions request as the Responses body that means the same (one translation).

Every chat field maps onto a Responses field whose handling already exists (messages -> input
items, tool messages -> function_call_output with the same part lists and image lowering, tools,
tool_choice, response_format -> text.format, max_tokens -> max_output_tokens), or onto engine
sampling settings the Responses API has no field for (`seed`, `stop`: the request's `extras`).
What neither can carry is a 400 naming the chat field. Each Responses field written records the
chat path it came from (`PathMap`), so the shared translation's errors name chat fields by lookup.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vlmserve.responses import CreateRequest, EngineExtras, InvalidRequestError, PathMap, translated_body

from ._request_models import (
    AssistantMessageParam,
    ChatCompletionBody,
    ClipPartParam,
    Content,
    FilePartParam,
    ImageURLPartParam,
    OtherMessageParam,
    RefusalPartParam,
    SystemMessageParam,
    TextPartParam,
    ToolMessageParam,
    UserMessageParam,
    parse_chat_body,
)


@dataclass
class ChatRequest:
    """A parsed chat request: the create request it means (its Responses body, typed, and the
    engine settings that body has no field for), and how the answer is written."""

    request: CreateRequest
    stream: bool
    include_usage: bool
    # `logprobs: true`: choices carry `logprobs.content`.
    logprobs: bool = False
    # Each Responses field written -> the chat path it came from (`input[3]` -> `messages[2]`).
    paths: PathMap = field(default_factory=PathMap)

    def chat_param(self, param: str) -> str:
        """A Responses field path (from the shared translation) as the chat field it came from;
        a field both APIs spell alike (`temperature`) as it is."""
        return self.paths.rename(param)


# Responses body fields the chat request spells otherwise (the rest are spelt alike).
_BODY_FIELDS = (
    ("input", "messages"),
    ("text.format", "response_format"),
    ("text.format.schema", "response_format.json_schema.schema"),
    ("text.format.name", "response_format.json_schema.name"),
    ("text.format.description", "response_format.json_schema.description"),
    ("text.format.strict", "response_format.json_schema.strict"),
    ("tool_choice.name", "tool_choice.function.name"),
    ("reasoning", "reasoning_effort"),
    ("reasoning.effort", "reasoning_effort"),
    ("include", "logprobs"),
)
# A Responses function tool's fields, which chat nests under `function`.
_TOOL_FIELDS = ("name", "description", "parameters", "strict")
# A file part's fields, which chat nests under `file`.
_FILE_FIELDS = ("file_id", "file_data", "filename")


def _unsupported(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"Invalid value for '{param}': {message}", param=param, code="unsupported_value"
    )


def _parts(
    content: Content, where: str, *, text_type: str, images: bool, paths: PathMap, path: str
) -> list[dict[str, Any]]:
    """The parts of chat `content` at `where`, written at Responses `path` (`input[3].content`)."""
    paths.add(path, where)
    if isinstance(content, str):
        paths.add(f"{path}[0]", where)
        return [{"type": text_type, "text": content}]
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        at = f"{where}[{index}]"
        if isinstance(part, TextPartParam):
            parts.append({"type": text_type, "text": part.text})
        elif isinstance(part, RefusalPartParam) and text_type == "output_text":
            parts.append({"type": text_type, "text": part.refusal})
        elif isinstance(part, ImageURLPartParam) and images:
            image: dict[str, Any] = {"type": "input_image", "image_url": part.image_url.url}
            image["detail"] = part.image_url.detail or "auto"
            parts.append(image)
            # Chat nests the URL and detail under `image_url`.
            paths.add(f"{path}[{index}].image_url", f"{at}.image_url.url")
            paths.add(f"{path}[{index}].detail", f"{at}.image_url.detail")
        elif isinstance(part, FilePartParam) and images:
            fields = {
                "file_id": part.file.file_id,
                "file_data": part.file.file_data,
                "filename": part.file.filename,
            }
            parts.append({"type": "input_file", **{k: v for k, v in fields.items() if v is not None}})
            for name in _FILE_FIELDS:
                paths.add(f"{path}[{index}].{name}", f"{at}.file.{name}")
        elif isinstance(part, ClipPartParam) and images:
            # The Responses translation takes chat's video and audio shapes as they are, field
            # for field (so each field's path below the part is the chat one).
            parts.append(part.model_dump(mode="json", exclude_unset=True))
            paths.add(f"{path}[{index}]", at)
        else:
            raise _unsupported(f"{at}.type", f"'{part.type}' parts are not supported in this message.")
    return parts


def _input_items(body: ChatCompletionBody, paths: PathMap) -> list[dict[str, Any]]:
    """The messages as input items; `paths` gets each item's (and field's) chat path."""
    items: list[dict[str, Any]] = []

    def add(item: dict[str, Any], origin: str, fields: dict[str, str] | None = None) -> None:
        """Append `item`, recording where it (and each named field of it) came from."""
        path = f"input[{len(items)}]"
        items.append(item)
        paths.add(path, origin)
        for name, field_origin in (fields or {}).items():
            paths.add(f"{path}.{name}", field_origin)

    for index, message in enumerate(body.messages):
        where = f"messages[{index}]"
        content_at = f"{where}.content"
        next_path = f"input[{len(items)}]"
        if isinstance(message, SystemMessageParam | UserMessageParam):
            # Images in system/developer turns follow the same lowering as on /v1/responses.
            role = "user" if isinstance(message, UserMessageParam) else message.role
            parts = _parts(
                message.content,
                content_at,
                text_type="input_text",
                images=True,
                paths=paths,
                path=f"{next_path}.content",
            )
            add({"type": "message", "role": role, "content": parts}, where)
        elif isinstance(message, AssistantMessageParam):
            if message.reasoning_content:
                reasoning = {"type": "reasoning_text", "text": message.reasoning_content}
                add(
                    {"type": "reasoning", "summary": [], "content": [reasoning]}, f"{where}.reasoning_content"
                )
            if message.content is not None and message.content != "" and message.content != []:
                parts = _parts(
                    message.content,
                    content_at,
                    text_type="output_text",
                    images=False,
                    paths=paths,
                    path=f"input[{len(items)}].content",
                )
                add({"type": "message", "role": "assistant", "content": parts}, where)
            for number, call in enumerate(message.tool_calls or []):
                at = f"{where}.tool_calls[{number}]"
                call_item = {
                    "type": "function_call",
                    "call_id": call.id,
                    "name": call.function.name,
                    "arguments": call.function.arguments,
                }
                fields = {
                    "call_id": f"{at}.id",
                    "name": f"{at}.function.name",
                    "arguments": f"{at}.function.arguments",
                }
                add(call_item, at, fields)
        elif isinstance(message, ToolMessageParam):
            content = message.content
            output: str | list[dict[str, Any]] = (
                content
                if isinstance(content, str)
                else _parts(
                    content,
                    content_at,
                    text_type="input_text",
                    images=True,
                    paths=paths,
                    path=f"{next_path}.output",
                )
            )
            output_item = {"type": "function_call_output", "call_id": message.tool_call_id, "output": output}
            add(output_item, where, {"call_id": f"{where}.tool_call_id", "output": content_at})
        else:
            assert isinstance(message, OtherMessageParam)
            raise _unsupported(f"{where}.role", f"'{message.role}' messages are not supported; use 'tool'.")
    return items


def _tools(body: ChatCompletionBody, paths: PathMap) -> list[dict[str, Any]] | None:
    if body.tools is None:
        return None
    tools: list[dict[str, Any]] = []
    for index, tool in enumerate(body.tools):
        if tool.type != "function":
            raise _unsupported(
                f"tools[{index}].type", f"'{tool.type}' tools are not supported; use 'function'."
            )
        if tool.function is None:
            raise InvalidRequestError(
                f"Missing required parameter: 'tools[{index}].function'.",
                param=f"tools[{index}].function",
                code="missing_required_parameter",
            )
        definition = tool.function
        for name in _TOOL_FIELDS:
            paths.add(f"tools[{index}].{name}", f"tools[{index}].function.{name}")
        tools.append(
            {
                "type": "function",
                "name": definition.name,
                "description": definition.description,
                "parameters": definition.parameters,
                "strict": definition.strict,
            }
        )
    return tools


def _text_format(body: ChatCompletionBody) -> dict[str, Any] | None:
    response_format = body.response_format
    if response_format is None:
        return None
    if response_format.type != "json_schema":
        return {"format": {"type": response_format.type}}
    schema = response_format.json_schema
    if schema is None:
        raise InvalidRequestError(
            "Missing required parameter: 'response_format.json_schema'.",
            param="response_format.json_schema",
            code="missing_required_parameter",
        )
    text_format: dict[str, Any] = {"type": "json_schema", "name": schema.name}
    if schema.description is not None:
        text_format["description"] = schema.description
    text_format["schema"] = schema.schema_ if schema.schema_ is not None else {}
    if schema.strict is not None:
        text_format["strict"] = schema.strict
    return {"format": text_format}


def _refuse_unsupported(body: ChatCompletionBody) -> None:
    if body.n is not None and body.n != 1:
        raise _unsupported("n", "only one choice per request is supported (n = 1).")
    if body.top_logprobs and not body.logprobs:
        raise InvalidRequestError(
            "Invalid value for 'top_logprobs': 'logprobs' must be true when 'top_logprobs' is set.",
            param="top_logprobs",
        )
    if body.logit_bias:
        raise _unsupported("logit_bias", "logit bias is not supported by this server.")
    if body.store:
        raise _unsupported("store", "stored chat completions are not supported; use /v1/responses.")
    if body.stream_options is not None and not body.stream:
        raise InvalidRequestError(
            "Invalid value for 'stream_options': only allowed when 'stream' is true.", param="stream_options"
        )


def chat_request(raw: object) -> ChatRequest:
    """Validate a chat completions body and translate it (InvalidRequestError naming the field)."""
    body = parse_chat_body(raw)
    _refuse_unsupported(body)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    max_tokens_param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    paths = PathMap()
    for path, origin in (*_BODY_FIELDS, ("max_output_tokens", max_tokens_param)):
        paths.add(path, origin)
    responses_body: dict[str, Any] = {
        "model": body.model,
        "input": _input_items(body, paths),
        "store": False,
        "stream": bool(body.stream),
    }
    optional: dict[str, Any] = {
        "tools": _tools(body, paths),
        "tool_choice": (
            {"type": "function", "name": body.tool_choice.function.name}
            if body.tool_choice is not None and not isinstance(body.tool_choice, str)
            else body.tool_choice
        ),
        "parallel_tool_calls": body.parallel_tool_calls,
        "text": _text_format(body),
        "max_output_tokens": max_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        # Refused by the Responses translation unless 0, under the same name.
        "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty,
        "reasoning": {"effort": body.reasoning_effort} if body.reasoning_effort is not None else None,
        "metadata": body.metadata,
        "service_tier": body.service_tier,
        "prompt_cache_key": body.prompt_cache_key,
        "safety_identifier": body.safety_identifier,
        "user": body.user,
        # The Responses way to ask for token logprobs.
        "include": ["message.output_text.logprobs"] if body.logprobs else None,
        "top_logprobs": body.top_logprobs if body.logprobs else None,
        "mm_processor_kwargs": body.mm_processor_kwargs,
    }
    responses_body.update({key: value for key, value in optional.items() if value is not None})
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    return ChatRequest(
        request=CreateRequest(
            translated_body(responses_body, paths), EngineExtras(stop=stop, seed=body.seed)
        ),
        stream=bool(body.stream),
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
        logprobs=bool(body.logprobs),
        paths=paths,
    )

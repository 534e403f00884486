"""The `POST /v1/responses` body as pydantic models: liberal in, every error an exact JSON path.

Liberal: unknown fields are kept (`extra="allow"`), an item without `type` is a message when it
has a `role` and an item reference when it has only an `id`, and what Codex sends (items with
ids and statuses, `namespace` tools, hosted tools, `client_metadata`) validates as it is. Types
are strict (no "5" for 5), so a wrong type is a 400 and never a silent conversion.

`parse_body` turns a pydantic ValidationError into the InvalidRequestError the rest of the
translation raises (`_validation.py`): `param` from the error's `loc`
(`input[2].content[0].image_url`), `code` from its type. Items and parts are in
`_input_models.py`, tools in `_tool_models.py`. The facade's OpenAPI document is generated from
these same models.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeAlias

from pydantic import (
    BeforeValidator,
    Field,
    Tag,
    TypeAdapter,
)

from ._input_models import InputParam
from ._tool_models import ToolChoiceParam, ToolParam
from ._validation import RequestModel, by_json_type, parse_as

# ---- the body ----------------------------------------------------------------------------------

# The contract's token counts are uint32; larger values could not even be sent.
MAX_COUNT = 2**31 - 1


def _integral(value: object) -> object:
    # JSON has one number type: 100.0 is the integer 100 (as JSON Schema's "integer" says).
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Count: TypeAlias = Annotated[int, BeforeValidator(_integral), Field(ge=1, le=MAX_COUNT)]


class ConversationParam(RequestModel):
    id: str


class TextFormatParam(RequestModel):
    """`text`, `json_object`, or `json_schema` with its fields (checked in _text_format.py)."""

    type: str = Field(default="text", json_schema_extra={"enum": ["text", "json_object", "json_schema"]})
    name: str | None = None
    description: str | None = None
    # `schema` would shadow BaseModel.schema; the JSON key is still "schema".
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextParam(RequestModel):
    format: TextFormatParam | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfigParam(RequestModel):
    """Accepted (Codex sends it); this server's models do not take a reasoning budget."""

    effort: str | None = None
    summary: str | None = None


# OpenAI's documented `include` values. Each is honoured or has nothing to add here:
# `message.output_text.logprobs` fills output_text parts' `logprobs`; this server runs no hosted
# tools (no search / code interpreter results exist), has nothing to encrypt in reasoning items,
# and already returns input images' URLs as sent.
IncludeValue: TypeAlias = Literal[
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "code_interpreter_call.outputs",
]
ServiceTier: TypeAlias = Literal["auto", "default", "flex", "priority"]


ConversationChoice: TypeAlias = Annotated[
    Annotated[str, Tag("#string")] | Annotated[ConversationParam, Tag("#object")],
    by_json_type("a string or an object with 'id'"),
]


class CreateResponseBody(RequestModel):
    """`POST /v1/responses` (and `/input_tokens`): the Open Responses `CreateResponseBody`."""

    model: str | None = Field(default=None, description='The loaded model\'s id, or "default".')
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None
    instructions: str | None = None
    input: InputParam = Field(description="A string (one user message) or an array of input items.")
    previous_response_id: str | None = None
    conversation: ConversationChoice | None = None
    max_output_tokens: Count | None = None
    max_tool_calls: Count | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    # Accepted only at their neutral values (the translation says why otherwise); the document
    # names the values that work.
    # With include `message.output_text.logprobs` (or alone): alternatives per token.
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    presence_penalty: float | None = Field(default=None, json_schema_extra={"enum": [0, None]})
    frequency_penalty: float | None = Field(default=None, json_schema_extra={"enum": [0, None]})
    parallel_tool_calls: bool | None = None
    stream: bool | None = None
    store: bool | None = None
    # Needs `store` (a background response is polled and resumed from the store).
    background: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    text: TextParam | None = None
    reasoning: ReasoningConfigParam | None = None
    metadata: dict[str, Any] | None = Field(
        default=None,
        description="At most 16 pairs; keys at most 64 characters, values strings of at most 512.",
        json_schema_extra={"maxProperties": 16, "additionalProperties": {"type": "string", "maxLength": 512}},
    )
    include: list[IncludeValue] | None = None
    # Stored prompt templates: not supported (send `input`).
    prompt: dict[str, Any] | None = Field(default=None, json_schema_extra={"enum": [None]})
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # Accepted and echoed; every request runs the same way (docs/responses-api.md).
    service_tier: ServiceTier | None = None
    user: str | None = None
    # vLLM's: sampling for every video part that says none itself (docs/video-audio.md); keys
    # fps, max_frames, min_pixels, max_pixels; any other is a 400 naming it.
    mm_processor_kwargs: dict[str, Any] | None = None


_BODY = TypeAdapter(CreateResponseBody)


def parse_body(body: object) -> CreateResponseBody:
    """Validate a whole request body."""
    return parse_as(_BODY, body, "")

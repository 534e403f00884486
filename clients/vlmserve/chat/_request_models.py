"""The `POST /v1/chat/completions` body as pydantic models (liberal in, strict types, exact paths).

Only the shapes are checked here; what a field means is decided by one translation to a
Responses body (`_to_responses.py`), so tools, tool_choice, response_format, images and their
limits behave exactly as on `/v1/responses`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeAlias

from pydantic import Discriminator, Field, Tag, TypeAdapter

from vlmserve.responses import (
    OTHER,
    AudioURLPartParam,
    ChatVideoURLPartParam,
    Count,
    InputAudioPartParam,
    InputVideoPartParam,
    RequestModel,
    ServiceTier,
    VideoPartParam,
    by_json_type,
    by_type,
    parse_as,
)

# ---- message content parts ----------------------------------------------------------------------


class ImageURLParam(RequestModel):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class TextPartParam(RequestModel):
    type: Literal["text"]
    text: str


class ImageURLPartParam(RequestModel):
    type: Literal["image_url"]
    image_url: ImageURLParam


class RefusalPartParam(RequestModel):
    type: Literal["refusal"]
    refusal: str


class FileParam(RequestModel):
    file_id: str | None = None
    file_data: str | None = None
    filename: str | None = None


class FilePartParam(RequestModel):
    """A file (PDF, text, image): the Responses `input_file` part, nested under `file`."""

    type: Literal["file"]
    file: FileParam


# Video and audio (docs/video-audio.md): the same shapes as on /v1/responses, which takes them as
# they are: `video_url` ({url} or {file_id}), `input_video`, `video` (a URL or frame image URLs),
# OpenAI's `input_audio` ({data, format}), vLLM's `audio_url`; `fps`, `max_frames`, ... beside a video's
# source.
ClipPartParam: TypeAlias = (
    ChatVideoURLPartParam | InputVideoPartParam | VideoPartParam | InputAudioPartParam | AudioURLPartParam
)


class OtherPartParam(RequestModel):
    """Any other part type: refused by name in the translation."""

    type: str


PartParam: TypeAlias = Annotated[
    Annotated[TextPartParam, Tag("#text")]
    | Annotated[ImageURLPartParam, Tag("#image_url")]
    | Annotated[RefusalPartParam, Tag("#refusal")]
    | Annotated[FilePartParam, Tag("#file")]
    | Annotated[ChatVideoURLPartParam, Tag("#video_url")]
    | Annotated[InputVideoPartParam, Tag("#input_video")]
    | Annotated[VideoPartParam, Tag("#video")]
    | Annotated[InputAudioPartParam, Tag("#input_audio")]
    | Annotated[AudioURLPartParam, Tag("#audio_url")]
    | Annotated[OtherPartParam, Tag(OTHER)],
    by_type(
        {
            "text": "#text",
            "image_url": "#image_url",
            "refusal": "#refusal",
            "file": "#file",
            "video_url": "#video_url",
            "input_video": "#input_video",
            "video": "#video",
            "input_audio": "#input_audio",
            "audio_url": "#audio_url",
        }
    ),
]

Content: TypeAlias = Annotated[
    Annotated[str, Tag("#string")] | Annotated[list[PartParam], Tag("#array")],
    by_json_type("a string or an array of content parts"),
]

# ---- messages -----------------------------------------------------------------------------------


class FunctionCallParam(RequestModel):
    name: str
    arguments: str


class ToolCallParam(RequestModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallParam


class SystemMessageParam(RequestModel):
    role: Literal["system", "developer"]
    content: Content
    name: str | None = None


class UserMessageParam(RequestModel):
    role: Literal["user"]
    content: Content
    name: str | None = None


class AssistantMessageParam(RequestModel):
    role: Literal["assistant"]
    content: Content | None = None
    # The turn's thinking (DeepSeek / vLLM's field): replayed where the chat template renders it.
    reasoning_content: str | None = None
    tool_calls: list[ToolCallParam] | None = None
    refusal: str | None = None
    name: str | None = None


class ToolMessageParam(RequestModel):
    role: Literal["tool"]
    tool_call_id: str
    content: Content


class OtherMessageParam(RequestModel):
    """`function` (deprecated) or an unknown role: refused by name in the translation."""

    role: str


_ROLE_TAGS = {
    "system": "#system",
    "developer": "#system",
    "user": "#user",
    "assistant": "#assistant",
    "tool": "#tool",
}


def _role(value: Any) -> str:
    role = value.get("role") if isinstance(value, dict) else None
    return _ROLE_TAGS.get(role, OTHER) if isinstance(role, str) else OTHER


MessageParam: TypeAlias = Annotated[
    Annotated[SystemMessageParam, Tag("#system")]
    | Annotated[UserMessageParam, Tag("#user")]
    | Annotated[AssistantMessageParam, Tag("#assistant")]
    | Annotated[ToolMessageParam, Tag("#tool")]
    | Annotated[OtherMessageParam, Tag(OTHER)],
    Discriminator(_role),
]

# ---- tools and formats --------------------------------------------------------------------------


class FunctionDefinitionParam(RequestModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolParam(RequestModel):
    type: str = Field(json_schema_extra={"enum": ["function"]})
    function: FunctionDefinitionParam | None = None


class NamedFunctionParam(RequestModel):
    name: str


class NamedToolChoiceParam(RequestModel):
    type: Literal["function"]
    function: NamedFunctionParam


ToolChoiceParam: TypeAlias = Annotated[
    Annotated[Literal["none", "auto", "required"], Tag("#string")]
    | Annotated[NamedToolChoiceParam, Tag("#object")],
    by_json_type("'none', 'auto', 'required' or an object naming a function"),
]


class JsonSchemaParam(RequestModel):
    name: str
    description: str | None = None
    # `schema` would shadow BaseModel.schema; the JSON key is still "schema".
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormatParam(RequestModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaParam | None = None


class StreamOptionsParam(RequestModel):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


Stop: TypeAlias = Annotated[
    Annotated[str, Tag("#string")] | Annotated[Annotated[list[str], Field(max_length=4)], Tag("#array")],
    by_json_type("a string or an array of at most 4 strings"),
]


class ChatCompletionBody(RequestModel):
    """`POST /v1/chat/completions`: OpenAI's `CreateChatCompletionRequest`."""

    model: str | None = Field(default=None, description='The loaded model\'s id, or "default".')
    messages: list[MessageParam] = Field(min_length=1)
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormatParam | None = None
    max_tokens: Count | None = None
    max_completion_tokens: Count | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    n: int | None = Field(default=None, json_schema_extra={"enum": [1, None]})
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None
    stop: Stop | None = None
    stream: bool | None = None
    stream_options: StreamOptionsParam | None = None
    logprobs: bool | None = None
    # Needs `logprobs: true`.
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = Field(default=None, json_schema_extra={"enum": [False, None]})
    service_tier: ServiceTier | None = None
    modalities: list[Literal["text"]] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    user: str | None = None
    # vLLM's: sampling for every video part that says none itself (fps, max_frames, min_pixels,
    # max_pixels; any other key is a 400 naming it).
    mm_processor_kwargs: dict[str, Any] | None = None


_BODY = TypeAdapter(ChatCompletionBody)


def parse_chat_body(body: object) -> ChatCompletionBody:
    """Validate a whole chat completions body (InvalidRequestError naming the field)."""
    return parse_as(_BODY, body, "")

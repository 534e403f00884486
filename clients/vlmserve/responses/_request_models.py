"""The `POST /v1/responses` body as pydantic models: liberal in, every error an exact JSON path.

Liberal: unknown fields are kept (`extra="allow"`), an item without `type` is a message when it
has a `role` and an item reference when it has only an `id`, and what Codex sends (items with
ids and statuses, `namespace` tools, hosted tools, `client_metadata`) validates as it is. Types
are strict (no "5" for 5), so a wrong type is a 400 and never a silent conversion.

`parse_body` (and `parse_items`) turn a pydantic ValidationError into the InvalidRequestError the
rest of the translation raises: `param` from the error's `loc` (`input[2].content[0].image_url`),
`code` from its type. The OpenAPI document of the facade is generated from these same models.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal, TypeAlias, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    field_validator,
)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from ._errors import InvalidRequestError
from ._json import join, type_name

# Union members are tagged with a leading "#"; a tag is dropped from an error's `loc`.
_TAG = "#"
_OTHER = "#other"
# Union members that exist only to refuse a value by name stay out of the OpenAPI document.
_UNDOCUMENTED: Any = SkipJsonSchema()  # type: ignore[type-arg]


class RequestModel(BaseModel):
    """A part of a request: unknown fields kept, types strict."""

    model_config = ConfigDict(extra="allow", strict=True)


def _json_kind(value: object) -> str | None:
    if isinstance(value, str):
        return "#string"
    if isinstance(value, list):
        return "#array"
    if isinstance(value, Mapping):
        return "#object"
    return None


def by_json_type(expected: str) -> Discriminator:
    """Chooses a union member (tagged `#string`, `#array`, `#object`) by the JSON type of the
    value, so that an error names one member's path and a value of another type is one
    `invalid_type` error."""
    return Discriminator(
        _json_kind, custom_error_type="invalid_type", custom_error_message=f"expected {expected}"
    )


def by_type(
    tags: Mapping[str, str], *, implicit: Callable[[Mapping[str, Any]], str] | None = None
) -> Discriminator:
    """Chooses a union member by the value's `type` (`tags`: type -> member tag); anything else
    (no type, an unknown one, not an object) goes to the member tagged `#other`, whose own
    validation says what is wrong and where."""

    def tag(value: object) -> str:
        if not isinstance(value, Mapping):
            return _OTHER
        kind = value.get("type")
        if kind is None and implicit is not None:
            kind = implicit(value)
        return tags.get(kind, _OTHER) if isinstance(kind, str) else _OTHER

    return Discriminator(tag)


def refuse(code: str, message: str) -> PydanticCustomError:
    """A validation error with our code; `{param}` in the message becomes the field's path."""
    return PydanticCustomError(code, message)


# ---- content parts -----------------------------------------------------------------------------

ImageDetailParam = Literal["auto", "low", "high", "original"]
# A 2x2 PNG: lets generated requests (schemathesis) carry an image that decodes.
EXAMPLE_IMAGE_URL = (
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR42mM8oaHBwMDAxMDAwMDAAAAN6gEcJklYAwAAAABJRU5ErkJggg=="
)
TEXT_PART_TYPES = ("input_text", "text", "output_text")
IMAGE_PART_TYPES = ("input_image", "image_url")
MESSAGE_PART_TYPES = (*TEXT_PART_TYPES, *IMAGE_PART_TYPES, "refusal")

# Parts with a known meaning that we cannot serve yet: refused by name wherever they appear.
UNSUPPORTED_PARTS = {
    "input_file": (
        "input_file parts are not supported yet; send images as input_image parts with a base64 "
        "data: URL and documents as input_text"
    ),
    "file": "file parts are not supported yet; send documents as input_text",
    "input_audio": "audio input is not supported by this server; send text or images",
    "video_url": "video input is not supported by this server; send text or images",
    "input_video": "video input is not supported by this server; send text or images",
}


class TextPartParam(RequestModel):
    type: Literal["input_text", "text", "output_text"]
    text: str


class RefusalPartParam(RequestModel):
    type: Literal["refusal"]
    refusal: str


class InputImagePartParam(RequestModel):
    type: Literal["input_image"]
    # A base64 data: URL (http(s) only where the server fetches remote images). `file_id` is
    # refused by the translation: this server has no files store.
    image_url: str | None = Field(default=None, examples=[EXAMPLE_IMAGE_URL])
    file_id: str | None = None
    detail: ImageDetailParam | None = None


class ImageURLParam(RequestModel):
    url: str
    detail: ImageDetailParam | None = None


class ChatImagePartParam(RequestModel):
    """The Chat Completions form: `image_url` is `{url, detail}` or a plain URL string."""

    type: Literal["image_url"]
    image_url: Annotated[
        Annotated[str, Tag("#string")] | Annotated[ImageURLParam, Tag("#object")],
        by_json_type("an object with 'url' or a string"),
    ]
    detail: ImageDetailParam | None = None


class UnsupportedPartParam(RequestModel):
    type: str

    @field_validator("type")
    @classmethod
    def _refused(cls, value: str) -> str:
        raise refuse("unsupported_value", UNSUPPORTED_PARTS[value] + ".")


class UnknownPartParam(RequestModel):
    """Any other message part: its `type` says what is wrong."""

    type: str

    @field_validator("type")
    @classmethod
    def _unknown(cls, value: str) -> str:
        raise refuse(
            "invalid_value",
            "Invalid value for '{param}': unsupported content part type; supported: "
            "input_text, input_image, text, image_url, output_text, refusal.",
        )


_PART_TAGS = {
    **dict.fromkeys(TEXT_PART_TYPES, "#text"),
    "input_image": "#input_image",
    "image_url": "#image_url",
    **dict.fromkeys(UNSUPPORTED_PARTS, "#unsupported"),
}
MessagePartParam: TypeAlias = Annotated[
    Annotated[TextPartParam, Tag("#text")]
    | Annotated[InputImagePartParam, Tag("#input_image")]
    | Annotated[ChatImagePartParam, Tag("#image_url")]
    | Annotated[UnsupportedPartParam, Tag("#unsupported"), _UNDOCUMENTED]
    | Annotated[RefusalPartParam, Tag("#refusal")]
    | Annotated[UnknownPartParam, Tag(_OTHER), _UNDOCUMENTED],
    by_type({**_PART_TAGS, "refusal": "#refusal"}),
]
# In a tool output, a part of any other kind is kept as the caller's JSON (its text reaches the
# model as one JSON line; docs/responses-api.md).
ToolOutputPartParam: TypeAlias = Annotated[
    Annotated[TextPartParam, Tag("#text")]
    | Annotated[InputImagePartParam, Tag("#input_image")]
    | Annotated[ChatImagePartParam, Tag("#image_url")]
    | Annotated[UnsupportedPartParam, Tag("#unsupported"), _UNDOCUMENTED]
    | Annotated[dict[str, Any], Tag(_OTHER)],
    by_type(_PART_TAGS),
]


# ---- input items -------------------------------------------------------------------------------

MessageRole = Literal["user", "assistant", "system", "developer"]
INPUT_ITEM_TYPES = (
    "message",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "reasoning",
    "item_reference",
)


class MessageParam(RequestModel):
    # Optional: an "easy input message" is just role + content.
    type: Literal["message"] | None = "message"
    role: MessageRole
    content: Annotated[
        Annotated[str, Tag("#string")] | Annotated[list[MessagePartParam], Tag("#array")],
        by_json_type("a string or an array of content parts"),
    ]


class FunctionCallParam(RequestModel):
    type: Literal["function_call"]
    name: str
    arguments: str
    call_id: str
    namespace: str | None = None


class CustomToolCallParam(RequestModel):
    type: Literal["custom_tool_call"]
    name: str
    input: str
    call_id: str
    namespace: str | None = None


ToolOutputParam: TypeAlias = Annotated[
    Annotated[str, Tag("#string")] | Annotated[list[ToolOutputPartParam], Tag("#array")],
    by_json_type("a string or an array of content parts"),
]


class FunctionCallOutputParam(RequestModel):
    type: Literal["function_call_output"]
    call_id: str
    output: ToolOutputParam


class CustomToolCallOutputParam(RequestModel):
    type: Literal["custom_tool_call_output"]
    call_id: str
    output: ToolOutputParam


class ReasoningParam(RequestModel):
    """Accepted and not rendered: nothing reaches the model from it."""

    type: Literal["reasoning"]


class ItemReferenceParam(RequestModel):
    # Optional: a bare {"id": ...} refers to a stored item.
    type: Literal["item_reference"] | None = "item_reference"
    id: str


class UnknownItemParam(RequestModel):
    type: str

    @field_validator("type")
    @classmethod
    def _unknown(cls, value: str) -> str:
        raise refuse(
            "invalid_value",
            "Invalid value for '{param}': unsupported input item type; supported: "
            + ", ".join(INPUT_ITEM_TYPES)
            + ".",
        )


def _implicit_item_type(item: Mapping[str, Any]) -> str:
    # Easy-input messages carry only role + content; a bare {"id"} is an item reference.
    if "role" in item:
        return "message"
    return "item_reference" if "id" in item else ""


InputItemParam: TypeAlias = Annotated[
    Annotated[MessageParam, Tag("#message")]
    | Annotated[FunctionCallParam, Tag("#function_call")]
    | Annotated[FunctionCallOutputParam, Tag("#function_call_output")]
    | Annotated[CustomToolCallParam, Tag("#custom_tool_call")]
    | Annotated[CustomToolCallOutputParam, Tag("#custom_tool_call_output")]
    | Annotated[ReasoningParam, Tag("#reasoning")]
    | Annotated[ItemReferenceParam, Tag("#item_reference")]
    | Annotated[UnknownItemParam, Tag(_OTHER), _UNDOCUMENTED],
    by_type({kind: f"#{kind}" for kind in INPUT_ITEM_TYPES}, implicit=_implicit_item_type),
]
# Documented as non-empty; an empty input is refused by the translation, which says why.
InputParam: TypeAlias = Annotated[
    Annotated[str, Tag("#string"), WithJsonSchema({"type": "string", "minLength": 1, "pattern": "\\S"})]
    | Annotated[list[InputItemParam], Tag("#array"), Field(json_schema_extra={"minItems": 1})],
    by_json_type("a string or an array of input items"),
]


# ---- tools -------------------------------------------------------------------------------------

# OpenAI's tool types that run on OpenAI's side (or, like tool_search, ask for a feature this
# server has not): accepted, left out of the prompt, and named in `ignored` (the facade's
# x-vlmserve-ignored-tools header), which therefore only ever carries these names.
HOSTED_TOOL_TYPES = frozenset(
    {
        "apply_patch",
        "code_interpreter",
        "computer",
        "computer_use_preview",
        "file_search",
        "image_generation",
        "local_shell",
        "mcp",
        "programmatic_tool_calling",
        "shell",
        "tool_search",
        "web_search",
        "web_search_2025_08_26",
        "web_search_preview",
        "web_search_preview_2025_03_11",
    }
)


# OpenAI's rule for tool names, documented; this server accepts any non-empty name.
_TOOL_NAME_DOC: dict[str, Any] = {"pattern": "^[a-zA-Z0-9_-]{1,64}$"}


class FunctionToolParam(RequestModel):
    type: Literal["function"]
    name: str = Field(json_schema_extra=_TOOL_NAME_DOC)
    description: str | None = None
    # A JSON Schema object; absent means no arguments.
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class CustomToolFormatParam(RequestModel):
    type: str
    syntax: str | None = None
    definition: str | None = None


class CustomToolParam(RequestModel):
    """A free-form tool: offered to the model as a function taking `{"input": string}`."""

    type: Literal["custom"]
    name: str
    description: str | None = None
    format: CustomToolFormatParam | None = None


_HOSTED_DOC: dict[str, Any] = {"enum": sorted(HOSTED_TOOL_TYPES)}


class HostedToolParam(RequestModel):
    """One of OpenAI's hosted tools: accepted, left out of the prompt, named in a header."""

    type: str = Field(json_schema_extra=_HOSTED_DOC)

    @field_validator("type")
    @classmethod
    def _hosted(cls, value: str) -> str:
        if value not in HOSTED_TOOL_TYPES:
            raise refuse(
                "unsupported_value",
                "Invalid value for '{param}': unsupported tool type; supported: function, custom, "
                "namespace, and OpenAI's hosted tools (accepted, but they do not run here).",
            )
        return value


NamespaceMemberParam: TypeAlias = Annotated[
    Annotated[FunctionToolParam, Tag("#function")]
    | Annotated[CustomToolParam, Tag("#custom")]
    | Annotated[HostedToolParam, Tag(_OTHER)],
    by_type({"function": "#function", "custom": "#custom"}),
]


class NamespaceToolParam(RequestModel):
    """A group of function and custom tools; each is offered under its own name."""

    type: Literal["namespace"]
    name: str
    description: str | None = None
    tools: list[NamespaceMemberParam] = Field(default_factory=list)


ToolParam: TypeAlias = Annotated[
    Annotated[FunctionToolParam, Tag("#function")]
    | Annotated[CustomToolParam, Tag("#custom")]
    | Annotated[NamespaceToolParam, Tag("#namespace")]
    | Annotated[HostedToolParam, Tag(_OTHER)],
    by_type({"function": "#function", "custom": "#custom", "namespace": "#namespace"}),
]


class NamedToolChoiceParam(RequestModel):
    type: Literal["function", "custom"]
    name: str


class AllowedToolParam(RequestModel):
    """An entry of `allowed_tools`; hosted entries are accepted and mean nothing here."""

    type: str
    name: str | None = None


class AllowedToolsChoiceParam(RequestModel):
    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[AllowedToolParam]


class HostedToolChoiceParam(RequestModel):
    type: str

    @field_validator("type")
    @classmethod
    def _refused(cls, value: str) -> str:
        raise refuse(
            "unsupported_value",
            "Invalid value for '{param}': only function, custom and allowed_tools choices are "
            "supported; hosted tools do not run on this server.",
        )


ToolChoiceMode = Literal["none", "auto", "required"]
ToolChoiceObject: TypeAlias = Annotated[
    Annotated[NamedToolChoiceParam, Tag("#named")]
    | Annotated[AllowedToolsChoiceParam, Tag("#allowed_tools")]
    | Annotated[HostedToolChoiceParam, Tag(_OTHER), _UNDOCUMENTED],
    by_type({"function": "#named", "custom": "#named", "allowed_tools": "#allowed_tools"}),
]
ToolChoiceParam: TypeAlias = Annotated[
    Annotated[ToolChoiceMode, Tag("#string")] | Annotated[ToolChoiceObject, Tag("#object")],
    by_json_type("a string or an object"),
]


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
    type: str = Field(default="text", json_schema_extra={"enum": ["text"]})


class TextParam(RequestModel):
    format: TextFormatParam | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfigParam(RequestModel):
    """Accepted (Codex sends it); this server's models do not take a reasoning budget."""

    effort: str | None = None
    summary: str | None = None


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
    top_logprobs: int | None = Field(default=None, json_schema_extra={"enum": [0, None]})
    presence_penalty: float | None = Field(default=None, json_schema_extra={"enum": [0, None]})
    frequency_penalty: float | None = Field(default=None, json_schema_extra={"enum": [0, None]})
    parallel_tool_calls: bool | None = None
    stream: bool | None = None
    store: bool | None = None
    background: bool | None = Field(default=None, json_schema_extra={"enum": [False, None]})
    truncation: Literal["auto", "disabled"] | None = None
    text: TextParam | None = None
    reasoning: ReasoningConfigParam | None = None
    metadata: dict[str, Any] | None = Field(
        default=None,
        description="At most 16 pairs; keys at most 64 characters, values strings of at most 512.",
        json_schema_extra={"maxProperties": 16, "additionalProperties": {"type": "string", "maxLength": 512}},
    )
    include: list[str] | None = None
    # Stored prompt templates: not supported (send `input`).
    prompt: dict[str, Any] | None = Field(default=None, json_schema_extra={"enum": [None]})
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    user: str | None = None


# ---- ValidationError -> InvalidRequestError ------------------------------------------------------

_EXPECTED = {
    "string_type": "a string",
    "bool_type": "a boolean",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}

M = TypeVar("M")


def param_of(location: Sequence[int | str], prefix: str = "") -> str:
    """An error's `loc` as a JSON path: union tags dropped, `input[2].content`."""
    path = prefix
    for part in location:
        if isinstance(part, str) and part.startswith(_TAG):
            continue
        path = join(path, part)
    return path


def invalid_request(error: ValidationError, prefix: str = "") -> InvalidRequestError:
    """The first error of a ValidationError, as the client sees it."""
    first = error.errors(include_url=False)[0]
    param = param_of(first["loc"], prefix) or None
    where = param or "body"
    kind = first["type"]
    context = first.get("ctx") or {}
    if kind == "missing":
        return InvalidRequestError(
            f"Missing required parameter: '{where}'.", param=param, code="missing_required_parameter"
        )
    if kind == "float_type" and isinstance(first["input"], int) and not isinstance(first["input"], bool):
        # An integer too large for a float.
        return InvalidRequestError(f"Invalid value for '{where}': out of range.", param=param)
    if kind in _EXPECTED or kind == "invalid_type":
        expected = _EXPECTED.get(kind) or first["msg"].removeprefix("expected ")
        return InvalidRequestError(
            f"Invalid type for '{where}': expected {expected}, got {type_name(first['input'])}.",
            param=param,
            code="invalid_type",
        )
    if kind == "literal_error":
        return InvalidRequestError(
            f"Invalid value for '{where}': expected one of {context.get('expected', '')}.", param=param
        )
    if kind in ("greater_than_equal", "greater_than"):
        bound = context.get("ge", context.get("gt"))
        return InvalidRequestError(f"Invalid value for '{where}': must be at least {bound}.", param=param)
    if kind in ("less_than_equal", "less_than"):
        bound = context.get("le", context.get("lt"))
        return InvalidRequestError(f"Invalid value for '{where}': must be at most {bound}.", param=param)
    if kind in ("invalid_value", "unsupported_value"):
        # Our own refusals (`refuse`): the message is written for the client.
        return InvalidRequestError(first["msg"].replace("{param}", where), param=param, code=kind)
    # Anything else pydantic may say (e.g. a float out of range): never its text or the value.
    return InvalidRequestError(f"Invalid value for '{where}'.", param=param)


def parse_as(adapter: TypeAdapter[M], value: object, prefix: str) -> M:
    try:
        return adapter.validate_python(value)
    except ValidationError as error:
        raise invalid_request(error, prefix) from None


_BODY = TypeAdapter(CreateResponseBody)
_INPUT: TypeAdapter[str | list[Any]] = TypeAdapter(InputParam)
_ITEM: TypeAdapter[Any] = TypeAdapter(InputItemParam)


def parse_body(body: object) -> CreateResponseBody:
    """Validate a whole request body."""
    return parse_as(_BODY, body, "")


def parse_input(value: object, path: str = "input") -> str | list[Any]:
    """Validate an `input` value (or a conversation's `items`): a string or input items."""
    return parse_as(_INPUT, value, path)


def parse_item(value: object, path: str) -> Any:
    """Validate one input item (a replayed or referenced one); errors are under `path`."""
    return parse_as(_ITEM, value, path)

"""Input items and content parts as request models (docs/responses-api.md, Input items)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import (
    Field,
    PrivateAttr,
    Tag,
    TypeAdapter,
    WithJsonSchema,
    field_validator,
)

from ._clip_models import (
    AudioURLPartParam,
    ChatVideoURLPartParam,
    InputAudioPartParam,
    InputVideoPartParam,
    VideoPartParam,
)
from ._compaction import CompactionState, open_compaction
from ._computer import ComputerCallOutputParam, ComputerCallParam
from ._validation import (
    OTHER,
    UNDOCUMENTED,
    RequestModel,
    UnknownTypeParam,
    by_json_type,
    by_type,
    parse_as,
    refuse,
)

# ---- content parts -----------------------------------------------------------------------------

ImageDetailParam = Literal["auto", "low", "high", "original"]
# A 2x2 PNG: lets generated requests (schemathesis) carry an image that decodes.
EXAMPLE_IMAGE_URL = (
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR42mM8oaHBwMDAxMDAwMDAAAAN6gEcJklYAwAAAABJRU5ErkJggg=="
)
TEXT_PART_TYPES = ("input_text", "text", "output_text")
IMAGE_PART_TYPES = ("input_image", "image_url")

# Parts with a known meaning that we cannot serve yet: refused by name wherever they appear.
UNSUPPORTED_PARTS = {
    "file": "file parts are not supported in the Responses API; send an input_file part",
}


class TextPartParam(RequestModel):
    type: Literal["input_text", "text", "output_text"]
    text: str


class RefusalPartParam(RequestModel):
    type: Literal["refusal"]
    refusal: str


class InputImagePartParam(RequestModel):
    type: Literal["input_image"]
    # A base64 data: URL (http(s) only where the server fetches remote images), or the id of an
    # uploaded image file (POST /v1/files).
    image_url: str | None = Field(default=None, examples=[EXAMPLE_IMAGE_URL])
    file_id: str | None = None
    detail: ImageDetailParam | None = None


class InputFilePartParam(RequestModel):
    """A file: an uploaded one by `file_id`, or inline as a base64 data: URL in `file_data`.

    PDFs reach the model as page images with each page's text, text files as text, images as
    images (docs/responses-api.md, Files); `file_url` is refused.
    """

    type: Literal["input_file"]
    file_id: str | None = None
    file_data: str | None = None
    file_url: str | None = None
    filename: str | None = None
    detail: Literal["auto", "low", "high"] | None = None


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


class UnknownPartParam(UnknownTypeParam):
    """Any other message part: its `type` says what is wrong."""

    unknown = "unsupported content part type"
    supported = (
        "input_text",
        "input_image",
        "input_file",
        "input_video",
        "input_audio",
        "audio_url",
        "text",
        "image_url",
        "video_url",
        "video",
        "output_text",
        "refusal",
    )


_PARTTAGS = {
    **dict.fromkeys(TEXT_PART_TYPES, "#text"),
    "input_image": "#input_image",
    "image_url": "#image_url",
    "input_file": "#input_file",
    "input_video": "#input_video",
    "video_url": "#video_url",
    "video": "#video",
    "input_audio": "#input_audio",
    "audio_url": "#audio_url",
    **dict.fromkeys(UNSUPPORTED_PARTS, "#unsupported"),
}
MessagePartParam: TypeAlias = Annotated[
    Annotated[TextPartParam, Tag("#text")]
    | Annotated[InputImagePartParam, Tag("#input_image")]
    | Annotated[ChatImagePartParam, Tag("#image_url")]
    | Annotated[InputFilePartParam, Tag("#input_file")]
    | Annotated[InputVideoPartParam, Tag("#input_video")]
    | Annotated[ChatVideoURLPartParam, Tag("#video_url")]
    | Annotated[VideoPartParam, Tag("#video")]
    | Annotated[InputAudioPartParam, Tag("#input_audio")]
    | Annotated[AudioURLPartParam, Tag("#audio_url")]
    | Annotated[UnsupportedPartParam, Tag("#unsupported"), UNDOCUMENTED]
    | Annotated[RefusalPartParam, Tag("#refusal")]
    | Annotated[UnknownPartParam, Tag(OTHER), UNDOCUMENTED],
    by_type({**_PARTTAGS, "refusal": "#refusal"}),
]
# In a tool output, a part of any other kind is kept as the caller's JSON (its text reaches the
# model as one JSON line; docs/responses-api.md).
ToolOutputPartParam: TypeAlias = Annotated[
    Annotated[TextPartParam, Tag("#text")]
    | Annotated[InputImagePartParam, Tag("#input_image")]
    | Annotated[ChatImagePartParam, Tag("#image_url")]
    | Annotated[InputFilePartParam, Tag("#input_file")]
    | Annotated[InputVideoPartParam, Tag("#input_video")]
    | Annotated[ChatVideoURLPartParam, Tag("#video_url")]
    | Annotated[VideoPartParam, Tag("#video")]
    | Annotated[InputAudioPartParam, Tag("#input_audio")]
    | Annotated[AudioURLPartParam, Tag("#audio_url")]
    | Annotated[UnsupportedPartParam, Tag("#unsupported"), UNDOCUMENTED]
    | Annotated[dict[str, Any], Tag(OTHER)],
    by_type(_PARTTAGS),
]


# ---- input items -------------------------------------------------------------------------------

MessageRole = Literal["user", "assistant", "system", "developer"]
INPUT_ITEM_TYPES = (
    "message",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "computer_call",
    "computer_call_output",
    "reasoning",
    "item_reference",
    "compaction",
    "compaction_trigger",
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


class ReasoningTextParam(RequestModel):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningParam(RequestModel):
    """Earlier thinking: its `content` text (OpenAI's and our output items), else its `summary`
    text, replayed on the assistant turn that follows it (`Message.reasoning_text`); the chat
    template renders it where it renders thinking. `encrypted_content` cannot be read here."""

    type: Literal["reasoning"]
    summary: list[ReasoningTextParam] = Field(default_factory=list)
    content: list[ReasoningTextParam] | None = None
    encrypted_content: str | None = None

    @property
    def text(self) -> str:
        parts = self.content or self.summary
        return "\n\n".join(part.text for part in parts if part.text)


class CompactionParam(RequestModel):
    """A compacted conversation (`POST /v1/responses/compact`, a `compaction_trigger`'s answer):
    it reaches the model as an assistant turn with the summary, and the screenshots it kept.
    Only this server's items, sealed for the request's owner, can be opened (`_compaction.py`)."""

    type: Literal["compaction"]
    encrypted_content: str
    id: str | None = None
    created_by: str | None = None
    _state: CompactionState | None = PrivateAttr(default=None)

    @field_validator("encrypted_content")
    @classmethod
    def _readable(cls, value: str) -> str:
        if open_compaction(value) is None:
            raise refuse(
                "invalid_value",
                "Invalid value for '{param}': not a compaction item this server made for this API key "
                "(POST /v1/responses/compact and compaction_trigger make them; they cannot be edited).",
            )
        return value

    def model_post_init(self, context: Any, /) -> None:
        # Opened once, where the request is parsed (the facade's opener is set there).
        self._state = open_compaction(self.encrypted_content)

    @property
    def state(self) -> CompactionState:
        return self._state or CompactionState("")

    @property
    def summary(self) -> str:
        return self.state.summary


class CompactionTriggerParam(RequestModel):
    """Compact the conversation before it: only as the last input item (the facade answers it
    with a `compaction` item; anywhere else the translation refuses it)."""

    type: Literal["compaction_trigger"]
    id: str | None = None


class ItemReferenceParam(RequestModel):
    # Optional: a bare {"id": ...} refers to a stored item.
    type: Literal["item_reference"] | None = "item_reference"
    id: str


class UnknownItemParam(UnknownTypeParam):
    unknown = "unsupported input item type"
    supported = INPUT_ITEM_TYPES


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
    | Annotated[ComputerCallParam, Tag("#computer_call")]
    | Annotated[ComputerCallOutputParam, Tag("#computer_call_output")]
    | Annotated[ReasoningParam, Tag("#reasoning")]
    | Annotated[ItemReferenceParam, Tag("#item_reference")]
    | Annotated[CompactionParam, Tag("#compaction")]
    | Annotated[CompactionTriggerParam, Tag("#compaction_trigger")]
    | Annotated[UnknownItemParam, Tag(OTHER), UNDOCUMENTED],
    by_type({kind: f"#{kind}" for kind in INPUT_ITEM_TYPES}, implicit=_implicit_item_type),
]
# Documented as non-empty; an empty input is refused by the translation, which says why.
InputParam: TypeAlias = Annotated[
    Annotated[str, Tag("#string"), WithJsonSchema({"type": "string", "minLength": 1, "pattern": "\\S"})]
    | Annotated[list[InputItemParam], Tag("#array"), Field(json_schema_extra={"minItems": 1})],
    by_json_type("a string or an array of input items"),
]


_INPUT: TypeAdapter[str | list[Any]] = TypeAdapter(InputParam)
_ITEM: TypeAdapter[Any] = TypeAdapter(InputItemParam)


def parse_input(value: object, path: str = "input") -> str | list[Any]:
    """Validate an `input` value (or a conversation's `items`): a string or input items."""
    return parse_as(_INPUT, value, path)


def parse_item(value: object, path: str) -> Any:
    """Validate one input item (a replayed or referenced one); errors are under `path`."""
    return parse_as(_ITEM, value, path)

"""The `POST /v1/messages` body as pydantic models (liberal in, strict types, exact paths).

Only the shapes are checked here; what a block means is decided by one translation to a
Responses body (`_to_responses.py`), so images, documents, tools, tool_choice and their limits
behave exactly as on `/v1/responses`. Unknown fields are kept (and ignored) only where they
cannot change what the model sees (`cache_control`, `citations`, a tool's `input_examples`);
unknown block, source and tool types go to an `Other...` model the translation refuses by name.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeAlias

from pydantic import Field, Tag, TypeAdapter

from vlmserve.responses import MAX_COUNT, OTHER, Count, RequestModel, by_json_type, by_type, parse_as

from ._computer import COMPUTER_TOOL_TYPES, ComputerToolParam

# ---- sources ------------------------------------------------------------------------------------


class Base64SourceParam(RequestModel):
    type: Literal["base64"]
    media_type: str
    data: str


class URLSourceParam(RequestModel):
    type: Literal["url"]
    url: str


class FileSourceParam(RequestModel):
    """A file uploaded to this server's files API (`POST /v1/files`), by id."""

    type: Literal["file"]
    file_id: str


class PlainTextSourceParam(RequestModel):
    type: Literal["text"]
    media_type: str = "text/plain"
    data: str


class OtherSourceParam(RequestModel):
    type: str


_SOURCE_TAGS = {"base64": "#base64", "url": "#url", "file": "#file"}

ImageSource: TypeAlias = Annotated[
    Annotated[Base64SourceParam, Tag("#base64")]
    | Annotated[URLSourceParam, Tag("#url")]
    | Annotated[FileSourceParam, Tag("#file")]
    | Annotated[OtherSourceParam, Tag(OTHER)],
    by_type(_SOURCE_TAGS),
]

# ---- content blocks -----------------------------------------------------------------------------


class TextBlockParam(RequestModel):
    type: Literal["text"]
    text: str


class ImageBlockParam(RequestModel):
    type: Literal["image"]
    source: ImageSource


class OtherBlockParam(RequestModel):
    """Any other block type (server_tool_use, search_result, ...): refused by name."""

    type: str


SourceBlock: TypeAlias = Annotated[
    Annotated[TextBlockParam, Tag("#text")]
    | Annotated[ImageBlockParam, Tag("#image")]
    | Annotated[OtherBlockParam, Tag(OTHER)],
    by_type({"text": "#text", "image": "#image"}),
]


class ContentSourceParam(RequestModel):
    """A document given as content blocks (text and images)."""

    type: Literal["content"]
    content: Annotated[
        Annotated[str, Tag("#string")] | Annotated[list[SourceBlock], Tag("#array")],
        by_json_type("a string or an array of text and image blocks"),
    ]


DocumentSource: TypeAlias = Annotated[
    Annotated[Base64SourceParam, Tag("#base64")]
    | Annotated[URLSourceParam, Tag("#url")]
    | Annotated[FileSourceParam, Tag("#file")]
    | Annotated[PlainTextSourceParam, Tag("#text")]
    | Annotated[ContentSourceParam, Tag("#content")]
    | Annotated[OtherSourceParam, Tag(OTHER)],
    by_type({**_SOURCE_TAGS, "text": "#text", "content": "#content"}),
]


class DocumentBlockParam(RequestModel):
    type: Literal["document"]
    source: DocumentSource
    # Shown to the model with the document (as Anthropic does).
    title: str | None = None
    context: str | None = None


class ToolUseBlockParam(RequestModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


ToolResultBlock: TypeAlias = Annotated[
    Annotated[TextBlockParam, Tag("#text")]
    | Annotated[ImageBlockParam, Tag("#image")]
    | Annotated[DocumentBlockParam, Tag("#document")]
    | Annotated[OtherBlockParam, Tag(OTHER)],
    by_type({"text": "#text", "image": "#image", "document": "#document"}),
]


class ToolResultBlockParam(RequestModel):
    type: Literal["tool_result"]
    tool_use_id: str
    content: (
        Annotated[
            Annotated[str, Tag("#string")] | Annotated[list[ToolResultBlock], Tag("#array")],
            by_json_type("a string or an array of content blocks"),
        ]
        | None
    ) = None
    is_error: bool | None = None


class ThinkingBlockParam(RequestModel):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlockParam(RequestModel):
    type: Literal["redacted_thinking"]
    data: str


_BLOCK_TAGS = {
    name: f"#{name}"
    for name in ("text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking")
}

ContentBlock: TypeAlias = Annotated[
    Annotated[TextBlockParam, Tag("#text")]
    | Annotated[ImageBlockParam, Tag("#image")]
    | Annotated[DocumentBlockParam, Tag("#document")]
    | Annotated[ToolUseBlockParam, Tag("#tool_use")]
    | Annotated[ToolResultBlockParam, Tag("#tool_result")]
    | Annotated[ThinkingBlockParam, Tag("#thinking")]
    | Annotated[RedactedThinkingBlockParam, Tag("#redacted_thinking")]
    | Annotated[OtherBlockParam, Tag(OTHER)],
    by_type(_BLOCK_TAGS),
]

Content: TypeAlias = Annotated[
    Annotated[str, Tag("#string")] | Annotated[list[ContentBlock], Tag("#array")],
    by_json_type("a string or an array of content blocks"),
]


class MessageParam(RequestModel):
    # `system`: instructions in the middle of a conversation (Claude Code sends them).
    role: Literal["user", "assistant", "system"]
    content: Content


SystemParam: TypeAlias = Annotated[
    Annotated[str, Tag("#string")] | Annotated[list[TextBlockParam], Tag("#array")],
    by_json_type("a string or an array of text blocks"),
]

# ---- tools --------------------------------------------------------------------------------------


class CustomToolParam(RequestModel):
    # Absent or "custom"; any other type is a server tool (`OtherToolParam`).
    type: Literal["custom"] | None = None
    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None


class OtherToolParam(RequestModel):
    """A server tool (web_search_20250305, bash_20250124, ...): refused by name."""

    type: str
    name: str | None = None


ToolParam: TypeAlias = Annotated[
    Annotated[CustomToolParam, Tag("#custom")]
    | Annotated[ComputerToolParam, Tag("#computer")]
    | Annotated[OtherToolParam, Tag(OTHER)],
    by_type(
        {"custom": "#custom", **dict.fromkeys(COMPUTER_TOOL_TYPES, "#computer")},
        implicit=lambda value: "custom",
    ),
]


class ToolChoiceAutoParam(RequestModel):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAnyParam(RequestModel):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceToolParam(RequestModel):
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNoneParam(RequestModel):
    type: Literal["none"]


class OtherToolChoiceParam(RequestModel):
    type: Literal["auto", "any", "tool", "none"]


ToolChoiceParam: TypeAlias = Annotated[
    Annotated[ToolChoiceAutoParam, Tag("#auto")]
    | Annotated[ToolChoiceAnyParam, Tag("#any")]
    | Annotated[ToolChoiceToolParam, Tag("#tool")]
    | Annotated[ToolChoiceNoneParam, Tag("#none")]
    | Annotated[OtherToolChoiceParam, Tag(OTHER)],
    by_type({name: f"#{name}" for name in ("auto", "any", "tool", "none")}),
]

# ---- the rest -----------------------------------------------------------------------------------


# The contract's `top_k` is an int32: a larger value could not be sent (it was a 500 once the
# response had been admitted).
MAX_TOP_K = 2**31 - 1


class ThinkingEnabledParam(RequestModel):
    type: Literal["enabled"]
    budget_tokens: Annotated[int, Field(ge=1024, le=MAX_COUNT)]


class ThinkingDisabledParam(RequestModel):
    type: Literal["disabled"]


class ThinkingAdaptiveParam(RequestModel):
    """`adaptive` and `between_tools`: the model thinks when it decides to (switch on)."""

    type: Literal["adaptive", "between_tools"]


class OtherThinkingParam(RequestModel):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]


_THINKING_TAGS = {
    "enabled": "#enabled",
    "disabled": "#disabled",
    "adaptive": "#adaptive",
    "between_tools": "#adaptive",
}

ThinkingParam: TypeAlias = Annotated[
    Annotated[ThinkingEnabledParam, Tag("#enabled")]
    | Annotated[ThinkingDisabledParam, Tag("#disabled")]
    | Annotated[ThinkingAdaptiveParam, Tag("#adaptive")]
    | Annotated[OtherThinkingParam, Tag(OTHER)],
    by_type(_THINKING_TAGS),
]


class MetadataParam(RequestModel):
    user_id: str | None = None


class JsonOutputFormatParam(RequestModel):
    """Structured outputs (`output_format`, or `output_config.format`): a JSON schema."""

    type: Literal["json_schema"]
    # `schema` would shadow BaseModel.schema; the JSON key is still "schema".
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfigParam(RequestModel):
    format: JsonOutputFormatParam | None = None
    # How hard Claude should try: accepted, no effect here (documented).
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None


class MessagesBody(RequestModel):
    """`POST /v1/messages`: Anthropic's `MessageCreateParams`."""

    model: str = Field(description='The loaded model\'s id, or "default" (any name is accepted as it).')
    messages: list[MessageParam]
    max_tokens: Count
    system: SystemParam | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None
    stop_sequences: list[str] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0, le=MAX_TOP_K)] | None = None
    thinking: ThinkingParam | None = None
    metadata: MetadataParam | None = None
    stream: bool | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    output_format: JsonOutputFormatParam | None = None
    output_config: OutputConfigParam | None = None
    # Refused when set (the translation says why): nothing here can run them.
    mcp_servers: list[Any] | None = None
    container: Any = None


class CountTokensBody(MessagesBody):
    """`POST /v1/messages/count_tokens`: the same body without `max_tokens` (or `stream`)."""

    max_tokens: Count | None = None  # type: ignore[assignment]


_BODY = TypeAdapter(MessagesBody)
_COUNT_BODY = TypeAdapter(CountTokensBody)


def parse_messages_body(body: object, *, count_tokens: bool = False) -> MessagesBody:
    """Validate a whole Messages body (InvalidRequestError naming the field)."""
    if count_tokens:
        return parse_as(_COUNT_BODY, body, "")
    return parse_as(_BODY, body, "")

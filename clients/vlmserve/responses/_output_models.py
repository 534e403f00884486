"""What the server sends back, as exact pydantic models: output items, usage and the response.

Outbound is exact (`extra="forbid"`, literal types, assignments validated): a field we never
meant to send cannot slip in. Every model here is held against the Open Responses schema
(tests/responses/test_output_models.py), which is what clients are written against; the
openai package's own types are lenient (every field optional, unknown fields kept), so they
cannot make output exact, and the client library does not depend on that package. Optional
keys that are absent rather than null (e.g. `namespace`) are declared with `optional()`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


def _is_none(value: object) -> bool:
    return value is None


def optional() -> Any:
    """A key left out of the JSON when it is None (not sent as null)."""
    return Field(default=None, exclude_if=_is_none)


class OutboundModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def to_json(self) -> dict[str, Any]:
        """The JSON object as sent (plain dicts, lists and scalars)."""
        return self.model_dump(mode="json")

    def to_json_text(self) -> str:
        """The same JSON as one line of ASCII text (every non-ASCII character escaped, U+2028
        too), serialized by pydantic-core in one pass: several times cheaper than `to_json()`
        then `json.dumps`, which matters per streamed event (top_logprobs: 20 alternatives each)."""
        return self.model_dump_json(ensure_ascii=True)


ItemStatus = Literal["in_progress", "completed", "incomplete"]
ImageDetailName = Literal["auto", "low", "high", "original"]
ResponseStatus = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]


# ---- content parts -----------------------------------------------------------------------------


class TopLogProb(OutboundModel):
    token: str
    logprob: float
    # The token's UTF-8 bytes.
    bytes: list[int]


class LogProb(OutboundModel):
    """One token of the text and its log probability (include `message.output_text.logprobs`)."""

    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogProb] = Field(default_factory=list)


class OutputTextContent(OutboundModel):
    type: Literal["output_text"] = "output_text"
    text: str
    # Citations: this server produces none.
    annotations: list[dict[str, Any]] = Field(default_factory=list)
    # Filled when asked for (the tokens spell `text`: docs/responses-api.md, "Log probabilities").
    logprobs: list[LogProb] = Field(default_factory=list)


class ReasoningTextContent(OutboundModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class InputImageContent(OutboundModel):
    type: Literal["input_image"] = "input_image"
    image_url: str
    detail: ImageDetailName = "auto"


# ---- output items ------------------------------------------------------------------------------


class OutputMessage(OutboundModel):
    type: Literal["message"] = "message"
    id: str
    status: ItemStatus
    role: Literal["assistant"] = "assistant"
    content: list[OutputTextContent]


class FunctionCallItem(OutboundModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus = "completed"
    namespace: str | None = optional()


class CustomToolCallItem(OutboundModel):
    type: Literal["custom_tool_call"] = "custom_tool_call"
    id: str
    call_id: str
    name: str
    input: str
    # Only while streaming (`response.output_item.added`); the finished item has none.
    status: ItemStatus | None = optional()
    namespace: str | None = optional()


class ReasoningItem(OutboundModel):
    """What a thinking model wrote between `<think>` and `</think>` (never in `output_text`)."""

    type: Literal["reasoning"] = "reasoning"
    id: str
    # This server writes no summaries: the reasoning is the content.
    summary: list[dict[str, Any]] = Field(default_factory=list)
    content: list[ReasoningTextContent] = Field(default_factory=list)


class ComputerCallItem(OutboundModel):
    """A computer action the model asks for (docs/computer-use.md); `actions` for the `computer`
    tool (its batched form, `action` being the first), `action` alone for `computer_use_preview`."""

    type: Literal["computer_call"] = "computer_call"
    id: str
    call_id: str
    action: dict[str, Any] | None = optional()
    actions: list[dict[str, Any]] | None = optional()
    pending_safety_checks: list[dict[str, Any]] = Field(default_factory=list)
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


ToolCallItem = FunctionCallItem | CustomToolCallItem | ComputerCallItem
OutputItem = Annotated[
    OutputMessage | FunctionCallItem | CustomToolCallItem | ComputerCallItem | ReasoningItem,
    Field(discriminator="type"),
]


# ---- usage and the response --------------------------------------------------------------------


class InputTokensDetails(OutboundModel):
    cached_tokens: int
    # OpenAI bills writes to its prompt cache; the engine's prefix cache keeps prompts without
    # a cost of their own, so none is written in that sense. The openai SDK (3.57) types it as
    # a required int.
    cache_write_tokens: int = 0


class OutputTokensDetails(OutboundModel):
    reasoning_tokens: int = 0


class Usage(OutboundModel):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)


IncompleteReason = Literal["max_output_tokens", "cancelled"]


class IncompleteDetails(OutboundModel):
    reason: IncompleteReason


class ResponseError(OutboundModel):
    code: str
    message: str


class FunctionToolEcho(OutboundModel):
    """An offered tool as the response echoes it (custom and namespaced tools as offered)."""

    type: Literal["function"] = "function"
    name: str
    description: str | None
    parameters: dict[str, Any] | None
    strict: bool | None


class ComputerToolEcho(OutboundModel):
    """The computer tool as declared (`computer`, or `computer_use_preview` with its display)."""

    type: Literal["computer", "computer_use_preview"]
    display_width: int | None = optional()
    display_height: int | None = optional()
    environment: str | None = optional()


class FunctionChoice(OutboundModel):
    type: Literal["function"] = "function"
    name: str


class AllowedToolsChoice(OutboundModel):
    type: Literal["allowed_tools"] = "allowed_tools"
    mode: Literal["auto", "required"]
    tools: list[FunctionChoice]


class ComputerChoice(OutboundModel):
    type: Literal["computer", "computer_use_preview"]


ToolChoiceEcho = Literal["none", "auto", "required"] | FunctionChoice | AllowedToolsChoice | ComputerChoice


class TextFormatEcho(OutboundModel):
    type: Literal["text"] = "text"


class JsonObjectFormatEcho(OutboundModel):
    type: Literal["json_object"] = "json_object"


class JsonSchemaFormatEcho(OutboundModel):
    """Echoed as OpenAI does, schema included (the Open Responses schema types `schema` as null)."""

    # `schema` would shadow BaseModel.schema: the field is `schema_`, sent as "schema".
    model_config = ConfigDict(extra="forbid", validate_assignment=True, serialize_by_alias=True)

    type: Literal["json_schema"] = "json_schema"
    name: str
    description: str | None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool


class TextEcho(OutboundModel):
    format: TextFormatEcho | JsonObjectFormatEcho | JsonSchemaFormatEcho = Field(
        default_factory=TextFormatEcho, discriminator="type"
    )
    verbosity: Literal["low", "medium", "high"] | None = optional()


class ReasoningEcho(OutboundModel):
    effort: Literal["none", "low", "medium", "high", "xhigh"] | None
    summary: Literal["auto", "concise", "detailed"] | None


class ConversationRef(OutboundModel):
    id: str


class RequestEcho(OutboundModel):
    """The request fields a response echoes, with schema-valid defaults."""

    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[FunctionToolEcho | ComputerToolEcho] = Field(default_factory=list)
    tool_choice: ToolChoiceEcho = "auto"
    truncation: Literal["auto", "disabled"] = "disabled"
    parallel_tool_calls: bool = True
    text: TextEcho = Field(default_factory=TextEcho)
    temperature: float = 1.0
    top_p: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    top_logprobs: int = 0
    reasoning: ReasoningEcho | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    store: bool = True
    background: bool = False
    service_tier: str = "default"
    metadata: dict[str, str] = Field(default_factory=dict)
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None


class ConversationResource(OutboundModel):
    """A conversation (`/v1/conversations`): its items are listed separately."""

    id: str
    object: Literal["conversation"] = "conversation"
    created_at: int
    metadata: dict[str, str]
    # An extension: the model its responses continue with when they name none (that of its
    # latest response, else the one it was created with); absent until it has one.
    model: str | None = optional()


class DeletedObject(OutboundModel):
    id: str
    object: Literal["response", "conversation.deleted"]
    deleted: bool


class InputTokensCount(OutboundModel):
    object: Literal["response.input_tokens"] = "response.input_tokens"
    input_tokens: int


class ItemList(OutboundModel):
    """A page of stored items: each as the client sent it (or as the server made it), with its id."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool


class ResponseResource(RequestEcho):
    """A response object: what POST /v1/responses returns, GET retrieves and events carry."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None
    status: ResponseStatus = "in_progress"
    incomplete_details: IncompleteDetails | None = None
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    error: ResponseError | None = None
    usage: Usage | None = None
    conversation: ConversationRef | None = optional()
    user: str | None = optional()
    # An extension: how many earlier messages `truncation: "auto"` left out to fit the context
    # (absent when none were).
    truncated_items: int | None = optional()

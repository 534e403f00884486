"""OpenAI Responses API JSON <-> the engine contract.

Pure functions, shared by the facade and by client-library callers (see docs/responses-api.md):

* `build_generate_request(body)` validates a whole `POST /v1/responses` body and returns a
  `TranslatedRequest` whose `request` (a GenerateRequest) holds the conversation as the client
  gave it (images where the client put them). The engine applies the image follow-up lowering
  where it renders the chat template (`vlmserve.engine.prep.lowering`); nothing here lowers.
* `input_to_messages(input)` gives the contract messages for `input`.
* `messages_to_items` gives contract messages back as input items (JSON);
  `result_to_output_items` and `usage_from_contract` give the exact output models
  (`ResponseResource`, `OutputMessage`, ..., and the stream events in `ResponseStreamEvent`).

Files (`input_file`, `input_image.file_id`): `file_data` is read here; a `file_id` goes to the
`file_source` the caller passes (`FileSource`: id -> `FileContent`, the facade's files store).

Every client error is an `InvalidRequestError` carrying the JSON path of the bad field.
"""

from ._clip_models import (
    AudioURLPartParam,
    ChatVideoURLPartParam,
    InputAudioPartParam,
    InputVideoPartParam,
    VideoPartParam,
)
from ._compaction import (
    SUMMARY_INSTRUCTION,
    CompactionState,
    KeptImage,
    clean_summary,
    compacted_output,
    compaction_item,
    kept_items,
    opening_compactions,
)
from ._compaction_trigger import summarising_body, summary_body
from ._create_request import CreateRequest, EngineExtras, parse_create_request
from ._errors import InvalidRequestError
from ._events import (
    ContentPartEvent,
    CustomToolCallInputDeltaEvent,
    CustomToolCallInputDoneEvent,
    ErrorEvent,
    ErrorPayload,
    FunctionCallArgumentsDeltaEvent,
    FunctionCallArgumentsDoneEvent,
    LifecycleEventType,
    OutputItemEvent,
    OutputTextDeltaEvent,
    OutputTextDoneEvent,
    ReasoningTextDeltaEvent,
    ReasoningTextDoneEvent,
    ResponseLifecycleEvent,
    ResponseStreamEvent,
)
from ._input_models import InputItemParam
from ._items import ItemResolver, input_to_messages, is_item_reference
from ._media import FileContent, FileSource, ImageFetchError, ImageSource, PdfRenderer
from ._outbound import (
    logprobs_from_contract,
    message_output_item,
    messages_to_items,
    output_text_part,
    reasoning_output_item,
    result_to_output_items,
    tool_call_output_item,
    usage_from_contract,
)
from ._output_models import (
    ComputerCallItem,
    ConversationRef,
    ConversationResource,
    CustomToolCallItem,
    DeletedObject,
    FunctionCallItem,
    IncompleteDetails,
    IncompleteReason,
    InputTokensCount,
    ItemList,
    ItemStatus,
    LogProb,
    OutboundModel,
    OutputItem,
    OutputMessage,
    OutputTextContent,
    ReasoningItem,
    ReasoningTextContent,
    RequestEcho,
    ResponseError,
    ResponseResource,
    ResponseStatus,
    ToolCallItem,
    Usage,
)
from ._parts import IMAGE_PART_TYPES
from ._paths import PathMap, translated_body
from ._request import TranslatedRequest, build_generate_request, parse_metadata
from ._request_models import MAX_COUNT, Count, CreateResponseBody, IncludeValue, ServiceTier, parse_body
from ._tools import OfferedTool
from ._validation import OTHER, RequestModel, by_json_type, by_type, parse_as

__all__ = [
    "IMAGE_PART_TYPES",
    "MAX_COUNT",
    "OTHER",
    "SUMMARY_INSTRUCTION",
    "AudioURLPartParam",
    "ChatVideoURLPartParam",
    "CompactionState",
    "ComputerCallItem",
    "ContentPartEvent",
    "ConversationRef",
    "ConversationResource",
    "Count",
    "CreateRequest",
    "CreateResponseBody",
    "CustomToolCallInputDeltaEvent",
    "CustomToolCallInputDoneEvent",
    "CustomToolCallItem",
    "DeletedObject",
    "EngineExtras",
    "ErrorEvent",
    "ErrorPayload",
    "FileContent",
    "FileSource",
    "FunctionCallArgumentsDeltaEvent",
    "FunctionCallArgumentsDoneEvent",
    "FunctionCallItem",
    "ImageFetchError",
    "ImageSource",
    "IncludeValue",
    "IncompleteDetails",
    "IncompleteReason",
    "InputAudioPartParam",
    "InputItemParam",
    "InputTokensCount",
    "InputVideoPartParam",
    "InvalidRequestError",
    "ItemList",
    "ItemResolver",
    "ItemStatus",
    "KeptImage",
    "LifecycleEventType",
    "LogProb",
    "OfferedTool",
    "OutboundModel",
    "OutputItem",
    "OutputItemEvent",
    "OutputMessage",
    "OutputTextContent",
    "OutputTextDeltaEvent",
    "OutputTextDoneEvent",
    "PathMap",
    "PdfRenderer",
    "ReasoningItem",
    "ReasoningTextContent",
    "ReasoningTextDeltaEvent",
    "ReasoningTextDoneEvent",
    "RequestEcho",
    "RequestModel",
    "ResponseError",
    "ResponseLifecycleEvent",
    "ResponseResource",
    "ResponseStatus",
    "ResponseStreamEvent",
    "ServiceTier",
    "ToolCallItem",
    "TranslatedRequest",
    "Usage",
    "VideoPartParam",
    "build_generate_request",
    "by_json_type",
    "by_type",
    "clean_summary",
    "compacted_output",
    "compaction_item",
    "input_to_messages",
    "is_item_reference",
    "kept_items",
    "logprobs_from_contract",
    "message_output_item",
    "messages_to_items",
    "opening_compactions",
    "output_text_part",
    "parse_as",
    "parse_body",
    "parse_create_request",
    "parse_metadata",
    "reasoning_output_item",
    "result_to_output_items",
    "summarising_body",
    "summary_body",
    "tool_call_output_item",
    "translated_body",
    "usage_from_contract",
]

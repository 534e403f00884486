"""OpenAI Responses API JSON <-> the engine contract, and the image follow-up lowering.

Pure functions, shared by the facade and by client-library callers (see docs/responses-api.md):

* `build_generate_request(body)` validates a whole `POST /v1/responses` body and returns a
  `TranslatedRequest` whose `request` (a GenerateRequest) holds the lowered conversation.
* `input_to_messages(input)` gives the raw (not lowered) contract messages for `input`.
* `lower_messages(messages)` applies the image follow-up lowering to contract messages.
* `messages_to_items`, `result_to_output_items`, `usage_to_json` go back out to JSON.

Every client error is an `InvalidRequestError` carrying the JSON path of the bad field.
"""

from ._errors import InvalidRequestError
from ._items import ItemResolver, input_to_messages, is_item_reference
from ._lowering import IMAGE_FOLLOW_UP_MARKER, lower_messages, tool_output_text
from ._media import ImageFetchError, ImageSource
from ._outbound import (
    NewId,
    image_part_to_json,
    message_output_item,
    messages_to_items,
    output_text_part,
    result_to_output_items,
    tool_call_output_item,
    usage_to_json,
)
from ._parts import IMAGE_PART_TYPES
from ._request import TranslatedRequest, build_generate_request, parse_metadata
from ._tools import OfferedTool

__all__ = [
    "IMAGE_FOLLOW_UP_MARKER",
    "IMAGE_PART_TYPES",
    "ImageFetchError",
    "ImageSource",
    "InvalidRequestError",
    "ItemResolver",
    "NewId",
    "OfferedTool",
    "TranslatedRequest",
    "build_generate_request",
    "image_part_to_json",
    "input_to_messages",
    "is_item_reference",
    "lower_messages",
    "message_output_item",
    "messages_to_items",
    "output_text_part",
    "parse_metadata",
    "result_to_output_items",
    "tool_call_output_item",
    "tool_output_text",
    "usage_to_json",
]

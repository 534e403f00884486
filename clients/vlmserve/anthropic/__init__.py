"""Anthropic Messages (`POST /v1/messages`, `/v1/messages/count_tokens`) on top of the Responses
translation.

A Messages request becomes the Responses body that means the same (`messages_request`), so one
translation, one lowering and one set of limits serve every API; the finished response or its
stream events come back as a `Message` or Anthropic's stream events (`anthropic_message`,
`EventWriter`); errors in Anthropic's shape (`error_body`).
"""

from ._context_edits import (
    ClearToolUses,
    EditedBody,
    apply_edits,
    compact_edit,
    compacted_body,
    compaction_block,
    needs_count,
    parse_edits,
)
from ._errors import OVERLOADED_STATUS, anthropic_error_type, anthropic_status, error_body
from ._message import (
    ContentBlock,
    Message,
    MessageUsage,
    TextBlock,
    ThinkingBlock,
    TokenCount,
    ToolUseBlock,
    anthropic_message,
    message_id,
)
from ._request_models import CountTokensBody, MessagesBody, parse_messages_body
from ._stream import EventWriter, StreamEvent, error_event
from ._to_responses import TOOL_ERROR_PREFIX, MessagesRequest, messages_request

__all__ = [
    "OVERLOADED_STATUS",
    "TOOL_ERROR_PREFIX",
    "ClearToolUses",
    "ContentBlock",
    "CountTokensBody",
    "EditedBody",
    "EventWriter",
    "Message",
    "MessageUsage",
    "MessagesBody",
    "MessagesRequest",
    "StreamEvent",
    "TextBlock",
    "ThinkingBlock",
    "TokenCount",
    "ToolUseBlock",
    "anthropic_error_type",
    "anthropic_message",
    "anthropic_status",
    "apply_edits",
    "compact_edit",
    "compacted_body",
    "compaction_block",
    "error_body",
    "error_event",
    "message_id",
    "messages_request",
    "needs_count",
    "parse_edits",
    "parse_messages_body",
]

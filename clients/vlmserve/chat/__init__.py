"""OpenAI Chat Completions on top of the Responses translation (`POST /v1/chat/completions`).

A chat request becomes the Responses body that means the same (`chat_request`), so one
translation, one lowering and one set of limits serve both APIs; the finished response or its
stream events come back as a chat completion or its chunks (`chat_completion`, `ChunkWriter`).
"""

from ._completion import (
    ChatCompletion,
    ChatCompletionChunk,
    ChunkWriter,
    chat_completion,
    completion_id,
)
from ._request_models import ChatCompletionBody, parse_chat_body
from ._to_responses import ChatRequest, chat_request

__all__ = [
    "ChatCompletion",
    "ChatCompletionBody",
    "ChatCompletionChunk",
    "ChatRequest",
    "ChunkWriter",
    "chat_completion",
    "chat_request",
    "completion_id",
    "parse_chat_body",
]

"""Compaction (`POST /v1/responses/compact`, and a `compaction_trigger` input item): the pure parts.

A compacted conversation is a `compaction` item, which carries the model's summary of what came
before and the latest screenshots kept as images (`CompactionState`), followed by the recent
items kept as they were. A later request sends that list as its `input`; the `compaction` item
reaches the model as an assistant turn holding the summary, then a user turn with the kept
images.

`encrypted_content` is sealed by the facade (vlmserve/facade/responses/compaction_seal.py:
authenticated encryption, bound to the API key's owner): this package cannot read it alone.
Whoever translates a request that may hold one opens it with `opening_compactions(opener)`
around the parse; without an opener, every compaction item is refused as unreadable.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import re
import secrets
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

# What the summarising turn asks of the model (after the conversation it summarises).
SUMMARY_INSTRUCTION = (
    "Summarise the conversation above for another assistant who continues it. Do not answer "
    "or continue the task, and call no tools. Keep the goal, the user's requirements and "
    "corrections, decisions, work done, open questions, exact names and numbers, and next "
    "steps. Describe what the earlier images showed that still matters (the latest ones are "
    "kept as images). Write only the summary."
)
# How the summary opens the compacted conversation, for the model.
SUMMARY_HEADING = "Summary of the conversation so far:\n"
# What introduces the screenshots a compaction kept, for the model.
KEPT_IMAGES_HEADING = "The latest images of the conversation so far:"
# Markup a summary must not carry back to the model (a template's tool calls, thinking,
# special tokens): the summary is plain text.
_MARKUP = re.compile(
    r"<(tool_call|function_call|think|thinking)>.*?(</\1>|$)|<\|[^|>]{0,64}\|>|</?(tool_call|function_call)>",
    re.DOTALL,
)


@dataclass(frozen=True)
class KeptImage:
    data: bytes
    media_type: str


@dataclass(frozen=True)
class CompactionState:
    """What a compaction item carries: the summary and the screenshots kept as images."""

    summary: str
    images: tuple[KeptImage, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {
            "v": 1,
            "summary": self.summary,
            "images": [
                {"media_type": image.media_type, "data": base64.b64encode(image.data).decode("ascii")}
                for image in self.images
            ],
        }

    @staticmethod
    def from_json(data: Any) -> CompactionState | None:
        if not isinstance(data, dict) or data.get("v") != 1 or not isinstance(data.get("summary"), str):
            return None
        images = data.get("images", [])
        if not isinstance(images, list):
            return None
        kept: list[KeptImage] = []
        for image in images:
            if not isinstance(image, dict) or not isinstance(image.get("data"), str):
                return None
            try:
                kept.append(KeptImage(base64.b64decode(image["data"]), str(image.get("media_type", ""))))
            except (binascii.Error, ValueError):
                return None
        return CompactionState(data["summary"], tuple(kept))


CompactionOpener = Callable[[str], "CompactionState | None"]
_OPENER: ContextVar[CompactionOpener | None] = ContextVar("compaction_opener", default=None)


@contextlib.contextmanager
def opening_compactions(opener: CompactionOpener | None) -> Iterator[None]:
    """Compaction items parsed inside are opened with `opener` (the facade's seal, for the
    request's owner)."""
    token = _OPENER.set(opener)
    try:
        yield
    finally:
        _OPENER.reset(token)


def open_compaction(encrypted_content: str) -> CompactionState | None:
    """The state a compaction item carries; None when it cannot be opened here."""
    opener = _OPENER.get()
    return opener(encrypted_content) if opener is not None else None


def clean_summary(text: str) -> str:
    """The model's summary as plain text: tool-call and thinking markup and special tokens out."""
    return _MARKUP.sub("", text).strip()


def compaction_item(encrypted_content: str) -> dict[str, Any]:
    return {
        "id": f"cmp_{secrets.token_hex(24)}",
        "type": "compaction",
        "encrypted_content": encrypted_content,
    }


def _is_user_message(item: object) -> bool:
    return isinstance(item, dict) and item.get("role") == "user" and item.get("type", "message") == "message"


def kept_items(items: Sequence[Any]) -> list[Any]:
    """The recent items a compaction keeps as they are: from the last user message on."""
    for index in range(len(items) - 1, -1, -1):
        if _is_user_message(items[index]):
            return list(items[index:])
    return []


def compacted_output(encrypted_content: str, kept: Sequence[Any], new_id: Any) -> list[dict[str, Any]]:
    """The compacted item list: the summary's item, then the kept items as output items (easy
    messages get their `type`, `id`, `status` and a content part list)."""
    output = [compaction_item(encrypted_content)]
    for item in kept:
        if isinstance(item, dict) and "role" in item and item.get("type", "message") == "message":
            content = item["content"]
            if isinstance(content, str):
                kind = "output_text" if item.get("role") == "assistant" else "input_text"
                content = [{"type": kind, "text": content}]
            content = [_as_output_part(part) for part in content]
            output.append(
                {
                    "type": "message",
                    "id": item.get("id") or new_id("msg"),
                    "status": "completed",
                    "role": item["role"],
                    "content": content,
                }
            )
        else:
            output.append(dict(item))
    return output


def _as_output_part(part: Any) -> Any:
    """An `output_text` part as `/v1/responses` writes one: with `annotations` and `logprobs`
    (the SDKs' output models and OpenAI's compact endpoint have them; a client's part may not)."""
    if isinstance(part, dict) and part.get("type") == "output_text":
        return {"annotations": [], "logprobs": [], **part}
    return part

"""Compaction (`POST /v1/responses/compact`): the pure parts.

A compacted conversation is a `compaction` item, which carries the model's summary of what came
before, followed by the recent items kept as they were (the last user turn and what follows it,
images included). A later request sends that list as its `input`; the `compaction` item reaches
the model as an assistant turn holding the summary.

`encrypted_content` has OpenAI's item shape but is not secret: it is the summary text, encoded
(base64url JSON under a version prefix), so any vlmserve process reads it back without shared
keys. What a client could write in it, it could as well send as a message.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from collections.abc import Sequence
from typing import Any

CONTENT_PREFIX = "vlmserve.compaction.v1."
# What the summarising turn asks of the model (after the conversation it summarises).
SUMMARY_INSTRUCTION = (
    "Summarise the conversation above for another assistant who continues it. Do not answer "
    "or continue the task, and call no tools. Keep the goal, the user's requirements and "
    "corrections, decisions, work done, open questions, exact names and numbers, and next "
    "steps. Write only the summary."
)
# How the summary opens the compacted conversation, for the model.
SUMMARY_HEADING = "Summary of the conversation so far:\n"


def compaction_item(summary: str) -> dict[str, Any]:
    payload = json.dumps({"summary": summary}, ensure_ascii=False, separators=(",", ":"))
    encoded = base64.urlsafe_b64encode(payload.encode()).decode("ascii")
    return {
        "id": f"cmp_{secrets.token_hex(24)}",
        "type": "compaction",
        "encrypted_content": CONTENT_PREFIX + encoded,
    }


def compaction_summary(encrypted_content: str) -> str | None:
    """The summary a `compaction` item carries; None when it is not one this server wrote."""
    if not encrypted_content.startswith(CONTENT_PREFIX):
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(encrypted_content[len(CONTENT_PREFIX) :]))
    except (binascii.Error, ValueError):
        return None
    summary = payload.get("summary") if isinstance(payload, dict) else None
    return summary if isinstance(summary, str) else None


def _is_user_message(item: object) -> bool:
    return isinstance(item, dict) and item.get("role") == "user" and item.get("type", "message") == "message"


def kept_items(items: Sequence[Any]) -> list[Any]:
    """The recent items a compaction keeps as they are: from the last user message on."""
    for index in range(len(items) - 1, -1, -1):
        if _is_user_message(items[index]):
            return list(items[index:])
    return []


def compacted_output(summary: str, kept: Sequence[Any], new_id: Any) -> list[dict[str, Any]]:
    """The compacted item list: the summary's item, then the kept items as output items (easy
    messages get their `type`, `id`, `status` and a content part list)."""
    output = [compaction_item(summary)]
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

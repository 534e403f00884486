"""A `compaction_trigger` input item: the summarising request it stands for (pure)."""

from __future__ import annotations

from ._compaction import SUMMARY_INSTRUCTION
from ._errors import InvalidRequestError
from ._input_models import CompactionTriggerParam, MessageParam
from ._request_models import CreateResponseBody


def summary_body(body: CreateResponseBody, *, max_output_tokens: int) -> CreateResponseBody | None:
    """When `input` ends with a `compaction_trigger`: the body that asks the model to summarise
    the conversation before it (`summarising_body`). None otherwise (a trigger anywhere else is
    refused by the translation)."""
    items = body.input
    if isinstance(items, str) or not items or not isinstance(items[-1], CompactionTriggerParam):
        return None
    if body.background:
        raise InvalidRequestError(
            "Invalid value for 'background': a compaction_trigger cannot run in the background.",
            param="background",
        )
    return summarising_body(
        body.model_copy(update={"input": items[:-1]}), max_output_tokens=max_output_tokens
    )


def summarising_body(
    body: CreateResponseBody, *, max_output_tokens: int, instructions: str | None = None
) -> CreateResponseBody:
    """The body that asks the model to summarise the conversation `body` holds: the summary
    instruction (and the client's `instructions` for it) as the last user turn; not stored, no
    tool calls, no structured format, at most `max_output_tokens`."""
    items = (
        [MessageParam(role="user", content=body.input)] if isinstance(body.input, str) else list(body.input)
    )
    asked = SUMMARY_INSTRUCTION + (f"\n\n{instructions}" if instructions else "")
    return body.model_copy(
        update={
            "input": [*items, MessageParam(role="user", content=asked)],
            "store": False,
            "max_output_tokens": max_output_tokens,
            "tool_choice": "none" if body.tools else None,
            "max_tool_calls": None,
            "text": None,
            "include": None,
            "top_logprobs": None,
        }
    )

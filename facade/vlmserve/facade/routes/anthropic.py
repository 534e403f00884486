"""`POST /v1/messages` and `/v1/messages/count_tokens`: the Responses path (same translation,
engine, limits) answered as Anthropic's Messages API, streamed or not. Nothing is stored.

Errors on these routes are Anthropic-shaped (http/errors.py chooses the shape by path); the
fields they name are the Anthropic request's (`messages[1].content[0].source`).
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse, ServerSentEvent

from vlmserve.anthropic import (
    ClearToolUses,
    EventWriter,
    MessagesRequest,
    anthropic_message,
    apply_edits,
    compact_edit,
    compacted_body,
    compaction_block,
    message_id,
    messages_request,
    needs_count,
    parse_edits,
)
from vlmserve.facade.http.api_keys import owner_of
from vlmserve.facade.http.body_budget import BodyHold
from vlmserve.facade.http.errors import APIError, fields_renamed
from vlmserve.facade.http.request_body import read_json
from vlmserve.facade.responses.auto_compaction import summarise
from vlmserve.facade.responses.compaction_turn import summary_text
from vlmserve.facade.responses.delivery import (
    SSE_SEPARATOR,
    Wire,
    prepare_unless_disconnected,
    respond,
    sse_event,
)
from vlmserve.facade.responses.events import Event
from vlmserve.facade.responses.running import Generation
from vlmserve.facade.state import FacadeState, facade_state
from vlmserve.responses import ResponseResource

router = APIRouter(prefix="/v1/messages", tags=["anthropic"])
State = Annotated[FacadeState, Depends(facade_state)]


@router.post("", operation_id="createMessage", response_model=None)
async def create_message(request: Request, state: State) -> Response:
    hold = BodyHold(state.body_budget)
    try:
        body = await read_json(request, limits=state.settings.limits, hold=hold)
        edited = await _edited(body, state, owner_of(request))
        translated, edits = edited.translated, edited.report
        del body
        if edited.compaction is not None and edited.pause:
            hold.release()
            return _paused(edited, stream=translated.stream)
        with fields_renamed(translated.anthropic_param):
            generation = await prepare_unless_disconnected(
                request, state.responses, translated.request, release=hold.release
            )
    except BaseException:
        hold.release()
        raise

    writer = EventWriter(generation.response_id, generation.resource.model)
    compaction = edited.compaction
    if compaction is not None:
        writer.reserve_blocks(1)  # the compaction block is content block 0

    def frames(event: Event) -> list[ServerSentEvent]:
        sent = writer.events(event)
        if compaction is not None and sent and sent[0][0] == "message_start":
            sent = [sent[0], *_compaction_events(compaction), *sent[1:]]
        return [_sse(kind, data) for kind, data in sent]

    def closing() -> list[ServerSentEvent]:
        last = writer.last(generation.builder.snapshot(), stop_sequence=_stop_sequence(generation))
        if edits is not None:
            # What the context edits did rides on `message_delta`, as Anthropic sends it.
            last = [
                (kind, {**data, "context_management": edits}) if kind == "message_delta" else (kind, data)
                for kind, data in last
            ]
        return [_sse(kind, data) for kind, data in last]

    def answer(resource: dict[str, Any]) -> dict[str, Any]:
        validated = ResponseResource.model_validate(resource)
        message = anthropic_message(validated, stop_sequence=_stop_sequence(generation)).to_json()
        if compaction is not None:
            message["content"] = [compaction, *message["content"]]
        return message if edits is None else {**message, "context_management": edits}

    # Anthropic's streams end at an `error` event.
    errors = functools.partial(fields_renamed, translated.anthropic_param)
    wire = Wire(frames, closing, answer, ends_at_error=True, errors=errors)
    return await respond(
        request, generation, wire, stream=translated.stream, settings=state.settings, release=hold.release
    )


@router.post("/count_tokens", operation_id="countMessageTokens", response_model=None)
async def count_message_tokens(request: Request, state: State) -> dict[str, Any]:
    """The prompt's tokens as `/v1/messages` would send it: replayed `compaction` blocks expanded
    and `context_management.edits` applied (clear_thinking, then clear_tool_uses against its
    trigger), with `context_management.original_input_tokens` (before the edits) as Anthropic
    answers. A compact edit is not run: counting never generates."""
    owner = owner_of(request)
    with state.body_budget.hold() as hold:
        body = await read_json(request, limits=state.settings.limits, hold=hold)
        if not isinstance(body, dict):
            return {"input_tokens": await _count_message(state, body, owner)}
        edits = parse_edits(body.get("context_management"))
        original = await _count_message(state, apply_edits(body, []).body, owner)
        if "context_management" not in body:
            return {"input_tokens": original}
        # The same order as `_edited`: the edits without a trigger, then those with one.
        thinned = apply_edits(body, [edit for edit in edits if not needs_count([edit])])
        tokens = await _count_message(state, thinned.body, owner) if thinned.applied else original
        clearing = [edit for edit in edits if isinstance(edit, ClearToolUses)]
        cleared = apply_edits(thinned.body, clearing, tokens)
        if cleared.applied:
            tokens = await _count_message(state, cleared.body, owner)
    return {"input_tokens": tokens, "context_management": {"original_input_tokens": original}}


async def _count_message(state: FacadeState, body: Any, owner: str) -> int:
    translated = await state.responses.run_translation(messages_request, body, count_tokens=True)
    with fields_renamed(translated.anthropic_param):
        return await state.responses.count_tokens(translated.request, owner=owner)


@dataclass
class _Edited:
    translated: MessagesRequest
    # What to report of the edits (None: the request asked for none).
    report: dict[str, Any] | None = None
    # compact_20260112 fired: the compaction block (first in the answer), whether to stop there,
    # and the summarising call's response (its id and usage, for a paused answer).
    compaction: dict[str, Any] | None = None
    pause: bool = False
    summary: dict[str, Any] | None = None


async def _edited(body: Any, state: FacadeState, owner: str) -> _Edited:
    """The request with its `context_management.edits` applied (docs/context-management.md), and
    what to report of them. A trigger is checked against the prompt's tokens as the engine counts
    them (one more engine call, only for edits that have one); compact_20260112 past its trigger
    summarises first (one more generation) and answers on the compacted conversation."""
    if not isinstance(body, dict):
        return _Edited(await state.responses.run_translation(messages_request, body))
    edits = parse_edits(body.get("context_management"))
    # Replayed compaction blocks first: the translation does not know them.
    edited = apply_edits(body, [edit for edit in edits if not needs_count([edit])])
    translated = await state.responses.run_translation(messages_request, edited.body)
    result = _Edited(translated)
    applied = edited.applied
    counted = [edit for edit in edits if needs_count([edit])]
    if counted:
        try:
            with fields_renamed(translated.anthropic_param):
                tokens = await state.responses.count_tokens(translated.request, owner=owner)
        except APIError as refused:
            # Past this server's limits (more images than a request may hold, longer than the
            # context): past every trigger too. Cleared, it may fit; if not, this is the answer.
            tokens = sys.maxsize
            clearing = [edit for edit in counted if isinstance(edit, ClearToolUses)]
            cleared = apply_edits(edited.body, clearing, tokens)
            if not cleared.applied:
                raise refused from None
            edited, applied = cleared, [*applied, *cleared.applied]
            counted = [edit for edit in counted if edit not in clearing]
            translated = result.translated = await state.responses.run_translation(
                messages_request, edited.body
            )
        compact = compact_edit(counted)
        if compact is not None and tokens >= compact.trigger:
            with fields_renamed(translated.anthropic_param):
                resource, _ = await summarise(
                    state.responses, translated.request, owner=owner, instructions=compact.instructions
                )
            summary = summary_text(resource)
            if summary:
                result.compaction, result.pause, result.summary = (
                    compaction_block(summary),
                    compact.pause_after_compaction,
                    resource,
                )
                edited = apply_edits(compacted_body(edited.body, summary), [])
                result.translated = await state.responses.run_translation(messages_request, edited.body)
        trimmed = apply_edits(edited.body, [edit for edit in counted if edit is not compact], tokens)
        if trimmed.applied:
            result.translated = await state.responses.run_translation(messages_request, trimmed.body)
            applied += trimmed.applied
    if "context_management" in body:
        result.report = {"applied_edits": applied}
    return result


def _paused(edited: _Edited, *, stream: bool) -> Response:
    """pause_after_compaction: the answer is the compaction block alone, `stop_reason` compaction."""
    resource = edited.summary or {}
    usage = resource.get("usage") or {}
    message: dict[str, Any] = {
        "id": message_id(str(resource.get("id", ""))),
        "type": "message",
        "role": "assistant",
        "model": resource.get("model", ""),
        "content": [edited.compaction],
        "stop_reason": "compaction",
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage.get("input_tokens", 0),
            "output_tokens": usage.get("output_tokens", 0),
        },
    }
    if edited.report is not None:
        message["context_management"] = edited.report
    if not stream:
        return JSONResponse(message)
    start = {**message, "content": [], "stop_reason": None, "usage": {"input_tokens": 0, "output_tokens": 0}}
    start.pop("context_management", None)
    delta: dict[str, Any] = {
        "type": "message_delta",
        "delta": {"stop_reason": "compaction", "stop_sequence": None},
        "usage": message["usage"],
    }
    if edited.report is not None:
        delta["context_management"] = edited.report
    events = [
        ("message_start", {"type": "message_start", "message": start}),
        *_compaction_events(edited.compaction or {}),
        ("message_delta", delta),
        ("message_stop", {"type": "message_stop"}),
    ]
    return EventSourceResponse(iter([_sse(kind, data) for kind, data in events]), sep=SSE_SEPARATOR)


def _compaction_events(block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The compaction block as content block 0 of a stream."""
    return [
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "compaction", "content": None},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "compaction_delta", "content": block.get("content")},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ]


def _stop_sequence(generation: Generation) -> str | None:
    result = generation.result
    return (result.stop_sequence or None) if result is not None else None


def _sse(kind: str, data: dict[str, Any]) -> ServerSentEvent:
    # One line of ASCII JSON per event (as on /v1/responses).
    return sse_event(json.dumps(data, separators=(",", ":")), kind)

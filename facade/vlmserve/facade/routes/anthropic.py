"""`POST /v1/messages` and `/v1/messages/count_tokens`: the Responses path (same translation,
engine, limits) answered as Anthropic's Messages API, streamed or not. Nothing is stored.

Errors on these routes are Anthropic-shaped (http/errors.py chooses the shape by path); the
fields they name are the Anthropic request's (`messages[1].content[0].source`).
"""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from sse_starlette import ServerSentEvent

from vlmserve.anthropic import (
    EventWriter,
    MessagesRequest,
    anthropic_message,
    apply_edits,
    messages_request,
    needs_count,
    parse_edits,
)
from vlmserve.facade.http.api_keys import owner_of
from vlmserve.facade.http.body_budget import BodyHold
from vlmserve.facade.http.errors import fields_renamed
from vlmserve.facade.http.request_body import read_json
from vlmserve.facade.responses.delivery import Wire, prepare_unless_disconnected, respond, sse_event
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
        translated, edits = await _edited(body, state, owner_of(request))
        del body
        with fields_renamed(translated.anthropic_param):
            generation = await prepare_unless_disconnected(
                request, state.responses, translated.request, release=hold.release
            )
    except BaseException:
        hold.release()
        raise

    writer = EventWriter(generation.response_id, generation.resource.model)

    def frames(event: Event) -> list[ServerSentEvent]:
        return [_sse(kind, data) for kind, data in writer.events(event)]

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
        return message if edits is None else {**message, "context_management": edits}

    # Anthropic's streams end at an `error` event.
    errors = functools.partial(fields_renamed, translated.anthropic_param)
    wire = Wire(frames, closing, answer, ends_at_error=True, errors=errors)
    return await respond(
        request, generation, wire, stream=translated.stream, settings=state.settings, release=hold.release
    )


@router.post("/count_tokens", operation_id="countMessageTokens", response_model=None)
async def count_message_tokens(request: Request, state: State) -> dict[str, Any]:
    with state.body_budget.hold() as hold:
        body = await read_json(request, limits=state.settings.limits, hold=hold)
        translated = await state.responses.run_translation(messages_request, body, count_tokens=True)
        with fields_renamed(translated.anthropic_param):
            tokens = await state.responses.count_tokens(translated.request, owner=owner_of(request))
    return {"input_tokens": tokens}


async def _edited(body: Any, state: FacadeState, owner: str) -> tuple[MessagesRequest, dict[str, Any] | None]:
    """The request with its `context_management.edits` applied (docs/context-management.md), and
    what to report of them (None: it asked for none). A trigger is checked against the prompt's
    tokens as the engine counts them (one more engine call, only for edits that have one)."""
    if not isinstance(body, dict):
        return await state.responses.run_translation(messages_request, body), None
    edits = parse_edits(body.get("context_management"))
    # Replayed compaction blocks first: the translation does not know them.
    edited = apply_edits(body, [edit for edit in edits if not needs_count([edit])])
    translated = await state.responses.run_translation(messages_request, edited.body)
    applied = edited.applied
    counted = [edit for edit in edits if needs_count([edit])]
    if counted:
        with fields_renamed(translated.anthropic_param):
            tokens = await state.responses.count_tokens(translated.request, owner=owner)
        trimmed = apply_edits(edited.body, counted, tokens)
        if trimmed.applied:
            translated = await state.responses.run_translation(messages_request, trimmed.body)
            applied += trimmed.applied
    if "context_management" not in body:
        return translated, None
    return translated, {"applied_edits": applied}


def _stop_sequence(generation: Generation) -> str | None:
    result = generation.result
    return (result.stop_sequence or None) if result is not None else None


def _sse(kind: str, data: dict[str, Any]) -> ServerSentEvent:
    # One line of ASCII JSON per event (as on /v1/responses).
    return sse_event(json.dumps(data, separators=(",", ":")), kind)

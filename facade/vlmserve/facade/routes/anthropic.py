"""`POST /v1/messages` and `/v1/messages/count_tokens`: the Responses path (same translation,
engine, limits) answered as Anthropic's Messages API, streamed or not. Nothing is stored.

Errors on these routes are Anthropic-shaped (http_errors.py chooses the shape by path); the
fields they name are the Anthropic request's (`messages[1].content[0].source`).
"""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from sse_starlette import ServerSentEvent

from vlmserve.anthropic import EventWriter, anthropic_message, messages_request
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
        translated = await state.responses.run_translation(messages_request, body)
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
        return [_sse(kind, data) for kind, data in last]

    def answer(resource: dict[str, Any]) -> dict[str, Any]:
        validated = ResponseResource.model_validate(resource)
        return anthropic_message(validated, stop_sequence=_stop_sequence(generation)).to_json()

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


def _stop_sequence(generation: Generation) -> str | None:
    result = generation.result
    return (result.stop_sequence or None) if result is not None else None


def _sse(kind: str, data: dict[str, Any]) -> ServerSentEvent:
    # One line of ASCII JSON per event (as on /v1/responses).
    return sse_event(json.dumps(data, separators=(",", ":")), kind)

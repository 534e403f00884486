"""`/v1/responses` routes: create (plain and streamed), retrieve, delete, input items, tokens, cancel."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse, ServerSentEvent

from vlmserve.facade.http.api_keys import owner_of
from vlmserve.facade.http.body_budget import BodyHold
from vlmserve.facade.http.errors import APIError, not_found
from vlmserve.facade.http.openapi import (
    CANCEL_RESPONSE,
    CREATE_RESPONSE_BODY,
    DELETE_RESPONSE,
    INPUT_TOKENS_BODY,
    LIST_INPUT_ITEMS,
    RETRIEVE_RESPONSE,
)
from vlmserve.facade.http.request_body import read_json
from vlmserve.facade.responses.auto_compaction import PrefixedOutput, compact_if_needed
from vlmserve.facade.responses.compaction_turn import (
    CompactionEvents,
    latest_images,
    record_compaction,
    trigger_request,
)
from vlmserve.facade.responses.delivery import (
    SSE_SEPARATOR,
    Wire,
    client_closed,
    finisher,
    ignored_tools_header,
    prepare_unless_disconnected,
    respond,
    sse_event,
    unless_disconnected,
)
from vlmserve.facade.responses.events import Event
from vlmserve.facade.responses.item_lists import PageQuery, item_page, page_query
from vlmserve.facade.responses.prewarm import PrewarmEvents, prewarm_request
from vlmserve.facade.responses.resource import typed_item
from vlmserve.facade.state import FacadeState, facade_state
from vlmserve.facade.store.records import StoredEvent
from vlmserve.responses import DeletedObject, InputTokensCount, ItemList

# The largest sequence number the stores can compare with (SQLite INTEGER, PostgreSQL BIGINT).
MAX_SEQUENCE_NUMBER = 2**63 - 1

router = APIRouter(prefix="/v1/responses", tags=["responses"])
State = Annotated[FacadeState, Depends(facade_state)]


@router.post("", operation_id="createResponse", openapi_extra=CREATE_RESPONSE_BODY, response_model=None)
async def create_response(request: Request, state: State) -> Response:
    # The body holds its bytes in the in-flight budget until the response is finished: its
    # parsed and translated forms live that long (body_budget.py).
    hold = BodyHold(state.body_budget)
    try:
        body = await read_json(request, limits=state.settings.limits, hold=hold)
        create = await state.responses.parse(body, owner=owner_of(request))
        del body
        # A `compaction_trigger` as the last item: the turn summarises (compaction_turn.py);
        # else `context_management` may compact first (auto_compaction.py).
        summary = trigger_request(create, context_length=await state.responses.context_length(create))
        # `prompt_cache_options.prewarm`: prefill only (prewarm.py).
        prewarm = prewarm_request(create) if summary is None else None
        compacted, translation = None, None
        if summary is None and prewarm is None:
            # Stopped when the client goes away, as preparation is (its PDFs' workers killed).
            checked = await unless_disconnected(
                request, compact_if_needed(state.responses, create, owner=owner_of(request))
            )
            if checked is None:
                raise client_closed()
            create, compacted, translation = checked.create, checked.item, checked.translation
        generation = await prepare_unless_disconnected(
            request,
            state.responses,
            summary or prewarm or create,
            release=hold.release,
            translation=translation,
        )
        # A compaction turn is stored as the turn, and the next one prewarmed (compaction_turn.py).
        compacting = create if summary is not None else None
        del create
    except BaseException:
        hold.release()
        raise

    headers = ignored_tools_header(generation)
    wire: Wire | None = None
    if compacting is not None:
        images = latest_images(generation.request, state.settings.compaction_keep_images)
        compaction = CompactionEvents(state.responses.seal, owner=generation.owner, images=images)
        record_compaction(state.responses, generation, compaction, compacting)
        wire = Wire(
            frames=lambda event: _json_frames(compaction.events(event)),
            closing=_done,
            answer=compaction.answer,
        )
    elif prewarm is not None:
        warming = PrewarmEvents()
        wire = Wire(
            frames=lambda event: _json_frames(warming.events(event)), closing=_done, answer=warming.answer
        )
    elif compacted is not None:
        # Sent and stored with the compaction item first in its output.
        prefixed = PrefixedOutput(compacted)
        generation.recorder.stored_json = prefixed.answer
        if not generation.translated.echo.background:
            wire = Wire(
                frames=lambda event: _json_frames(prefixed.events(event.to_json())),
                closing=_done,
                answer=prefixed.answer,
            )
    if wire is None:
        if generation.translated.echo.background:
            # Answered at once (`queued`); the run goes on without this request.
            created = await state.background.start(generation, finisher(generation, hold.release))
            if generation.translated.stream:
                events = state.background.follow(generation.response_id, owner=generation.owner, after=None)
                return EventSourceResponse(_stored_sse(events), headers=headers, sep=SSE_SEPARATOR)
            return JSONResponse(created[0].to_json()["response"], headers=headers)
        wire = Wire(frames=_frames, closing=_done, answer=lambda resource: resource)
    # One answer for every kind of turn above: streamed or not, the body's hold released at the end.
    return await respond(
        request,
        generation,
        wire,
        stream=generation.translated.stream,
        settings=state.settings,
        release=hold.release,
        headers=headers,
    )


@router.post(
    "/input_tokens",
    operation_id="countInputTokens",
    openapi_extra=INPUT_TOKENS_BODY,
    response_model=InputTokensCount,
)
async def count_input_tokens(request: Request, state: State) -> dict[str, Any]:
    with state.body_budget.hold() as hold:
        body = await read_json(request, limits=state.settings.limits, hold=hold)
        create = await state.responses.parse(body, owner=owner_of(request))
        del body
        tokens = await unless_disconnected(
            request, state.responses.count_tokens(create, owner=owner_of(request))
        )
        if tokens is None:
            raise client_closed()
    return {"object": "response.input_tokens", "input_tokens": tokens}


@router.get(
    "/{response_id}",
    operation_id=RETRIEVE_RESPONSE,
    response_model=None,
    responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}}},
)
async def retrieve_response(
    response_id: str,
    request: Request,
    state: State,
    # Background responses: their events after `starting_after` (all without it), then live.
    stream: bool = False,
    # Bounded by the stores' 64-bit integers: 2**63 was a 200 whose stream was then cut.
    starting_after: Annotated[int | None, Query(ge=0, le=MAX_SEQUENCE_NUMBER)] = None,
) -> Response | dict[str, Any]:
    owner = owner_of(request)
    stored = await state.store.responses.get(response_id, owner=owner)
    if stored is None:
        raise not_found("response", response_id)
    if not stream:
        return stored.resource
    if not stored.background:
        # As OpenAI: only a background response's events are kept.
        raise APIError(
            400,
            "This response cannot be streamed because it was not created with background=true.",
            param="stream",
            code="invalid_value",
        )
    events = state.background.follow(response_id, owner=owner, after=starting_after)
    return EventSourceResponse(_stored_sse(events), sep=SSE_SEPARATOR)


@router.delete("/{response_id}", operation_id=DELETE_RESPONSE, response_model=DeletedObject)
async def delete_response(response_id: str, request: Request, state: State) -> dict[str, Any]:
    deleted = await state.store.responses.delete(response_id, owner=owner_of(request))
    if not deleted:
        raise not_found("response", response_id)
    return {"id": response_id, "object": "response", "deleted": True}


@router.get("/{response_id}/input_items", operation_id=LIST_INPUT_ITEMS, response_model=ItemList)
async def list_input_items(
    response_id: str, request: Request, state: State, query: Annotated[PageQuery, Depends(page_query)]
) -> dict[str, Any]:
    return await item_page(
        state.store.responses.list_input_items,
        "response",
        response_id,
        owner_of(request),
        query,
        listed=typed_item,
    )


@router.post("/{response_id}/cancel", operation_id=CANCEL_RESPONSE)
async def cancel_response(response_id: str, request: Request, state: State) -> dict[str, Any]:
    owner = owner_of(request)
    generation = state.responses.running.get(response_id)
    if generation is not None and generation.owner == owner:
        if not generation.translated.echo.background:
            raise _synchronous()
        control_s = state.settings.timeouts.control
        await generation.cancel(control_s)
        # A run cancelled before it began reading ends when it does: answer with its end.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(generation.done.wait(), control_s)
        stored = await state.store.responses.get(response_id, owner=owner)
        return stored.resource if stored is not None else generation.builder.snapshot().to_json()
    # Not running in this process: in another facade process sharing the store, whose run reads
    # this and stops (responses/background.py), or in none (start-up marks those of a previous
    # process failed).
    stored = await state.store.responses.cancel(response_id, owner=owner)
    if stored is None:
        raise not_found("response", response_id)
    if not stored.background:
        raise _synchronous()
    if stored.status == "cancelled":
        return stored.resource
    raise APIError(
        400,
        f"Cannot cancel a response whose status is {stored.status}.",
        param="response_id",
        code="response_not_cancellable",
    )


def _synchronous() -> APIError:
    """As OpenAI: only background responses can be cancelled (a foreground one ends when its
    client disconnects)."""
    return APIError(
        400, "Cannot cancel a synchronous response.", param="response_id", code="response_not_cancellable"
    )


def _frames(event: Event) -> list[ServerSentEvent]:
    # One line of ASCII JSON per event: every newline and every non-ASCII character is escaped
    # (U+2028 too, which some line readers split on).
    return [sse_event(event.to_json_text(), event.type)]


def _json_frames(events: list[dict[str, Any]]) -> list[ServerSentEvent]:
    return [sse_event(json.dumps(event, separators=(",", ":")), event["type"]) for event in events]


def _done() -> list[ServerSentEvent]:
    return [sse_event("[DONE]")]


async def _stored_sse(events: AsyncIterator[StoredEvent]) -> AsyncIterator[ServerSentEvent]:
    """Stored events (background responses) as SSE, as `_frames` sends live ones."""
    async for event in events:
        yield sse_event(event.event_text(), event.type)
    for frame in _done():
        yield frame

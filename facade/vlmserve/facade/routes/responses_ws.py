"""WebSocket mode of `/v1/responses` (the spec's `x-openresponses-websocket`; the openai SDK's
`client.responses.connect()`).

Each `response.create` message is a create body (without `stream`, `stream_options` and
`background`, which the spec disallows here); its events go out as they do on the HTTP stream,
one JSON text message each, through the same preparation, limits, engine call and storage. One
connection carries any number of responses, one after another (a create sent while one runs
waits its turn; a connection reads one message ahead and holds it in the body budget, no more,
and one key's connections are bounded). A failed create is an `error` message (`status`,
`error`) and the connection stays open. The same API keys as HTTP, checked at the handshake.
Closing the connection cancels the response in progress, as a client leaving an HTTP stream does.

The connection remembers its last response (responses/connection_memory.py): a `store: false`
response is continued by `previous_response_id` on the same connection, as in OpenAI's
WebSocket mode; an id neither remembered nor stored is `previous_response_not_found`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from vlmserve.facade.http.api_keys import authenticate
from vlmserve.facade.http.body_budget import BodyHold
from vlmserve.facade.http.errors import APIError, from_invalid_request, insufficient_storage
from vlmserve.facade.http.request_body import parse_message
from vlmserve.facade.responses.auto_compaction import PrefixedOutput, compact_if_needed
from vlmserve.facade.responses.compaction_turn import (
    CompactionEvents,
    latest_images,
    record_compaction,
    trigger_request,
)
from vlmserve.facade.responses.connection_memory import ConnectionMemory
from vlmserve.facade.responses.delivery import finisher
from vlmserve.facade.state import FacadeState
from vlmserve.facade.store.disk_space import OutOfSpaceError
from vlmserve.responses import InvalidRequestError

router = APIRouter(tags=["responses"])

# Create-body fields that only HTTP has: refused here (the spec marks them disallowed).
_DISALLOWED = ("stream", "stream_options", "background")
# WebSocket-only envelope fields: what lane a response goes on (one lane here: in order).
_ENVELOPE = ("type", "stream_id")
_POLICY_VIOLATION = 1008


def error_message(error: APIError) -> dict[str, Any]:
    """The spec's WebSocketErrorEvent."""
    return {"type": "error", "status": error.status, "error": error.payload().to_json()}


def create_body(message: object) -> dict[str, Any]:
    """The create body a client message stands for, or the APIError that refuses it."""
    if not isinstance(message, dict) or message.get("type") != "response.create":
        raise APIError(
            400,
            "Invalid value for 'type': expected a 'response.create' message.",
            param="type",
            code="invalid_value",
        )
    for name in _DISALLOWED:
        if name in message:
            raise APIError(
                400,
                f"Unknown parameter: '{name}': not part of a WebSocket 'response.create' message.",
                param=name,
                code="unknown_parameter",
            )
    body = {key: value for key, value in message.items() if key not in _ENVELOPE}
    body["stream"] = True
    return body


# A connection reads its client's messages only while it has room for them: the response
# running and the next `response.create`, each held in the body budget (under the key's share)
# from the moment it is read. Before, every message was read into a queue outside the budget
# (one socket: 150 x 15 MiB, facade 94 -> 2,030 MiB). What the client sends beyond waits in the
# server's WebSocket buffer (`ws_max_queue`, cli.py) and in the socket: TCP pushes back.
_MESSAGES_HELD = 2
_TRY_AGAIN_LATER = 1013


@dataclass
class _Received:
    """A message as read: its text and the bytes it holds, or why it was refused on receipt."""

    text: str
    hold: BodyHold
    refused: APIError | None = None


@router.websocket("/v1/responses")
async def responses_websocket(websocket: WebSocket) -> None:
    try:
        owner = authenticate(websocket)
    except APIError as error:
        await _deny(websocket, error, _POLICY_VIOLATION)
        return
    state: FacadeState = websocket.app.state.facade
    # Each open socket may hold two messages (above): the sockets of one key are bounded too.
    limit = state.settings.limits.max_websockets_per_key
    if state.websockets[owner] >= limit:
        refused = APIError(
            429,
            f"This API key has {limit} WebSocket connections open, this server's limit; close one first.",
            code="rate_limit_exceeded",
            type="requests",
            headers={"Retry-After": str(state.settings.retry_after_s)},
        )
        await _deny(websocket, refused, _TRY_AGAIN_LATER)
        return
    state.websockets[owner] += 1
    try:
        await websocket.accept()
        await _serve(websocket, state, owner)
    finally:
        state.websockets[owner] -= 1
        if state.websockets[owner] <= 0:
            del state.websockets[owner]


async def _deny(websocket: WebSocket, error: APIError, close_code: int) -> None:
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        # The same answer (status and body) as over HTTP, as the handshake's answer.
        await websocket.send_denial_response(error.to_response())
    else:
        await websocket.close(code=close_code, reason=error.message[:120])


async def _serve(websocket: WebSocket, state: FacadeState, owner: str) -> None:
    room = asyncio.Semaphore(_MESSAGES_HELD)
    messages: asyncio.Queue[_Received | None] = asyncio.Queue()
    memory = ConnectionMemory()

    async def read() -> None:
        try:
            while True:
                await room.acquire()
                messages.put_nowait(_receipt(state, owner, await websocket.receive_text()))
        except WebSocketDisconnect:
            messages.put_nowait(None)

    reader = asyncio.ensure_future(read())
    try:
        while (received := await messages.get()) is not None:
            running = asyncio.ensure_future(_respond(websocket, state, received, owner, memory))
            # The client leaving cancels the response in progress (and so its engine call).
            await asyncio.wait({running, reader}, return_when=asyncio.FIRST_COMPLETED)
            if not running.done():
                running.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running
                break
            room.release()
            running.result()
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        while not messages.empty():
            left = messages.get_nowait()
            if left is not None:
                left.hold.release()


def _receipt(state: FacadeState, owner: str, text: str) -> _Received:
    """A message just read, its bytes held from now on (or refused: 413, or 503 when the body
    budget or the key's share has no room); refusals are answered in turn, as its response."""
    limits = state.settings.limits
    hold = BodyHold(state.body_budget, owner)
    size = len(text.encode())
    try:
        if size > limits.max_request_bytes:
            raise APIError(
                413, f"The message is larger than {limits.max_request_bytes} bytes.", code="request_too_large"
            )
        hold.reserve(size)
    except APIError as error:
        return _Received(text, hold, refused=error)
    return _Received(text, hold)


async def _respond(
    websocket: WebSocket, state: FacadeState, received: _Received, owner: str, memory: ConnectionMemory
) -> None:
    """One `response.create`: its events, or an error message."""
    hold = received.hold
    try:
        if received.refused is not None:
            raise received.refused
        message = parse_message(received.text, limits=state.settings.limits)
        del received
        create = await state.responses.parse(create_body(message), owner=owner)
        summary = trigger_request(create, context_length=await state.responses.context_length(create))
        compacted, translation = None, None
        if summary is None:
            checked = await compact_if_needed(state.responses, create, owner=owner)
            create, compacted, translation = checked.create, checked.item, checked.translation
        # A compaction turn is not remembered: its item is the state a later turn sends.
        remember = memory if summary is None else None
        generation = await state.responses.prepare(
            summary or create, owner=owner, memory=remember, translation=translation
        )
    except (APIError, InvalidRequestError, OutOfSpaceError) as failure:
        hold.release()
        await websocket.send_text(json.dumps(error_message(_api_error(failure))))
        return
    except BaseException:
        hold.release()
        raise
    try:
        try:
            await generation.open(state.settings.timeouts.stream_first_message)
        except APIError as error:
            await websocket.send_text(json.dumps(error_message(error)))
            return
        compaction = None
        if summary is not None:
            images = latest_images(generation.request, state.settings.compaction_keep_images)
            compaction = CompactionEvents(state.responses.seal, owner=owner, images=images)
            record_compaction(state.responses, generation, compaction, create)
        prefixed = PrefixedOutput(compacted) if compacted is not None else None
        if prefixed is not None:
            generation.recorder.stored_json = prefixed.answer
        async for event in generation.events():
            if compaction is not None:
                outgoing = compaction.events(event)
            elif prefixed is not None:
                outgoing = prefixed.events(event.to_json())
            else:
                outgoing = [event.to_json()]
            for sent in outgoing:
                await websocket.send_text(json.dumps(sent, separators=(",", ":")))
        memory.ended(generation.builder.snapshot())
    finally:
        await finisher(generation, hold.release)()


def _api_error(failure: APIError | InvalidRequestError | OutOfSpaceError) -> APIError:
    """A refused create as the error message's APIError (the app's handlers do this over HTTP)."""
    if isinstance(failure, InvalidRequestError):
        return from_invalid_request(failure)
    if isinstance(failure, OutOfSpaceError):
        return insufficient_storage(failure.what)
    return failure

"""`POST /v1/chat/completions`: the Responses path (same translation, engine, limits and errors)
answered as a chat completion, streamed or not. Nothing is stored (`store: true` is refused)."""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from sse_starlette import ServerSentEvent

from vlmserve.chat import ChunkWriter, chat_completion, chat_request
from vlmserve.facade.http.body_budget import BodyHold
from vlmserve.facade.http.errors import fields_renamed
from vlmserve.facade.http.openapi import CREATE_CHAT_COMPLETION_BODY
from vlmserve.facade.http.request_body import read_json
from vlmserve.facade.responses.delivery import (
    Wire,
    ignored_tools_header,
    prepare_unless_disconnected,
    respond,
    sse_event,
)
from vlmserve.facade.responses.events import Event
from vlmserve.facade.state import FacadeState, facade_state
from vlmserve.responses import ErrorEvent, ResponseResource

router = APIRouter(prefix="/v1/chat", tags=["chat"])
State = Annotated[FacadeState, Depends(facade_state)]


@router.post(
    "/completions",
    operation_id="createChatCompletion",
    openapi_extra=CREATE_CHAT_COMPLETION_BODY,
    response_model=None,
)
async def create_chat_completion(request: Request, state: State) -> Response:
    hold = BodyHold(state.body_budget)
    try:
        body = await read_json(request, limits=state.settings.limits, hold=hold)
        chat = await state.responses.run_translation(chat_request, body)
        del body
        with fields_renamed(chat.chat_param):
            generation = await prepare_unless_disconnected(
                request, state.responses, chat.request, release=hold.release
            )
    except BaseException:
        hold.release()
        raise

    writer = ChunkWriter(
        generation.response_id,
        generation.resource.created_at,
        generation.resource.model,
        include_usage=chat.include_usage,
        logprobs=chat.logprobs,
    )

    text_frame = _TextFrames(writer)

    def frames(event: Event) -> list[ServerSentEvent]:
        text = writer.plain_text(event)
        if text is not None:
            return [text_frame(text)]
        if isinstance(event, ErrorEvent):
            # OpenAI's chat streams carry a failure as an `error` object, then end.
            error = event.error.to_json()
            error["param"] = chat.chat_param(event.error.param) if event.error.param else None
            return [_data({"error": error})]
        return [_data(chunk.to_json()) for chunk in writer.chunks(event)]

    def closing() -> list[ServerSentEvent]:
        last = [_data(chunk.to_json()) for chunk in writer.last(generation.builder.snapshot())]
        return [*last, sse_event("[DONE]")]

    def answer(resource: dict[str, Any]) -> dict[str, Any]:
        completion = chat_completion(ResponseResource.model_validate(resource), logprobs=chat.logprobs)
        return completion.to_json()

    errors = functools.partial(fields_renamed, chat.chat_param)
    wire = Wire(frames, closing, answer, ends_at_error=True, errors=errors)
    return await respond(
        request,
        generation,
        wire,
        stream=chat.stream,
        settings=state.settings,
        release=hold.release,
        headers=ignored_tools_header(generation),
    )


def _data(payload: dict[str, Any]) -> ServerSentEvent:
    # One line of ASCII JSON per chunk (as on /v1/responses).
    return sse_event(_json(payload))


def _json(payload: Any) -> str:
    return json.dumps(payload, separators=(",", ":"))


class _TextFrames:
    """A text delta's frame from a template: `_data(writer.text_chunk(text).to_json())`'s bytes,
    the chunk's JSON around the text made once per stream. A model and its JSON per token were
    most of the chat route's CPU per streamed token (bench/stack_cpu.py)."""

    # Stands for the text in the template: no id or model name holds it.
    _MARK = "\ufdd0text\ufdd0"

    def __init__(self, writer: ChunkWriter) -> None:
        self._writer = writer
        self._around: tuple[str, str] | None = None

    def __call__(self, text: str) -> ServerSentEvent:
        if self._around is None:
            whole = _json(self._writer.text_chunk(self._MARK).to_json())
            head, mark, tail = whole.partition(_json(self._MARK))
            if not mark or _json(self._MARK) in tail:
                return _data(self._writer.text_chunk(text).to_json())
            self._around = (head, tail)
        head, tail = self._around
        return sse_event(head + _json(text) + tail)

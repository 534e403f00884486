"""`POST /v1/responses/compact`: the model summarises a conversation into a compacted item list.

The conversation (`input` items, and the chain of `previous_response_id`) is sent to the model
through the one Responses path, followed by a user turn asking for a summary (nothing stored).
The answer is the summary's `compaction` item, then the recent items kept as they were (the last
user turn and what follows it, images included): a later `responses.create` takes that list as
its `input` (vlmserve/responses/_compaction.py).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from vlmserve.facade.http.api_keys import owner_of
from vlmserve.facade.http.body_budget import BodyHold
from vlmserve.facade.http.errors import APIError
from vlmserve.facade.http.request_body import read_json
from vlmserve.facade.responses import ids
from vlmserve.facade.responses.compaction_turn import SUMMARY_MAX_OUTPUT_TOKENS, summary_text
from vlmserve.facade.responses.delivery import CLIENT_CLOSED_REQUEST, collect, finisher, unless_disconnected
from vlmserve.facade.state import FacadeState, facade_state
from vlmserve.responses import SUMMARY_INSTRUCTION, CompactionState, compacted_output, kept_items

router = APIRouter(prefix="/v1/responses", tags=["responses"])
State = Annotated[FacadeState, Depends(facade_state)]

_FIELDS = ("model", "input", "previous_response_id", "instructions", "prompt_cache_key")


def summary_request(body: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """The create body that asks for the summary, and the client's input items."""
    unknown = sorted(set(body) - set(_FIELDS))
    if unknown:
        name = unknown[0]
        raise APIError(400, f"Unknown parameter: '{name}'.", param=name, code="unknown_parameter")
    if not isinstance(body.get("model"), str):
        raise APIError(
            400, "Missing required parameter: 'model'.", param="model", code="missing_required_parameter"
        )
    given = body.get("input")
    if given is not None and not isinstance(given, str | list):
        raise APIError(
            400, "Invalid type for 'input': expected a string or an array of input items.", param="input"
        )
    items: list[Any] = [{"role": "user", "content": given}] if isinstance(given, str) else list(given or [])
    if not items and body.get("previous_response_id") is None:
        message = "Nothing to compact: give 'input' or 'previous_response_id'."
        raise APIError(400, message, param="input", code="invalid_value")
    request: dict[str, Any] = {
        "model": body["model"],
        "input": [*items, {"role": "user", "content": SUMMARY_INSTRUCTION}],
        "store": False,
        "max_output_tokens": SUMMARY_MAX_OUTPUT_TOKENS,
    }
    for name in ("previous_response_id", "instructions", "prompt_cache_key"):
        if body.get(name) is not None:
            request[name] = body[name]
    return request, items


@router.post("/compact", operation_id="compactResponse", response_model=None)
async def compact_response(request: Request, state: State) -> Response:
    hold = BodyHold(state.body_budget)
    try:
        body = await read_json(request, limits=state.settings.limits, hold=hold)
        if not isinstance(body, dict):
            raise APIError(400, "The body must be a JSON object.")
        create, items = summary_request(body)
        parsed = await state.responses.parse(create, owner=owner_of(request))
        generation = await state.responses.prepare(parsed, owner=owner_of(request))
    except BaseException:
        hold.release()
        raise
    try:
        first_message_s = state.settings.timeouts.stream_first_message
        resource = await unless_disconnected(request, collect(generation, first_message_s))
    finally:
        await finisher(generation, hold.release)()
    if resource is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    summary = summary_text(resource)
    if not summary:
        raise APIError(502, "The model wrote no summary; nothing was compacted.", code="compaction_failed")
    # The kept items carry the recent images themselves: the sealed state holds the summary.
    sealed = state.responses.seal.seal(CompactionState(summary), owner=owner_of(request))
    return JSONResponse(
        {
            "id": generation.response_id,
            "object": "response.compaction",
            "created_at": resource["created_at"],
            "output": compacted_output(sealed, kept_items(items), ids.new_id),
            "usage": resource["usage"],
        }
    )

"""`prompt_cache_options: {"prewarm": true}`: prefill the prompt into the prefix cache, answer
nothing (docs/context-management.md).

The request runs as any other (same translation, limits and prefix-cache partition, so a later
request with the same prefix finds it warm), with `PREWARM_OUTPUT_TOKENS` output tokens that are
not returned: the response is `completed` with an empty `output` and the
prompt's `usage`; nothing is stored. Its stream is the lifecycle events only.

`prewarm_compacted`: the same for the turn after a compaction (compaction_turn.py): the
compacting request's instructions and tools, then its compaction item, which is the prefix of
the next turn's prompt.
"""

from __future__ import annotations

from typing import Any

from vlmserve.facade.http.errors import APIError
from vlmserve.facade.responses.delivery import collect, finisher
from vlmserve.facade.responses.events import Event
from vlmserve.facade.responses.preparation import ResponsesService
from vlmserve.responses import CreateRequest

# What a turn continuing the compacted one does not repeat: the item covers the earlier turns.
_NOT_CARRIED = ("previous_response_id", "conversation", "background", "stream", "context_management")

_PARAM = "prompt_cache_options"
# One: the engine offers the prefix cache the prompt of a request that ends on its first token
# too (Runner._leave), so a prewarm costs one prefill and one sampled token.
PREWARM_OUTPUT_TOKENS = 1
_LIFECYCLE = ("response.created", "response.queued", "response.in_progress")
_TERMINAL = ("response.completed", "response.incomplete")


def prewarm_request(create: CreateRequest) -> CreateRequest | None:
    """The prefill-only request `prompt_cache_options.prewarm` asks for; None when it does not."""
    options = (create.body.model_extra or {}).get(_PARAM)
    if options is None:
        return None
    if not isinstance(options, dict):
        raise APIError(
            400, f"Invalid type for '{_PARAM}': expected an object.", param=_PARAM, code="invalid_type"
        )
    unknown = sorted(set(options) - {"prewarm"})
    if unknown:
        name = f"{_PARAM}.{unknown[0]}"
        raise APIError(400, f"Unknown parameter: '{name}'.", param=name, code="unknown_parameter")
    prewarm = options.get("prewarm", False)
    if not isinstance(prewarm, bool):
        name = f"{_PARAM}.prewarm"
        raise APIError(
            400, f"Invalid type for '{name}': expected a boolean.", param=name, code="invalid_type"
        )
    if not prewarm:
        return None
    if create.body.background:
        raise APIError(
            400, "A prewarm cannot run in the background.", param="background", code="invalid_value"
        )
    body = create.body.model_copy(
        update={
            "max_output_tokens": PREWARM_OUTPUT_TOKENS,
            "store": False,
            "include": None,
            "top_logprobs": None,
        }
    )
    return CreateRequest(body, extras=create.extras, input_json=create.input_json)


class PrewarmEvents:
    """A prewarm's events and answer: the lifecycle, then `completed` with an empty output."""

    def __init__(self) -> None:
        self._sequence = 0

    @staticmethod
    def answer(resource: dict[str, Any]) -> dict[str, Any]:
        if resource.get("status") in ("completed", "incomplete"):
            return {**resource, "status": "completed", "incomplete_details": None, "output": []}
        return {**resource, "output": []}

    def events(self, event: Event) -> list[dict[str, Any]]:
        sent = event.to_json()
        kind = sent["type"]
        if kind in _LIFECYCLE:
            return [self._next(sent)]
        if kind in _TERMINAL:
            return [self._next({"type": "response.completed", "response": self.answer(sent["response"])})]
        if kind in ("response.failed", "error"):
            if "response" in sent:
                sent = {**sent, "response": {**sent["response"], "output": []}}
            return [self._next(sent)]
        return []

    def _next(self, event: dict[str, Any]) -> dict[str, Any]:
        numbered = {**event, "sequence_number": self._sequence}
        self._sequence += 1
        return numbered


async def prewarm_compacted(
    service: ResponsesService, compacting: CreateRequest, item: dict[str, Any], *, owner: str
) -> None:
    """Prefill what the turn after a compaction starts with: `compacting`'s instructions, tools
    and settings, and the compaction `item` as the input (the item leaves out everything before
    it, so this is the next turn's prompt up to what it adds)."""
    raw = compacting.body.model_dump(mode="json", by_alias=True, exclude_unset=True, serialize_as_any=True)
    for name in _NOT_CARRIED:
        raw.pop(name, None)
    raw["input"] = [item]
    raw[_PARAM] = {"prewarm": True}
    warm = prewarm_request(await service.parse(raw, owner=owner))
    assert warm is not None
    generation = await service.prepare(warm, owner=owner)
    try:
        await collect(generation, service.settings.timeouts.stream_first_message)
    finally:
        await finisher(generation, lambda: None)()

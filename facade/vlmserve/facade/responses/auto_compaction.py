"""Automatic compaction of a `POST /v1/responses` (`context_management`, docs/context-management.md).

`context_management: [{"type": "compaction", "compact_threshold": N}]`: when the prompt (as the
engine counts it) reaches N tokens, the conversation is first summarised into a sealed
`compaction` item (the `compaction_trigger` turn's way: compaction_turn.py), and the response is
generated on the compacted input instead: that item, then the last user message and the last
tool call with its outputs. The item comes first in the response's `output` (streamed before
the answer, as OpenAI does), so the client's next turn carries it. Without the field, the same
happens when the prompt would not fit the model's context at all (unless the request asks for
`truncation: "auto"`), chained turns (`previous_response_id`, `conversation`) included: their
compacted input is the item and the recent items of the whole conversation (stored turns and
input), and the translation leaves out what came before the item. `context_management: []` opts
out. A threshold the instructions and tools alone reach is a 400 naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vlmserve.client import EngineError
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade.http.errors import APIError
from vlmserve.facade.responses.compaction_turn import CompactionEvents, latest_images, summary_budget
from vlmserve.facade.responses.delivery import collect, finisher
from vlmserve.facade.responses.preparation import ResponsesService, Translation
from vlmserve.facade.responses.running import Generation
from vlmserve.responses import CreateRequest, summarising_body

_PARAM = "context_management"
_CALLS = ("function_call", "custom_tool_call")
_TERMINAL = ("response.completed", "response.incomplete", "response.failed")
# What an image or a file counts for in the "could it not fit?" look (screenshots are a few
# hundred to a few thousand tokens; a PDF page is an image too).
_MEDIA_CHARACTERS = 1024
# How far back a conversation's items are read for the recent items a compaction keeps.
_MAX_CONVERSATION_ITEMS = 2000


@dataclass(frozen=True)
class CompactionPolicy:
    # None: only when the prompt would not fit the context.
    threshold: int | None


def compaction_policy(value: Any, *, given: bool) -> CompactionPolicy | None:
    """The request's `context_management` (None: opted out, `[]`); 400s naming the field."""
    if not given or value is None:
        return CompactionPolicy(None)
    if not isinstance(value, list):
        raise APIError(
            400, f"Invalid type for '{_PARAM}': expected an array.", param=_PARAM, code="invalid_type"
        )
    if not value:
        return None
    if len(value) > 1:
        raise APIError(
            400, f"Invalid value for '{_PARAM}': at most one entry.", param=_PARAM, code="invalid_value"
        )
    entry = value[0]
    at = f"{_PARAM}[0]"
    if not isinstance(entry, dict) or entry.get("type") != "compaction":
        raise APIError(
            400,
            f"Invalid value for '{at}.type': expected 'compaction'.",
            param=f"{at}.type",
            code="invalid_value",
        )
    unknown = sorted(set(entry) - {"type", "compact_threshold"})
    if unknown:
        name = f"{at}.{unknown[0]}"
        raise APIError(400, f"Unknown parameter: '{name}'.", param=name, code="unknown_parameter")
    threshold = entry.get("compact_threshold")
    if threshold is None:
        return CompactionPolicy(None)
    if type(threshold) is not int or threshold <= 0:
        name = f"{at}.compact_threshold"
        raise APIError(
            400, f"Invalid value for '{name}': expected a positive integer.", param=name, code="invalid_value"
        )
    return CompactionPolicy(threshold)


def recent_items(items: list[Any]) -> list[Any]:
    """What a compaction keeps as it was: the last user message, and the last tool call with its
    outputs after it (an agent loop's one user message may be followed by hundreds of calls)."""
    last_user = next(
        (
            i
            for i in range(len(items) - 1, -1, -1)
            if isinstance(items[i], dict) and items[i].get("role") == "user"
        ),
        None,
    )
    last_call = next(
        (
            i
            for i in range(len(items) - 1, -1, -1)
            if isinstance(items[i], dict) and items[i].get("type") in _CALLS
        ),
        None,
    )
    kept = [items[last_user]] if last_user is not None else []
    if last_call is not None and (last_user is None or last_call > last_user):
        return [*kept, *items[last_call:]]
    return list(items[last_user:]) if last_user is not None else []


async def _count(service: ResponsesService, translation: Translation, request: pb.GenerateRequest) -> int:
    try:
        counted = await translation.model.engine.count_tokens(
            request, timeout=service.settings.timeouts.control
        )
    except EngineError as error:
        raise service.counting_refused(error, translation, request) from None
    return int(counted.input_tokens)


@dataclass(frozen=True)
class Checked:
    """What `compact_if_needed` decided: the request to answer, the compaction item (None: not
    compacted), and the request's translation when the check made one and it still holds (not
    compacted), for `prepare` to take instead of translating (and checking images) again."""

    create: CreateRequest
    item: dict[str, Any] | None = None
    translation: Translation | None = None


async def compact_if_needed(service: ResponsesService, create: CreateRequest, *, owner: str) -> Checked:
    """The request to answer, compacted first when its policy says so."""
    body = create.body
    extra = body.model_extra or {}
    policy = compaction_policy(extra.get(_PARAM), given=_PARAM in extra)
    if policy is None:
        return Checked(create)
    if policy.threshold is None and not await _may_not_fit(service, create, owner=owner):
        return Checked(create)
    # Translated as `prepare` translates (long texts held), so that a request left as it is
    # is not translated twice: `prepare` takes this translation.
    translation = await service.translate(create, owner=owner, hold_texts=True)
    outgoing = translation.translated.outgoing
    context = translation.info.context_length
    if policy.threshold is None:
        # Only when it would not fit; a prompt of fewer bytes than the context has tokens fits.
        if not context or outgoing.wire_size() < context:
            return Checked(create, translation=translation)
        sampling = outgoing.sampling
        reserve = min(sampling.max_tokens, context // 4) if sampling.HasField("max_tokens") else 0
        limit = context - max(1, reserve)
    else:
        limit = policy.threshold
    request = outgoing.whole()
    tokens = await _count(service, translation, request)
    if tokens < limit:
        return Checked(create, translation=translation)
    if policy.threshold is not None:
        await _check_threshold(service, translation, request, policy.threshold)
    item = await _summarise(service, create, owner=owner)
    raw = body.model_dump(mode="json", by_alias=True, exclude_unset=True, serialize_as_any=True)
    given = create.stored_input()
    items = [{"type": "message", "role": "user", "content": given}] if isinstance(given, str) else list(given)
    # A chained turn keeps its `previous_response_id` / `conversation` (stored as continuing it);
    # the item leaves the stored turns out of the prompt, so the recent ones come with it.
    earlier = await _stored_items(service, create, owner=owner)
    raw["input"] = [item, *recent_items([*earlier, *items])]
    raw.pop(_PARAM, None)
    return Checked(await service.parse(raw, owner=owner), item)


async def _may_not_fit(service: ResponsesService, create: CreateRequest, *, owner: str) -> bool:
    """Without `context_management`, whether the prompt could be longer than the context, told
    without translating it (every request asks this): an input of fewer characters than the
    context has tokens fits. A turn continuing a stored response adds that response's tokens
    (its `usage`: what it was sent and wrote), one continuing a conversation its stored bytes
    (images count their bytes: such a conversation is counted more often than it must be)."""
    body = create.body
    if body.truncation == "auto":
        return False  # asked to be truncated instead
    context = (await service.models.resolve(body.model)).info.context_length
    if not context:
        return False
    size = _characters(create.stored_input(), context)
    store = service.store
    if body.previous_response_id is not None:
        stored = await store.responses.get(body.previous_response_id, owner=owner)
        if stored is None:
            # Not stored (a WebSocket connection's `store: false` turn) or gone: the usual path
            # continues it or says it was not found.
            return False
        usage = stored.resource.get("usage") or {}
        earlier = int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)
        # Counted exactly when the estimate reaches what an answer's room may leave of the context.
        return earlier + size >= context - context // 4
    conversation = body.conversation
    if conversation is not None:
        conversation_id = conversation if isinstance(conversation, str) else conversation.id
        stored_bytes = await store.conversations.size(conversation_id, owner=owner)
        return stored_bytes is not None and stored_bytes + size >= context - context // 4
    return size >= context


async def _stored_items(service: ResponsesService, create: CreateRequest, *, owner: str) -> list[Any]:
    """The stored items a chained turn continues, oldest first (the chain's inputs and outputs;
    a conversation's latest items, back to its last user message); [] for an unchained one."""
    body = create.body
    store = service.store
    if body.previous_response_id is not None:
        items = await store.responses.replay_items(
            body.previous_response_id, owner=owner, max_depth=service.settings.limits.max_chain_depth
        )
        return [stored.item for stored in items or []]
    conversation = body.conversation
    if conversation is None:
        return []
    conversation_id = conversation if isinstance(conversation, str) else conversation.id
    newest_first: list[Any] = []
    after: str | None = None
    while len(newest_first) < _MAX_CONVERSATION_ITEMS:
        page = await store.conversations.list_items(
            conversation_id, after=after, limit=100, order="desc", owner=owner
        )
        if page is None or not page.items:
            break
        newest_first += [stored.item for stored in page.items]
        if not page.has_more or any(stored.role == "user" for stored in page.items):
            break
        after = page.items[-1].id
    return newest_first[::-1]


def _characters(value: Any, bound: int) -> int:
    """The characters of a JSON value's texts, counted up to `bound` (then it stops); an image or
    a file (a data URL, `file_data`, a `file_id`) counts as `_MEDIA_CHARACTERS`, not its base64."""
    total = 0
    stack = [value]
    while stack and total < bound:
        item = stack.pop()
        if isinstance(item, str):
            total += _MEDIA_CHARACTERS if item.startswith("data:") else len(item)
        elif isinstance(item, dict):
            for key, inner in item.items():
                if key in ("file_data", "file_id", "data"):
                    total += _MEDIA_CHARACTERS
                elif key not in ("type", "id", "call_id", "role", "detail", "media_type"):
                    stack.append(inner)
        elif isinstance(item, list):
            stack.extend(item)
    return total


async def _check_threshold(
    service: ResponsesService, translation: Translation, request: pb.GenerateRequest, threshold: int
) -> None:
    """A threshold the instructions and tools alone reach would compact every turn, to no end."""
    fixed = pb.GenerateRequest()
    fixed.CopyFrom(request)
    del fixed.messages[:]
    for message in request.messages:
        if message.role in (pb.ROLE_SYSTEM, pb.ROLE_DEVELOPER):
            fixed.messages.add().CopyFrom(message)
    fixed.messages.add(role=pb.ROLE_USER, parts=[pb.Part(text=pb.TextPart(text="."))])
    instructions = await _count(service, translation, fixed)
    if threshold <= instructions:
        name = f"{_PARAM}[0].compact_threshold"
        raise APIError(
            400,
            f"Invalid value for '{name}': {threshold} tokens is not more than the instructions and tools "
            f"alone ({instructions} tokens); nothing could be compacted.",
            param=name,
            code="invalid_value",
        )


async def summarise(
    service: ResponsesService, create: CreateRequest, *, owner: str, instructions: str | None = None
) -> tuple[dict[str, Any], Generation]:
    """The model's summary of the conversation `create` holds (the collected response), and its
    generation (its request holds the conversation's images). What does not fit even the
    summarising call is left out, oldest first (`truncation: "auto"`); `instructions` are added
    to the summary instruction (Anthropic's compact edit)."""
    # A summary is a small part of the context it frees (mlx-vlm's bound): on a small model the
    # summary would otherwise take what it was to free, and the answer would not fit.
    context = (await service.models.resolve(create.body.model)).info.context_length
    summary = summarising_body(
        create.body, max_output_tokens=summary_budget(context), instructions=instructions
    )
    summary = summary.model_copy(update={"stream": False, "background": False, "truncation": "auto"})
    generation = await service.prepare(CreateRequest(summary, extras=create.extras), owner=owner)
    try:
        resource = await collect(generation, service.settings.timeouts.stream_first_message)
    finally:
        await finisher(generation, lambda: None)()
    return resource, generation


async def _summarise(service: ResponsesService, create: CreateRequest, *, owner: str) -> dict[str, Any]:
    """The conversation summarised into a sealed compaction item."""
    resource, generation = await summarise(service, create, owner=owner)
    images = latest_images(generation.request, service.settings.compaction_keep_images)
    return CompactionEvents(service.seal, owner=owner, images=images).item(resource)


class PrefixedOutput:
    """A response's events and answer with the compaction item first in its output."""

    def __init__(self, item: dict[str, Any]) -> None:
        self._item = item
        self._sent = False
        self._sequence = 0

    def answer(self, resource: dict[str, Any]) -> dict[str, Any]:
        return {**resource, "output": [self._item, *resource["output"]]}

    def events(self, sent: dict[str, Any]) -> list[dict[str, Any]]:
        shifted = dict(sent)
        if "output_index" in shifted:
            shifted["output_index"] += 1
        if isinstance(shifted.get("response"), dict) and sent["type"] in _TERMINAL:
            shifted["response"] = self.answer(shifted["response"])
        out = [self._next(shifted)]
        if not self._sent and sent["type"] == "response.in_progress":
            self._sent = True
            for kind in ("response.output_item.added", "response.output_item.done"):
                out.append(self._next({"type": kind, "output_index": 0, "item": self._item}))
        return out

    def _next(self, event: dict[str, Any]) -> dict[str, Any]:
        numbered = {**event, "sequence_number": self._sequence}
        self._sequence += 1
        return numbered

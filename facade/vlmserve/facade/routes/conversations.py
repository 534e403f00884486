"""`/v1/conversations`: create one explicitly, then pass its id as `conversation` on responses.

A conversation accumulates items: each response created with `conversation` appends its input
items and its output items when it finishes (completed or incomplete), and the next response
replays them all before its own input. Unknown ids are 404s; nothing is created implicitly.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Query, Request

from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade.engines.catalog import image_limits, images_per_request
from vlmserve.facade.engines.pools import ResolvedModel
from vlmserve.facade.http.api_keys import owner_of
from vlmserve.facade.http.errors import APIError, insufficient_storage, not_found
from vlmserve.facade.http.openapi import (
    ADD_CONVERSATION_ITEMS,
    ADD_CONVERSATION_ITEMS_BODY,
    ADD_CONVERSATION_ITEMS_REQUEST,
    CREATE_CONVERSATION,
    CREATE_CONVERSATION_BODY,
    DELETE_CONVERSATION,
    LIST_CONVERSATION_ITEMS,
    RETRIEVE_CONVERSATION,
    UPDATE_CONVERSATION,
    UPDATE_CONVERSATION_REQUEST,
)
from vlmserve.facade.http.request_body import read_json
from vlmserve.facade.responses import ids
from vlmserve.facade.responses.item_lists import PageQuery, item_list, item_page, page_query
from vlmserve.facade.responses.item_references import ItemReferences, check_reference_count
from vlmserve.facade.responses.resource import typed_item
from vlmserve.facade.state import FacadeState, facade_state
from vlmserve.facade.store.disk_space import OutOfSpaceError
from vlmserve.facade.store.quotas import check_room, quota_exceeded, stored_size
from vlmserve.facade.store.records import ConversationRecord, ItemPage, StorageQuotaExceededError, StoredItem
from vlmserve.responses import (
    ConversationResource,
    DeletedObject,
    IncludeValue,
    InvalidRequestError,
    ItemList,
    input_to_messages,
    parse_as,
    parse_metadata,
)

T = TypeVar("T")

router = APIRouter(prefix="/v1/conversations", tags=["conversations"])
State = Annotated[FacadeState, Depends(facade_state)]


@router.post(
    "",
    operation_id="createConversation",
    openapi_extra=CREATE_CONVERSATION_BODY,
    response_model=ConversationResource,
)
async def create_conversation(request: Request, state: State) -> dict[str, Any]:
    with state.body_budget.hold() as hold:
        body = await read_json(request, limits=state.settings.limits, hold=hold)
        return await _create_conversation(body, request, state)


async def _create_conversation(body: Any, request: Request, state: FacadeState) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise APIError(400, "The request body must be a JSON object.", code="invalid_type")
    parse_as(CREATE_CONVERSATION, body, "")
    _check_disk(state, "the conversation")
    # An extension (OpenAI's conversations have no model): its responses' default from now on.
    requested = body.get("model")
    model = await state.models.resolve(requested) if isinstance(requested, str) else None
    items, messages = await _checked_items(body.get("items"), state, request, required=False, model=model)
    metadata = parse_metadata(body.get("metadata"))
    adding = stored_size(items, messages) + len(json.dumps(metadata))
    await check_room(
        state.store,
        state.settings.storage,
        owner=owner_of(request),
        adding=adding,
        conversation_id=None,
        param="items",
    )
    created = await _write(
        "the conversation",
        state.store.conversations.create(
            ids.new_id(ids.CONVERSATION),
            metadata=metadata,
            items=items,
            messages=messages,
            owner=owner_of(request),
            max_stored_bytes=state.settings.storage.max_stored_bytes_per_key,
            model=model.id if model is not None else None,
        ),
    )
    return conversation_resource(created)


@router.get("/{conversation_id}", operation_id=RETRIEVE_CONVERSATION, response_model=ConversationResource)
async def retrieve_conversation(conversation_id: str, request: Request, state: State) -> dict[str, Any]:
    conversation = await state.store.conversations.get(conversation_id, owner=owner_of(request))
    if conversation is None:
        raise not_found("conversation", conversation_id)
    return conversation_resource(conversation)


@router.post(
    "/{conversation_id}",
    operation_id="updateConversation",
    openapi_extra=UPDATE_CONVERSATION_REQUEST,
    response_model=ConversationResource,
)
async def update_conversation(conversation_id: str, request: Request, state: State) -> dict[str, Any]:
    with state.body_budget.hold() as hold:
        body = await read_json(request, limits=state.settings.limits, hold=hold)
    if not isinstance(body, dict):
        raise APIError(400, "The request body must be a JSON object.", code="invalid_type")
    parse_as(UPDATE_CONVERSATION, body, "")
    _check_disk(state, "the conversation")
    metadata = parse_metadata(body.get("metadata"))
    updated = await _write(
        "the conversation",
        state.store.conversations.update(conversation_id, metadata=metadata, owner=owner_of(request)),
    )
    if updated is None:
        raise not_found("conversation", conversation_id)
    return conversation_resource(updated)


@router.get("/{conversation_id}/items/{item_id}", operation_id="retrieveConversationItem")
async def retrieve_conversation_item(
    conversation_id: str,
    item_id: str,
    request: Request,
    state: State,
    include: Annotated[list[IncludeValue] | None, Query(alias="include[]")] = None,
) -> dict[str, Any]:
    stored = await state.store.conversations.get_item(conversation_id, item_id, owner=owner_of(request))
    if stored is None:
        raise not_found("conversation item", item_id)
    return typed_item(stored)


@router.delete(
    "/{conversation_id}/items/{item_id}",
    operation_id="deleteConversationItem",
    response_model=ConversationResource,
)
async def delete_conversation_item(
    conversation_id: str, item_id: str, request: Request, state: State
) -> dict[str, Any]:
    owner = owner_of(request)
    deleted = await state.store.conversations.delete_item(conversation_id, item_id, owner=owner)
    if not deleted:
        raise not_found("conversation item", item_id)
    conversation = await state.store.conversations.get(conversation_id, owner=owner)
    if conversation is None:
        raise not_found("conversation", conversation_id)
    # OpenAI answers with the conversation the item was removed from.
    return conversation_resource(conversation)


@router.delete("/{conversation_id}", operation_id=DELETE_CONVERSATION, response_model=DeletedObject)
async def delete_conversation(conversation_id: str, request: Request, state: State) -> dict[str, Any]:
    deleted = await state.store.conversations.delete(conversation_id, owner=owner_of(request))
    if not deleted:
        raise not_found("conversation", conversation_id)
    return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}


@router.get("/{conversation_id}/items", operation_id=LIST_CONVERSATION_ITEMS, response_model=ItemList)
async def list_conversation_items(
    conversation_id: str, request: Request, state: State, query: Annotated[PageQuery, Depends(page_query)]
) -> dict[str, Any]:
    owner = owner_of(request)
    fetch = state.store.conversations.list_items
    return await item_page(fetch, "conversation", conversation_id, owner, query, listed=typed_item)


@router.post(
    "/{conversation_id}/items",
    operation_id=ADD_CONVERSATION_ITEMS,
    openapi_extra=ADD_CONVERSATION_ITEMS_REQUEST,
    response_model=ItemList,
)
async def add_conversation_items(conversation_id: str, request: Request, state: State) -> dict[str, Any]:
    with state.body_budget.hold() as hold:
        body = await read_json(request, limits=state.settings.limits, hold=hold)
        return await _add_conversation_items(conversation_id, body, request, state)


async def _add_conversation_items(
    conversation_id: str, body: Any, request: Request, state: FacadeState
) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise APIError(400, "The request body must be a JSON object.", code="invalid_type")
    parse_as(ADD_CONVERSATION_ITEMS_BODY, body, "")
    _check_disk(state, "the items")
    conversation = await state.store.conversations.get(conversation_id, owner=owner_of(request))
    if conversation is None:
        raise not_found("conversation", conversation_id)
    items, messages = await _checked_items(
        body.get("items"), state, request, required=True, model=await _model_of(conversation, state)
    )
    await check_room(
        state.store,
        state.settings.storage,
        owner=owner_of(request),
        adding=stored_size(items, messages),
        conversation_id=conversation_id,
        param="items",
    )
    added = await _write(
        "the items",
        state.store.conversations.append(
            conversation_id,
            items,
            messages=messages,
            owner=owner_of(request),
            max_stored_bytes=state.settings.storage.max_stored_bytes_per_key,
        ),
    )
    if not added:
        raise not_found("conversation", conversation_id)
    return item_list_of(items)


def _check_disk(state: FacadeState, what: str) -> None:
    """507 before anything is translated or written when the store's disk is short of space
    (disk_space.py); a write that still finds it full rolls back and is the same 507."""
    if state.disk is not None:
        state.disk.check(what)


async def _write(what: str, write: Awaitable[T]) -> T:
    """A store write: past the owner's quota a 429, on a full disk a 507 (the transaction rolled
    back: nothing of it is stored)."""
    try:
        return await write
    except StorageQuotaExceededError as error:
        raise quota_exceeded(error.used, error.quota, error.adding) from None
    except OutOfSpaceError:
        raise insufficient_storage(what) from None


def conversation_resource(conversation: ConversationRecord) -> dict[str, Any]:
    """A stored conversation as the API answers it (`ConversationResource`): `model` only once
    it has one."""
    resource: dict[str, Any] = {
        "id": conversation.id,
        "object": "conversation",
        "created_at": conversation.created_at,
        "metadata": conversation.metadata,
    }
    if conversation.model is not None:
        resource["model"] = conversation.model
    return resource


def item_list_of(items: list[StoredItem]) -> dict[str, Any]:
    return item_list(ItemPage(items=items, has_more=False), typed_item)


async def _model_of(conversation: ConversationRecord, state: FacadeState) -> ResolvedModel | None:
    """The conversation's model while it is still served (None: the default's limits apply)."""
    remembered = conversation.model
    if remembered is not None and state.models.pool_named(remembered) is not None:
        return await state.models.resolve(remembered)
    return None


async def _checked_items(
    value: object,
    state: FacadeState,
    request: Request,
    *,
    required: bool,
    model: ResolvedModel | None = None,
) -> tuple[list[StoredItem], list[pb.Message]]:
    """Items validated by the translation (the same rules as a response's `input`), as they
    are stored, and the raw contract messages they were translated to; checked against the
    limits of `model` (the conversation's), else the default model's."""
    if value is None and not required:
        return [], []
    if not isinstance(value, list) or (required and not value):
        raise APIError(400, "Invalid value for 'items': expected a non-empty array of items.", param="items")
    if not value:
        return [], []
    if model is None:
        model = await state.models.resolve(None)
    limits, info = model.limits, model.info
    check_reference_count(value, limits.max_item_references, param="items")
    allowed_images = images_per_request(info, limits)
    owner = owner_of(request)
    references = ItemReferences(
        lambda item_id: state.store.responses.find_item(item_id, owner=owner),
        param="items",
        max_bytes=limits.max_request_bytes,
    )
    await references.resolve_all(value)
    image_source, clip_source = state.responses.media_sources()
    try:
        messages = await state.responses.run_translation(
            input_to_messages,
            value,
            resolve_item=references,
            image_source=image_source,
            clip_source=clip_source,
            image_limits=image_limits(info, limits),
            file_source=state.responses.file_source(owner),
            document_limits=state.responses.document_limits(allowed_images, model.files),
            max_images=allowed_images,
        )
    except InvalidRequestError as error:
        param = "items" + error.param.removeprefix("input") if error.param else None
        message = error.message.replace("'input", "'items")
        raise APIError(error.status, message, param=param, code=error.code) from None
    return references.stored_items(value), messages

"""Conversations complete (issue 14.3): metadata update, item retrieve and delete, items listed
the way OpenAI lists them, `include` checked; the openai SDK and openai-agents'
OpenAIConversationsSession (pop_item) against the scripted engine."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.facade.both_stores import on_both_store_backends  # noqa: F401
from tests.facade.fake_engine import FakeEngine
from vlmserve.engine.v1 import engine_pb2 as pb


async def new_conversation(http: httpx.AsyncClient, items: list[dict[str, Any]]) -> str:
    created = await http.post("/v1/conversations", json={"items": items})
    assert created.status_code == 200, created.text
    return str(created.json()["id"])


async def test_items_are_listed_normalized(http: httpx.AsyncClient) -> None:
    conversation = await new_conversation(
        http,
        [
            {"role": "user", "content": "hello"},
            {"type": "message", "role": "assistant", "content": "hi there"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "again"}]},
        ],
    )
    listed = (await http.get(f"/v1/conversations/{conversation}/items", params={"order": "asc"})).json()
    first, second, third = listed["data"]
    assert first["type"] == "message" and first["status"] == "completed"
    assert first["content"] == [{"type": "input_text", "text": "hello"}]
    assert second["content"] == [{"type": "output_text", "text": "hi there", "annotations": []}]
    assert third["content"] == [{"type": "input_text", "text": "again"}]
    # The same shape from retrieve.
    retrieved = await http.get(f"/v1/conversations/{conversation}/items/{first['id']}")
    assert retrieved.status_code == 200
    assert retrieved.json() == first


async def test_update_metadata(http: httpx.AsyncClient) -> None:
    conversation = await new_conversation(http, [])
    updated = await http.post(f"/v1/conversations/{conversation}", json={"metadata": {"topic": "squares"}})
    assert updated.status_code == 200, updated.text
    assert updated.json()["metadata"] == {"topic": "squares"}
    assert (await http.get(f"/v1/conversations/{conversation}")).json()["metadata"] == {"topic": "squares"}
    bad = await http.post(f"/v1/conversations/{conversation}", json={"metadata": {"k": 1}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "metadata"
    missing = await http.post("/v1/conversations/conv_nope", json={"metadata": {}})
    assert missing.status_code == 404


async def test_a_deleted_item_is_gone_and_no_longer_replayed(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    conversation = await new_conversation(
        http, [{"role": "user", "content": "keep me"}, {"role": "user", "content": "forget me"}]
    )
    listed = (await http.get(f"/v1/conversations/{conversation}/items", params={"order": "asc"})).json()
    forget = listed["data"][1]["id"]
    deleted = await http.delete(f"/v1/conversations/{conversation}/items/{forget}")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json()["id"] == conversation and deleted.json()["object"] == "conversation"
    assert (await http.get(f"/v1/conversations/{conversation}/items/{forget}")).status_code == 404
    assert (await http.delete(f"/v1/conversations/{conversation}/items/{forget}")).status_code == 404
    answer = await http.post(
        "/v1/responses", json={"model": "default", "input": "next", "conversation": conversation}
    )
    assert answer.status_code == 200, answer.text
    texts = [part.text.text for message in engine.requests[0].messages for part in message.parts]
    assert texts == ["keep me", "next"]
    assert [m.role for m in engine.requests[0].messages] == [pb.ROLE_USER, pb.ROLE_USER]
    # Items added after a deletion get fresh positions (no clash with the gap).
    added = await http.post(
        f"/v1/conversations/{conversation}/items", json={"items": [{"role": "user", "content": "x"}]}
    )
    assert added.status_code == 200, added.text
    listed = (await http.get(f"/v1/conversations/{conversation}/items", params={"order": "asc"})).json()
    assert [item["content"][0]["text"] for item in listed["data"]] == [
        "keep me",
        "next",
        "Hello, world.",
        "x",
    ]


async def test_include_on_list_is_checked(http: httpx.AsyncClient) -> None:
    conversation = await new_conversation(http, [{"role": "user", "content": "a"}])
    ok = await http.get(
        f"/v1/conversations/{conversation}/items", params={"include[]": ["message.input_image.image_url"]}
    )
    assert ok.status_code == 200
    bad = await http.get(f"/v1/conversations/{conversation}/items", params={"include[]": ["everything"]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "include[0]"


async def test_sdk_item_retrieve_delete_and_update(sdk: openai.AsyncOpenAI) -> None:
    conversation = await sdk.conversations.create(items=[{"role": "user", "content": "hello"}])
    items = [item async for item in sdk.conversations.items.list(conversation.id)]
    (item,) = items
    assert item.type == "message"
    retrieved = await sdk.conversations.items.retrieve(item.id, conversation_id=conversation.id)
    assert retrieved.id == item.id
    updated = await sdk.conversations.update(conversation.id, metadata={"a": "b"})
    assert updated.metadata == {"a": "b"}
    after = await sdk.conversations.items.delete(item.id, conversation_id=conversation.id)
    assert after.id == conversation.id
    assert [item async for item in sdk.conversations.items.list(conversation.id)] == []


async def test_openai_agents_session_pop_item(sdk: openai.AsyncOpenAI) -> None:
    memory = pytest.importorskip("agents.memory.openai_conversations_session")
    session = memory.OpenAIConversationsSession(openai_client=sdk)
    await session.add_items(
        [{"role": "user", "content": "first"}, {"role": "assistant", "content": "second"}]
    )
    popped = await session.pop_item()
    assert popped is not None and popped["role"] == "assistant"
    remaining = await session.get_items()
    assert [entry["role"] for entry in remaining] == ["user"]
    await session.clear_session()

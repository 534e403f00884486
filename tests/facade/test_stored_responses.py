"""Stored responses: retrieve, delete, input_items, replay through previous_response_id and conversations."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.facade.both_stores import on_both_store_backends  # noqa: F401
from tests.facade.fake_engine import FakeEngine
from tests.facade.helpers import (
    SCREENSHOT_TOOL,
    assert_valid,
    in_process,
    png_data_url,
    screenshot_tool_input,
)
from vlmserve.client import AsyncEngineClient
from vlmserve.engine.prep.lowering import lower_messages
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade import FacadeSettings, create_app
from vlmserve.facade.store.repositories import Store


async def create(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await http.post("/v1/responses", json={"model": "default", **body})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


async def test_retrieve_returns_the_stored_resource(http: httpx.AsyncClient) -> None:
    created = await create(http, input="hi", metadata={"k": "v"})
    retrieved = await http.get(f"/v1/responses/{created['id']}")
    assert retrieved.status_code == 200
    assert retrieved.json() == created
    assert_valid(retrieved.json(), "ResponseResource")


async def test_store_false_is_not_retrievable(http: httpx.AsyncClient) -> None:
    created = await create(http, input="hi", store=False)
    assert (await http.get(f"/v1/responses/{created['id']}")).status_code == 404
    assert (await http.get(f"/v1/responses/{created['id']}/input_items")).status_code == 404


async def test_delete_then_everything_is_404(http: httpx.AsyncClient) -> None:
    created = await create(http, input="hi")
    deleted = await http.delete(f"/v1/responses/{created['id']}")
    assert deleted.status_code == 200
    assert deleted.json() == {"id": created["id"], "object": "response", "deleted": True}
    for response in (
        await http.get(f"/v1/responses/{created['id']}"),
        await http.delete(f"/v1/responses/{created['id']}"),
        await http.get(f"/v1/responses/{created['id']}/input_items"),
    ):
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    ("path", "param"),
    [("/v1/responses/resp_unknown", None), ("/v1/responses/resp_unknown/input_items", None)],
)
async def test_unknown_ids_are_404(http: httpx.AsyncClient, path: str, param: str | None) -> None:
    response = await http.get(path)
    assert response.status_code == 404
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("conversation", "conv_unknown"),
        ("conversation", {"id": "conv_x"}),
    ],
)
async def test_unknown_continuation_ids_are_404(
    http: httpx.AsyncClient, engine: FakeEngine, field: str, value: Any
) -> None:
    response = await http.post("/v1/responses", json={"model": "default", "input": "hi", field: value})
    assert response.status_code == 404
    assert response.json()["error"]["param"] == field
    assert engine.requests == []


async def test_input_items_keep_raw_items_images_and_detail(http: httpx.AsyncClient) -> None:
    """Seed 003: image-only tool output, image + unsupported part, custom tool output with image."""
    red, blue, green = png_data_url((255, 0, 0)), png_data_url((0, 0, 255)), png_data_url((0, 255, 0))
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "look"}]},
        {"type": "function_call", "call_id": "c1", "name": "view_image", "arguments": "{}"},
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [{"type": "input_image", "image_url": red}],
        },
        {"type": "function_call", "call_id": "c2", "name": "view_image", "arguments": "{}"},
        {
            "type": "function_call_output",
            "call_id": "c2",
            "output": [
                {"type": "input_text", "text": "two"},
                {"type": "foo", "data": "x"},
                {"type": "input_image", "image_url": blue, "detail": "low"},
            ],
        },
        {"type": "custom_tool_call", "call_id": "c3", "name": "shot", "input": "go"},
        {
            "type": "custom_tool_call_output",
            "call_id": "c3",
            "output": [{"type": "input_image", "image_url": green}],
        },
    ]
    tools = [
        {"type": "function", "name": "view_image", "parameters": {"type": "object"}},
        {"type": "custom", "name": "shot"},
    ]
    created = await create(http, input=items, tools=tools)
    listed = (await http.get(f"/v1/responses/{created['id']}/input_items?order=asc&limit=100")).json()
    data = listed["data"]
    assert [item["type"] for item in data] == [item["type"] for item in items]
    assert data[2]["output"] == [{"type": "input_image", "image_url": red, "detail": "auto"}]
    assert data[4]["output"] == [
        {"type": "input_text", "text": "two"},
        {"type": "foo", "data": "x"},
        {"type": "input_image", "image_url": blue, "detail": "low"},
    ]
    assert data[6]["output"] == [{"type": "input_image", "image_url": green, "detail": "auto"}]
    assert all(isinstance(item["id"], str) and item["id"] for item in data)


async def test_input_items_list_messages_typed(http: httpx.AsyncClient) -> None:
    """As OpenAI lists them (and as conversation items are): a message has `type`, `status` and
    typed content parts, whatever shorthand the request used."""
    created = await create(
        http,
        input=[
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hi there"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "again"}]},
        ],
    )
    listed = (await http.get(f"/v1/responses/{created['id']}/input_items", params={"order": "asc"})).json()
    first, second, third = listed["data"]
    assert [(i["type"], i["status"]) for i in listed["data"]] == [("message", "completed")] * 3
    assert first["content"] == [{"type": "input_text", "text": "hello"}]
    assert second["content"] == [{"type": "output_text", "text": "hi there", "annotations": []}]
    assert third["content"] == [{"type": "input_text", "text": "again"}]


async def test_input_items_paging(http: httpx.AsyncClient) -> None:
    items = [{"type": "message", "id": f"msg_{i}", "role": "user", "content": f"m{i}"} for i in range(5)]
    created = await create(http, input=items)
    url = f"/v1/responses/{created['id']}/input_items"

    default = (await http.get(url)).json()
    assert default["object"] == "list"
    assert [item["id"] for item in default["data"]] == ["msg_4", "msg_3", "msg_2", "msg_1", "msg_0"]
    assert (default["first_id"], default["last_id"], default["has_more"]) == ("msg_4", "msg_0", False)

    first = (await http.get(url, params={"order": "asc", "limit": 2})).json()
    assert [item["id"] for item in first["data"]] == ["msg_0", "msg_1"] and first["has_more"] is True
    second = (await http.get(url, params={"order": "asc", "limit": 2, "after": first["last_id"]})).json()
    assert [item["id"] for item in second["data"]] == ["msg_2", "msg_3"] and second["has_more"] is True
    last = (await http.get(url, params={"order": "asc", "limit": 2, "after": second["last_id"]})).json()
    assert [item["id"] for item in last["data"]] == ["msg_4"] and last["has_more"] is False

    unknown = await http.get(url, params={"after": "msg_nope"})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "after"
    assert (await http.get("/v1/responses/resp_nope/input_items")).status_code == 404


async def test_stored_response_with_image_tool_output_replays_identically(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    first = await create(
        http, input=screenshot_tool_input(png_data_url((255, 0, 0))), tools=[SCREENSHOT_TOOL]
    )
    second = await create(http, input="And now?", previous_response_id=first["id"], tools=[SCREENSHOT_TOOL])
    assert second["previous_response_id"] == first["id"]
    original, replayed = engine.requests
    # The replayed turn starts with exactly the messages the engine saw the first time...
    assert list(replayed.messages[: len(original.messages)]) == list(original.messages)
    # ...then the first answer, then the new input.
    rest = replayed.messages[len(original.messages) :]
    assert [m.role for m in rest] == [pb.ROLE_ASSISTANT, pb.ROLE_USER]
    assert rest[0].parts[0].text.text == "Hello, world."
    assert rest[1].parts[0].text.text == "And now?"


async def test_chain_of_three_replays_every_turn(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    one = await create(http, input="one")
    two = await create(http, input="two", previous_response_id=one["id"])
    await create(http, input="three", previous_response_id=two["id"])
    texts = [m.parts[0].text.text for m in engine.requests[-1].messages]
    assert texts == ["one", "Hello, world.", "two", "Hello, world.", "three"]


async def test_function_call_output_continues_a_stored_call(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.script.text_chunks = []
    engine.script.tool_calls = [pb.ToolCall(id="call_9", name="screenshot", arguments="{}")]
    first = await create(http, input="screenshot please", tools=[SCREENSHOT_TOOL])
    engine.script.tool_calls = []
    engine.script.text_chunks = ["Red."]
    output = [{"type": "input_image", "image_url": png_data_url((255, 0, 0))}]
    second = await create(
        http,
        previous_response_id=first["id"],
        tools=[SCREENSHOT_TOOL],
        input=[{"type": "function_call_output", "call_id": "call_9", "output": output}],
    )
    assert second["output"][0]["content"][0]["text"] == "Red."
    roles = [m.role for m in lower_messages(engine.requests[-1].messages)]  # as the engine renders them
    assert roles == [pb.ROLE_USER, pb.ROLE_ASSISTANT, pb.ROLE_TOOL, pb.ROLE_USER]
    assert engine.requests[-1].messages[1].tool_calls[0].id == "call_9"


async def test_conversation_accumulates_items(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    created = await http.post("/v1/conversations", json={"metadata": {"topic": "colours"}})
    assert created.status_code == 200
    conversation = created.json()
    assert conversation["object"] == "conversation" and conversation["id"].startswith("conv_")

    first = await create(http, input="one", conversation=conversation["id"])
    assert first["conversation"] == {"id": conversation["id"]}
    await create(http, input="two", conversation={"id": conversation["id"]})
    texts = [m.parts[0].text.text for m in engine.requests[-1].messages]
    assert texts == ["one", "Hello, world.", "two"]

    items = (await http.get(f"/v1/conversations/{conversation['id']}/items", params={"order": "asc"})).json()
    assert [item["type"] for item in items["data"]] == ["message"] * 4
    assert (await http.get(f"/v1/conversations/{conversation['id']}")).json()["metadata"] == {
        "topic": "colours"
    }
    deleted = await http.delete(f"/v1/conversations/{conversation['id']}")
    assert deleted.json()["deleted"] is True
    assert (await http.get(f"/v1/conversations/{conversation['id']}")).status_code == 404


async def test_conversation_created_with_items(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    image = png_data_url((0, 0, 255))
    items = [{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": image}]}]
    conversation = (await http.post("/v1/conversations", json={"items": items})).json()
    await create(http, input="what colour?", conversation=conversation["id"])
    first_turn = engine.requests[0].messages[0]
    assert first_turn.parts[0].WhichOneof("kind") == "image"


async def test_conversation_items_are_validated(http: httpx.AsyncClient) -> None:
    bad = [
        {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "file:///x"}]}
    ]
    response = await http.post("/v1/conversations", json={"items": bad})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "items[0].content[0].image_url"


async def test_previous_response_and_conversation_together_is_400(http: httpx.AsyncClient) -> None:
    first = await create(http, input="one")
    conversation = (await http.post("/v1/conversations", json={})).json()
    response = await http.post(
        "/v1/responses",
        json={"input": "x", "previous_response_id": first["id"], "conversation": conversation["id"]},
    )
    assert response.status_code == 400


async def test_item_reference_resolves_a_stored_item(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    await create(
        http, input=[{"type": "message", "id": "msg_kept", "role": "user", "content": "remember me"}]
    )
    await create(
        http, input=[{"type": "item_reference", "id": "msg_kept"}, {"role": "user", "content": "ok"}]
    )
    assert engine.requests[-1].messages[0].parts[0].text.text == "remember me"


async def test_stored_responses_survive_a_restart(
    settings: FacadeSettings,
    engine_client: AsyncEngineClient,
    engine: FakeEngine,
    another_store: Callable[[], Store],
) -> None:
    async def client_for(app: FastAPI) -> httpx.AsyncClient:
        return in_process(app)

    store = another_store()
    async with await client_for(create_app(settings, engine=engine_client, store=store)) as http:
        first = await create(http, input=screenshot_tool_input(png_data_url()), tools=[SCREENSHOT_TOOL])
        items_before = (await http.get(f"/v1/responses/{first['id']}/input_items")).json()
    store.close()

    reopened = another_store()
    async with await client_for(create_app(settings, engine=engine_client, store=reopened)) as http:
        assert (await http.get(f"/v1/responses/{first['id']}")).json() == first
        assert (await http.get(f"/v1/responses/{first['id']}/input_items")).json() == items_before
        await create(http, input="again", previous_response_id=first["id"], tools=[SCREENSHOT_TOOL])
    original, replayed = engine.requests
    assert list(replayed.messages[: len(original.messages)]) == list(original.messages)

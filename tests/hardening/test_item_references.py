"""`item_reference` and image counting (docs/hardening.md, "Stored data").

* A reference is stored as the item it points to: reusing it, or replaying the response that
  used it, keeps working (13.7).
* References cannot amplify a small body: each id is resolved once, the images and bytes it
  brings are counted before any image is decoded, and references per request are capped; the
  same holds for conversation items (13.2).
* `image_url` alias parts count like `input_image` parts, everywhere (13.3).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.facade.fake_engine import FakeEngine
from tests.facade.helpers import MakeClient, count_image_checks, png_data_url
from vlmserve.facade import Store


@pytest.fixture
def http(client_for: MakeClient) -> httpx.AsyncClient:
    """A client of an app with the default limits."""
    return client_for()


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per image the translation checks (reads the header of)."""
    return count_image_checks(monkeypatch)


@pytest.fixture
def lookups(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every id the store is asked to resolve."""
    asked: list[str] = []
    original = store.responses.find_item

    async def find_item(item_id: str, **kwargs: Any) -> Any:
        asked.append(item_id)
        return await original(item_id, **kwargs)

    monkeypatch.setattr(store.responses, "find_item", find_item)
    return asked


def error_of(reply: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    error: dict[str, Any] = reply.json()["error"]
    return error


def image_message(count: int, *, alias: bool = False, item_id: str | None = None) -> dict[str, Any]:
    if alias:
        content = [
            {"type": "image_url", "image_url": {"url": png_data_url(size=(8, 8))}} for _ in range(count)
        ]
    else:
        content = [{"type": "input_image", "image_url": png_data_url(size=(8, 8))} for _ in range(count)]
    message: dict[str, Any] = {"type": "message", "role": "user", "content": content}
    if item_id is not None:
        message["id"] = item_id
    return message


def ref(item_id: str) -> dict[str, str]:
    return {"type": "item_reference", "id": item_id}


async def respond(http: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await http.post("/v1/responses", json={"model": "default", **body})


# ---- 13.7: a reference keeps working -------------------------------------------------------------


async def test_a_reference_can_be_used_again_and_replayed(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    first = (await respond(http, input="hi")).json()
    answer_id = first["output"][0]["id"]
    second = await respond(http, input=[ref(answer_id), {"role": "user", "content": "and?"}])
    assert second.status_code == 200, second.text
    # Used again, and the response that used it replayed: both resolve to the answer itself.
    third = await respond(http, input=[ref(answer_id), {"role": "user", "content": "again"}])
    assert third.status_code == 200, third.text
    replay = await respond(http, previous_response_id=second.json()["id"], input="go on")
    assert replay.status_code == 200, replay.text
    answer_text = first["output"][0]["content"][0]["text"]
    for request in engine.requests[1:]:
        assert request.messages[0].parts[0].text.text == answer_text
    # The reference is listed as the item it resolved to, under that item's id.
    listed = (await http.get(f"/v1/responses/{second.json()['id']}/input_items?order=asc")).json()
    assert listed["data"][0]["id"] == answer_id
    assert listed["data"][0]["type"] == "message"
    assert listed["data"][0]["content"] == first["output"][0]["content"]


async def test_conversation_items_store_what_a_reference_resolved_to(http: httpx.AsyncClient) -> None:
    kept = (await respond(http, input=[{"id": "msg_kept", "role": "user", "content": "kept"}])).json()
    assert kept["status"] == "completed"
    conversation = (await http.post("/v1/conversations", json={"items": [ref("msg_kept")]})).json()
    items = (await http.get(f"/v1/conversations/{conversation['id']}/items")).json()["data"]
    shown = [(item["id"], item["role"], item["content"]) for item in items]
    # Listed as OpenAI lists conversation items: content as typed parts.
    assert shown == [("msg_kept", "user", [{"type": "input_text", "text": "kept"}])]
    reused = await respond(http, conversation=conversation["id"], input=[ref("msg_kept")])
    assert reused.status_code == 200, reused.text


# ---- 13.2: no amplification ---------------------------------------------------------------------


async def test_many_references_to_an_item_with_images_stop_before_decoding(
    http: httpx.AsyncClient, decoded: list[int], lookups: list[str]
) -> None:
    stored = await respond(http, input=[image_message(16, item_id="msg_sixteen")])
    assert stored.status_code == 200, stored.text
    decoded.clear()
    body = [ref("msg_sixteen")] * 60
    error = error_of(await respond(http, input=body))
    assert (error["code"], error["param"]) == ("too_many_images", "input")
    # Resolved once; its 16 images counted per use, so the second use is refused before decoding.
    assert lookups == ["msg_sixteen"]
    assert len(decoded) <= 16


async def test_references_add_to_the_images_of_the_input(http: httpx.AsyncClient, decoded: list[int]) -> None:
    assert (await respond(http, input=[image_message(10, item_id="msg_ten")])).status_code == 200
    decoded.clear()
    error = error_of(await respond(http, input=[image_message(10), ref("msg_ten")]))
    assert (error["code"], error["param"]) == ("too_many_images", "input")
    assert decoded == []


async def test_conversation_items_cannot_amplify_either(http: httpx.AsyncClient, decoded: list[int]) -> None:
    assert (await respond(http, input=[image_message(16, item_id="msg_sixteen")])).status_code == 200
    conversation = (await http.post("/v1/conversations", json={})).json()["id"]
    decoded.clear()
    added = await http.post(
        f"/v1/conversations/{conversation}/items", json={"items": [ref("msg_sixteen")] * 60}
    )
    error = error_of(added)
    assert (error["code"], error["param"]) == ("too_many_images", "items")
    assert len(decoded) <= 16
    created = await http.post("/v1/conversations", json={"items": [ref("msg_sixteen")] * 2})
    assert error_of(created)["code"] == "too_many_images"
    listed = (await http.get(f"/v1/conversations/{conversation}/items")).json()
    assert listed["data"] == []


async def test_references_per_request_are_capped(client_for: MakeClient, lookups: list[str]) -> None:
    http = client_for(max_item_references=4)
    assert (await respond(http, input=[{"id": "msg_t", "role": "user", "content": "t"}])).status_code == 200
    assert (await respond(http, input=[ref("msg_t")] * 4)).status_code == 200
    lookups.clear()
    error = error_of(await respond(http, input=[ref("msg_t")] * 5))
    assert (error["param"], error["code"]) == ("input", "too_many_item_references")
    assert lookups == []
    added = await http.post("/v1/conversations", json={"items": [ref("msg_t")] * 5})
    assert error_of(added)["param"] == "items"


async def test_referenced_bytes_count_against_the_body_limit(client_for: MakeClient) -> None:
    http = client_for(max_request_bytes=4000)
    text = "x" * 1500
    assert (
        await respond(http, input=[{"id": "msg_big", "role": "user", "content": text}])
    ).status_code == 200
    assert (await respond(http, input=[ref("msg_big")] * 2)).status_code == 200
    error = error_of(await respond(http, input=[ref("msg_big")] * 3))
    assert (error["param"], error["code"]) == ("input", "item_references_too_large")


# ---- 13.3: image_url aliases count like input_image ------------------------------------------------


@pytest.mark.parametrize("alias", [False, True])
async def test_every_image_form_counts_before_decoding(
    http: httpx.AsyncClient, decoded: list[int], alias: bool
) -> None:
    error = error_of(await respond(http, input=[image_message(17, alias=alias)]))
    assert (error["code"], error["param"]) == ("too_many_images", "input")
    conversation = await http.post("/v1/conversations", json={"items": [image_message(17, alias=alias)]})
    assert error_of(conversation)["code"] == "too_many_images"
    assert decoded == []


async def test_images_in_tool_outputs_of_conversation_items_count(http: httpx.AsyncClient) -> None:
    output = [{"type": "image_url", "image_url": png_data_url(size=(8, 8))} for _ in range(17)]
    items = [
        {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": output},
    ]
    error = error_of(await http.post("/v1/conversations", json={"items": items}))
    assert (error["code"], error["param"]) == ("too_many_images", "items")

"""Stored responses and conversations belong to the API key that created them: another key gets
404 (not 403: existence is not revealed) everywhere, and the owner keeps full access."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.facade.fake_engine import FakeEngine, Script
from tests.facade.helpers import in_process, owner_id
from vlmserve.client import AsyncEngineClient
from vlmserve.facade import FacadeSettings, Store, create_app
from vlmserve.facade.cli import settings_from_args
from vlmserve.facade.settings.api_keys import ApiKeys

ALICE = "sk-alice-0123456789abcdef"
BOB = "sk-bob-fedcba9876543210xx"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
async def http(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store
) -> AsyncIterator[httpx.AsyncClient]:
    keyed = settings.replace(api_keys=ApiKeys.from_keys([ALICE, BOB]))
    app = create_app(keyed, engine=engine_client, store=store)
    async with in_process(app) as client:
        yield client


async def test_another_keys_response_is_not_found_everywhere(http: httpx.AsyncClient) -> None:
    created = await http.post("/v1/responses", json={"input": "hi"}, headers=bearer(ALICE))
    assert created.status_code == 200, created.text
    response_id = created.json()["id"]
    path = f"/v1/responses/{response_id}"
    for reply in (
        await http.get(path, headers=bearer(BOB)),
        await http.get(f"{path}/input_items", headers=bearer(BOB)),
        await http.post(f"{path}/cancel", headers=bearer(BOB)),
        await http.delete(path, headers=bearer(BOB)),
    ):
        assert reply.status_code == 404, reply.text
        assert response_id in reply.json()["error"]["message"]
    # Continuing Alice's response reads exactly as continuing an unknown one (OpenAI's
    # previous_response_not_found), so Bob learns nothing of it.
    for route in ("/v1/responses", "/v1/responses/input_tokens"):
        foreign = await http.post(
            route, json={"input": "more", "previous_response_id": response_id}, headers=bearer(BOB)
        )
        unknown = await http.post(
            route, json={"input": "more", "previous_response_id": "resp_unknown"}, headers=bearer(BOB)
        )
        assert foreign.status_code == unknown.status_code, (foreign.text, unknown.text)
        assert foreign.status_code == 400, foreign.text
        assert foreign.json()["error"]["code"] == "previous_response_not_found"
        assert foreign.json()["error"]["code"] == unknown.json()["error"]["code"]
        assert response_id in foreign.json()["error"]["message"]
    # Bob's delete deleted nothing: Alice still has everything.
    assert (await http.get(path, headers=bearer(ALICE))).json()["id"] == response_id
    assert (await http.get(f"{path}/input_items", headers=bearer(ALICE))).json()["data"]
    follow_up = await http.post(
        "/v1/responses", json={"input": "more", "previous_response_id": response_id}, headers=bearer(ALICE)
    )
    assert follow_up.status_code == 200, follow_up.text
    assert (await http.delete(path, headers=bearer(ALICE))).json()["deleted"] is True


async def test_another_keys_conversation_is_not_found_everywhere(http: httpx.AsyncClient) -> None:
    created = await http.post("/v1/conversations", json={}, headers=bearer(ALICE))
    conversation_id = created.json()["id"]
    path = f"/v1/conversations/{conversation_id}"
    item = {"type": "message", "role": "user", "content": "hello"}
    for reply in (
        await http.get(path, headers=bearer(BOB)),
        await http.get(f"{path}/items", headers=bearer(BOB)),
        await http.post(f"{path}/items", json={"items": [item]}, headers=bearer(BOB)),
        await http.delete(path, headers=bearer(BOB)),
        await http.post(
            "/v1/responses", json={"input": "x", "conversation": conversation_id}, headers=bearer(BOB)
        ),
    ):
        assert reply.status_code == 404, reply.text
    assert (await http.get(f"{path}/items", headers=bearer(ALICE))).json()["data"] == []
    reply = await http.post(
        "/v1/responses", json={"input": "x", "conversation": conversation_id}, headers=bearer(ALICE)
    )
    assert reply.status_code == 200, reply.text


async def test_another_key_cannot_cancel_a_running_generation(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.script = Script(text_chunks=["a"], hang=True)
    body = {"input": "hi", "stream": True, "background": True}
    streaming = asyncio.create_task(http.post("/v1/responses", json=body, headers=bearer(ALICE)))
    await asyncio.wait_for(engine.started.wait(), 5)
    response_id = engine.requests[0].request_id
    refused = await http.post(f"/v1/responses/{response_id}/cancel", headers=bearer(BOB))
    assert refused.status_code == 404
    await asyncio.sleep(0.1)
    assert engine.aborts == [] and not streaming.done()  # Bob's cancel never reached the engine
    cancelled = await http.post(f"/v1/responses/{response_id}/cancel", headers=bearer(ALICE))
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    assert engine.aborts == [response_id]
    assert (await asyncio.wait_for(streaming, 5)).status_code == 200


async def test_the_owner_is_the_key_id(http: httpx.AsyncClient, store: Store) -> None:
    created = (await http.post("/v1/responses", json={"input": "hi"}, headers=bearer(ALICE))).json()
    assert await store.responses.get(created["id"], owner=owner_id(ALICE)) is not None
    assert await store.responses.get(created["id"], owner=owner_id(BOB)) is None


def test_keys_come_from_the_environment_and_a_file(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text(f"{BOB}\n", encoding="utf-8")
    from_env = FacadeSettings.from_env({"VLMSERVE_API_KEYS": ALICE})
    assert from_env.api_keys.owner_for_key(ALICE) == owner_id(ALICE)
    both = settings_from_args(["--api-keys-file", str(key_file)], {"VLMSERVE_API_KEYS": ALICE})
    assert both.api_keys.owner_for_key(ALICE) and both.api_keys.owner_for_key(BOB)
    assert ALICE not in repr(both) and BOB not in repr(both)
    assert not FacadeSettings.from_env({}).api_keys.enabled
    empty = tmp_path / "empty"
    empty.write_text("# none yet\n", encoding="utf-8")
    with pytest.raises(SystemExit):
        settings_from_args(["--api-keys-file", str(empty)], {})


def test_the_facade_binds_loopback_by_default() -> None:
    assert settings_from_args([], {}).host == "127.0.0.1"


async def test_each_key_is_its_own_prefix_cache_partition(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    """The engine's prefix cache is partitioned by `partition_key` (one shared slot let
    one key's cached_tokens reveal another key's prompt). The facade sends the owner id: a hash
    of the key, never the key itself; the same key always lands in the same partition."""
    for key in (ALICE, BOB, ALICE):
        reply = await http.post("/v1/responses", json={"input": "same words"}, headers=bearer(key))
        assert reply.status_code == 200, reply.text
    alice, bob, alice_again = (request.partition_key for request in engine.requests)
    assert alice == owner_id(ALICE) and bob == owner_id(BOB) and alice_again == alice
    assert alice != bob and ALICE not in alice and BOB not in bob

"""Each key's share of the engine (issue 26, finding 5): one key made 120 background runs in
2.3 s, all accepted; 40 later failed `engine_overloaded` and the other key got 503 meanwhile.
A key may now have `max_responses_per_key` responses at once (background included; 429 with
Retry-After past it), and the facade's engine calls are handed out fairly between keys."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.facade.fake_engine import FakeEngine, Script
from tests.facade.helpers import in_process
from tests.hardening.test_slow_clients import wait_for
from vlmserve.client import AsyncEngineClient
from vlmserve.facade import FacadeSettings, Limits, Store, create_app
from vlmserve.facade.responses.key_admission import EngineSlots
from vlmserve.facade.settings.api_keys import ApiKeys

KEY_A, KEY_B = "sk-busy", "sk-other"


async def test_a_freed_slot_goes_to_the_waiting_key_holding_the_fewest() -> None:
    slots = EngineSlots(2)
    await slots.acquire("a")
    await slots.acquire("a")
    order: list[str] = []

    async def wanting(owner: str) -> None:
        await slots.acquire(owner)
        order.append(owner)

    # Key a queues three more first; key b's one request comes last.
    waiters = [asyncio.create_task(wanting(owner)) for owner in ("a", "a", "a", "b")]
    await asyncio.sleep(0)
    assert (slots.in_use, slots.waiting) == (2, 4)
    slots.release("a")
    await asyncio.sleep(0)
    assert order == ["b"]  # a holds 1, b holds 0: b goes first
    slots.release("a")
    slots.release("b")
    await asyncio.sleep(0)
    assert order == ["b", "a", "a"]
    # A waiter cancelled while waiting holds nothing and is skipped.
    waiters[2].cancel()
    await asyncio.sleep(0)
    slots.release("a")
    await asyncio.sleep(0)
    assert (slots.in_use, slots.waiting, order) == (1, 0, ["b", "a", "a"])
    slots.release("a")
    assert (slots.in_use, slots.by_owner) == (0, {})
    await asyncio.gather(*waiters, return_exceptions=True)


@pytest.fixture
def keyed(settings: FacadeSettings) -> FacadeSettings:
    return settings.replace(
        api_keys=ApiKeys.from_keys([KEY_A, KEY_B]),
        retry_after_s=3,
        limits=Limits(max_responses_per_key=4, max_engine_calls=3),
    )


def as_key(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def test_one_key_cannot_fill_the_engine_and_the_other_key_goes_first(
    keyed: FacadeSettings, engine_client: AsyncEngineClient, store: Store, engine: FakeEngine
) -> None:
    engine.script = Script(text_chunks=["x"], hang=True, delay_s=0.05)
    app = create_app(keyed, engine=engine_client, store=store)
    body: dict[str, Any] = {"input": "hi", "background": True}
    async with in_process(app) as http:
        replies = [await http.post("/v1/responses", json=body, headers=as_key(KEY_A)) for _ in range(6)]
        # Four accepted (queued), the rest refused before anything was stored or generated.
        assert [reply.status_code for reply in replies] == [200] * 4 + [429] * 2
        refused = replies[-1]
        assert refused.headers["retry-after"] == "3"
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert refused.json()["error"]["type"] == "requests"
        # Three reach the engine (the facade's slots); the fourth waits, queued.
        await wait_for(lambda: len(engine.requests) == 3)
        await asyncio.sleep(0.2)
        assert len(engine.requests) == 3
        waiting = replies[3].json()["id"]
        assert (await http.get(f"/v1/responses/{waiting}", headers=as_key(KEY_A))).json()["status"] in (
            "queued",
            "in_progress",
        )
        # The other key is not refused, and its request is next at the engine, ahead of A's.
        other = await http.post("/v1/responses", json=body, headers=as_key(KEY_B))
        assert other.status_code == 200
        first = replies[0].json()["id"]
        cancelled = await http.post(f"/v1/responses/{first}/cancel", headers=as_key(KEY_A))
        assert cancelled.json()["status"] == "cancelled"
        await wait_for(lambda: len(engine.requests) == 4)
        assert engine.requests[3].request_id == other.json()["id"]
        # Every run cancelled: the counts are back to zero, and A may start again.
        for reply in [*replies[1:4], other]:
            owner = KEY_A if reply is not other else KEY_B
            await http.post(f"/v1/responses/{reply.json()['id']}/cancel", headers=as_key(owner))
        service = app.state.facade.responses
        await wait_for(lambda: service.admission.active == {} and service.slots.in_use == 0)
        assert (await http.post("/v1/responses", json=body, headers=as_key(KEY_A))).status_code == 200


async def test_without_api_keys_there_is_no_per_key_limit(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store, engine: FakeEngine
) -> None:
    app = create_app(
        settings.replace(limits=Limits(max_responses_per_key=1)), engine=engine_client, store=store
    )
    async with in_process(app) as http:
        replies = await asyncio.gather(*(http.post("/v1/responses", json={"input": "hi"}) for _ in range(4)))
    assert [reply.status_code for reply in replies] == [200] * 4


async def test_responses_with_logprobs_have_a_limit_of_their_own(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store, engine: FakeEngine
) -> None:
    """Issue 26.11: top_logprobs=20 costs the facade about 8x the CPU and 33x the bytes per
    token of a plain stream; one key may run `max_logprob_responses_per_key` such at once."""
    engine.script = Script(text_chunks=["x"], hang=True, delay_s=0.05)
    keyed = settings.replace(
        api_keys=ApiKeys.from_keys([KEY_A, KEY_B]),
        limits=Limits(max_responses_per_key=10, max_logprob_responses_per_key=2),
    )
    app = create_app(keyed, engine=engine_client, store=store)
    costly: dict[str, Any] = {
        "input": "hi",
        "background": True,
        "top_logprobs": 20,
        "include": ["message.output_text.logprobs"],
    }
    async with in_process(app) as http:
        replies = [await http.post("/v1/responses", json=costly, headers=as_key(KEY_A)) for _ in range(3)]
        assert [reply.status_code for reply in replies] == [200, 200, 429]
        assert "with logprobs" in replies[2].json()["error"]["message"]
        # Plain runs of the same key, and the other key's costly ones, are not held back.
        plain = await http.post(
            "/v1/responses", json={"input": "hi", "background": True}, headers=as_key(KEY_A)
        )
        other = await http.post("/v1/responses", json=costly, headers=as_key(KEY_B))
        assert (plain.status_code, other.status_code) == (200, 200)
        for reply, key in ((replies[0], KEY_A), (replies[1], KEY_A), (plain, KEY_A), (other, KEY_B)):
            await http.post(f"/v1/responses/{reply.json()['id']}/cancel", headers=as_key(key))
        service = app.state.facade.responses
        await wait_for(lambda: service.admission.with_logprobs == {} and service.admission.active == {})
        assert (await http.post("/v1/responses", json=costly, headers=as_key(KEY_A))).status_code == 200

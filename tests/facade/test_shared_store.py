"""Facades sharing one store (issue 15.2): two app instances, each with its own store object (its
own connections, cache and lease) on one database, on PostgreSQL and on one SQLite file alike.

A response made on one is retrieved and continued on the other; a restarting facade's sweep
leaves a live facade's in-progress responses alone and fails a dead one's; the per-key quota
holds against two writers at once; upkeep runs in one facade at a time; neither facade's replay
cache serves what the other changed."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from tests.facade.both_stores import on_both_store_backends  # noqa: F401
from tests.facade.fake_engine import FakeEngine
from tests.facade.helpers import SCREENSHOT_TOOL, in_process, png_data_url, screenshot_tool_input
from vlmserve.client import AsyncEngineClient
from vlmserve.facade import FacadeSettings, create_app
from vlmserve.facade.app import INTERRUPTED_ERROR
from vlmserve.facade.http.api_keys import ANONYMOUS_OWNER
from vlmserve.facade.store.postgres import PostgresDatabase
from vlmserve.facade.store.records import ResponseRecord, StorageQuotaExceededError, StoredItem
from vlmserve.facade.store.repositories import Store
from vlmserve.responses import input_to_messages

OpenStore = Callable[[], Store]


@asynccontextmanager
async def facade(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store
) -> AsyncIterator[httpx.AsyncClient]:
    """One facade, started (its lifespan: lease, sweep) and stopped around the block."""
    app = create_app(settings, engine=engine_client, store=store)
    async with (
        app.router.lifespan_context(app),
        in_process(app) as http,
    ):
        yield http


async def create(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await http.post("/v1/responses", json={"model": "default", **body})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def in_progress(response_id: str) -> dict[str, Any]:
    # Made now: the upkeep each facade runs as it starts would delete an old one as expired.
    return {"id": response_id, "created_at": int(time.time()), "status": "in_progress", "output": []}


def message(item_id: str, text: str) -> StoredItem:
    return StoredItem(item_id, {"type": "message", "role": "user", "content": text})


async def test_a_response_made_on_one_facade_is_continued_on_the_other(
    settings: FacadeSettings, engine_client: AsyncEngineClient, engine: FakeEngine, another_store: OpenStore
) -> None:
    async with (
        facade(settings, engine_client, another_store()) as first,
        facade(settings, engine_client, another_store()) as second,
    ):
        made = await create(first, input=screenshot_tool_input(png_data_url()), tools=[SCREENSHOT_TOOL])
        assert (await second.get(f"/v1/responses/{made['id']}")).json() == made
        items = (await second.get(f"/v1/responses/{made['id']}/input_items")).json()
        assert items == (await first.get(f"/v1/responses/{made['id']}/input_items")).json()
        continued = await create(second, input="and then?", previous_response_id=made["id"])
        assert continued["previous_response_id"] == made["id"]
        original, replayed = engine.requests
        # The second facade replayed the first's turn (its image included) from the store.
        assert list(replayed.messages[: len(original.messages)]) == list(original.messages)

        conversation = (await first.post("/v1/conversations", json={"items": []})).json()["id"]
        await create(second, input="one", conversation=conversation)
        await create(first, input="two", conversation=conversation)
        listed = (await second.get(f"/v1/conversations/{conversation}/items", params={"order": "asc"})).json()
        texts = [item["content"][0]["text"] for item in listed["data"] if item["role"] == "user"]
        assert texts == ["one", "two"]
        # The third request saw both earlier turns, whichever facade stored them.
        assert len(engine.requests[-1].messages) == 3


async def test_a_restarting_facade_fails_a_dead_facades_responses_not_a_live_ones(
    settings: FacadeSettings, engine_client: AsyncEngineClient, another_store: OpenStore
) -> None:
    live_store, dead_store = another_store(), another_store()
    async with facade(settings, engine_client, live_store) as live:
        # What each has running: the live one renews its lease; the dead one's ran out.
        await live_store.responses.put(ResponseRecord.of(in_progress("resp_live")), [], owner=ANONYMOUS_OWNER)
        await dead_store.leases.start(0.001)
        await dead_store.responses.put(ResponseRecord.of(in_progress("resp_dead")), [], owner=ANONYMOUS_OWNER)
        await asyncio.sleep(0.01)
        async with facade(settings, engine_client, another_store()) as restarted:
            dead = (await restarted.get("/v1/responses/resp_dead")).json()
            assert (dead["status"], dead["error"]) == ("failed", INTERRUPTED_ERROR)
            assert (await restarted.get("/v1/responses/resp_live")).json()["status"] == "in_progress"
        assert (await live.get("/v1/responses/resp_live")).json()["status"] == "in_progress"
    # Stopped cleanly, the live facade released its lease: now its leftovers are swept too.
    assert await another_store().leases.fail_unfinished(INTERRUPTED_ERROR) == ["resp_live"]


async def test_a_lease_not_renewed_expires_and_a_renewed_one_does_not(another_store: OpenStore) -> None:
    alive, sweeper = another_store(), another_store()
    await alive.leases.start(0.2)
    await alive.responses.put(ResponseRecord.of(in_progress("resp_1")), [])
    assert await sweeper.leases.fail_unfinished(INTERRUPTED_ERROR) == []
    for _ in range(3):
        await asyncio.sleep(0.1)
        await alive.leases.renew()
        assert await sweeper.leases.fail_unfinished(INTERRUPTED_ERROR) == []
    await asyncio.sleep(0.3)
    assert await sweeper.leases.fail_unfinished(INTERRUPTED_ERROR) == ["resp_1"]


def test_two_writers_cannot_both_pass_the_quota(another_store: OpenStore) -> None:
    """The quota is checked in the write: of two facades storing at the same moment, where only
    one fits, exactly one succeeds (a check-then-insert would let both through)."""
    stores = [another_store() for _ in range(4)]
    item = [message("m", "x" * 1000)]
    quota = 1500  # room for one response of ~1100 bytes
    start = threading.Barrier(len(stores))
    outcomes: list[str] = []

    def put(index: int) -> None:
        start.wait()
        try:
            resource = {"id": f"resp_{index}", "created_at": 1, "status": "completed", "output": []}
            # Each writer on its own thread and loop: the writes meet in the database.
            asyncio.run(
                stores[index].responses.put(
                    ResponseRecord.of(resource), item, owner="k", max_stored_bytes=quota
                )
            )
            outcomes.append("stored")
        except StorageQuotaExceededError as error:
            assert error.quota == quota
            outcomes.append("refused")

    threads = [threading.Thread(target=put, args=(index,)) for index in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["refused"] * (len(stores) - 1) + ["stored"]
    assert 0 < asyncio.run(stores[0].stored_bytes("k")) <= quota


async def test_a_conversation_changed_on_one_facade_replays_right_on_the_other(
    another_store: OpenStore,
) -> None:
    first, second = another_store(), another_store()
    messages = input_to_messages([{"type": "message", "role": "user", "content": "one"}])
    await first.conversations.create("conv_1", metadata={}, items=[message("a", "one")], messages=messages)
    cached = await first.conversations.replay("conv_1")
    assert cached is not None and len(cached.messages) == 1
    # The other facade removes that item and adds another: same count, a new position.
    assert await second.conversations.delete_item("conv_1", "a")
    other = input_to_messages([{"type": "message", "role": "user", "content": "two"}])
    assert await second.conversations.append("conv_1", [message("b", "two")], messages=other)
    replay = await first.conversations.replay("conv_1")
    assert replay is not None and replay.messages == other


async def test_an_output_finished_on_one_facade_replays_on_the_other(another_store: OpenStore) -> None:
    running, reader = another_store(), another_store()
    asked = input_to_messages([{"type": "message", "role": "user", "content": "q"}])
    await running.responses.put(
        ResponseRecord.of(in_progress("resp_1")), [message("q", "q")], input_messages=asked
    )
    early = await reader.responses.replay("resp_1")
    assert early is not None and early.messages == asked
    answer = input_to_messages([{"type": "message", "role": "assistant", "content": "a"}])
    done = {**in_progress("resp_1"), "status": "completed"}
    await running.responses.finish(ResponseRecord.of(done), output_messages=answer)
    later = await reader.responses.replay("resp_1")
    assert later is not None and later.messages == [*asked, *answer]


async def test_upkeep_runs_in_one_facade_at_a_time(store_backend: str, another_store: OpenStore) -> None:
    if store_backend != "postgresql":
        pytest.skip("SQLite's write transactions are exclusive: there is no turn to take")
    first, second = another_store(), another_store()
    assert isinstance(first.db, PostgresDatabase)
    await first.responses.put(
        ResponseRecord.of({"id": "resp_old", "created_at": 1, "status": "completed", "output": []}), []
    )
    with first.db.upkeep_turn() as mine:
        assert mine
        assert (await second.maintain(expire_before=100)).expired_responses == 0
        assert await second.responses.get("resp_old") is not None
    assert (await second.maintain(expire_before=100)).expired_responses == 1


async def test_connections_the_server_dropped_are_replaced(
    store_backend: str, another_store: OpenStore, request: pytest.FixtureRequest
) -> None:
    """The database restarted or failed over: the pool hands out new connections, no error."""
    if store_backend != "postgresql":
        pytest.skip("PostgreSQL's connection pool")
    import psycopg

    server = request.getfixturevalue("postgres_server")
    store = another_store()
    await store.responses.put(
        ResponseRecord.of(
            {"id": "resp_1", "created_at": int(time.time()), "status": "completed", "output": []}
        ),
        [],
    )
    ((database,),) = store.db.query("SELECT current_database()", ())
    with psycopg.connect(server.url(), autocommit=True) as admin:
        ended = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (database,)
        ).fetchall()
    assert ended
    assert await store.responses.get("resp_1") is not None

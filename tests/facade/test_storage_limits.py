"""Storage that cannot grow without bound (docs/hardening.md, "Stored data"): per-key quota,
per-conversation limit,
a TTL for responses, freed space returned to the file system, item lists read page by page."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from tests._sse import aiter_lines
from tests.facade.both_stores import on_both_store_backends  # noqa: F401
from tests.facade.helpers import MakeClient, png_data_url
from vlmserve.facade import Store
from vlmserve.facade.settings import Storage
from vlmserve.facade.store.records import ResponseRecord, StoredItem
from vlmserve.facade.store.sqlite import SQLiteDatabase
from vlmserve.facade.store.upkeep import run_upkeep, upkeep_once
from vlmserve.responses import input_to_messages


def noise_png(side: int) -> str:
    """A PNG that does not compress: about 3 × side² bytes."""
    buffer = io.BytesIO()
    Image.effect_noise((side, side), 64).convert("RGB").save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def image_item(url: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": url}]}


async def respond(http: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await http.post("/v1/responses", json={"model": "default", **body})


async def test_a_conversation_cannot_grow_past_its_limit(client_for: MakeClient) -> None:
    """The finding, scaled down: a conversation took 12 images of 8 MiB; here 12 of ~50 KB
    against a 200 KB limit."""
    http = client_for(max_conversation_bytes=200_000)
    conversation = (await http.post("/v1/conversations", json={})).json()["id"]
    image = noise_png(128)  # ~49 KB of PNG, ~66 KB as base64
    accepted = 0
    for _ in range(12):
        added = await http.post(
            f"/v1/conversations/{conversation}/items", json={"items": [image_item(image)]}
        )
        if added.status_code != 200:
            break
        accepted += 1
    assert 1 <= accepted < 4
    error = added.json()["error"]
    assert (added.status_code, error["code"], error["param"]) == (400, "conversation_too_large", "items")
    # A response in that conversation is refused before the engine is asked, naming `input`.
    refused = await respond(http, conversation=conversation, input=[image_item(image)])
    assert (refused.status_code, refused.json()["error"]["param"]) == (400, "input")
    # Text still fits.
    assert (await respond(http, conversation=conversation, input="and now?")).status_code == 200


async def test_each_key_has_a_storage_quota(client_for: MakeClient, store: Store) -> None:
    http = client_for(max_stored_bytes_per_key=300_000)
    image = noise_png(128)
    stored: list[str] = []
    for _ in range(10):
        reply = await respond(http, input=[image_item(image)])
        if reply.status_code != 200:
            break
        stored.append(reply.json()["id"])
    assert 1 <= len(stored) < 10
    error = reply.json()["error"]
    assert (reply.status_code, error["code"], error["type"]) == (
        429,
        "storage_quota_exceeded",
        "invalid_request_error",
    )
    assert "store" in error["message"]
    # Nothing stored: allowed. Conversations count too.
    assert (await respond(http, input=[image_item(image)], store=False)).status_code == 200
    full = await http.post("/v1/conversations", json={"items": [image_item(image)]})
    assert full.status_code == 429
    # Deleting gives the room back.
    used = await store.stored_bytes("anonymous")
    assert (await http.delete(f"/v1/responses/{stored[0]}")).status_code == 200
    assert await store.stored_bytes("anonymous") < used
    assert (await respond(http, input=[image_item(image)])).status_code == 200


def resource(response_id: str, created_at: int) -> dict[str, Any]:
    return {"id": response_id, "created_at": created_at, "status": "completed", "output": []}


async def test_responses_expire_and_conversations_do_not(store: Store) -> None:
    messages = input_to_messages([image_item(png_data_url())])
    item = [StoredItem("m", image_item(png_data_url()))]
    await store.responses.put(
        ResponseRecord.of(resource("resp_old", 1_000)), item, owner="k", input_messages=messages
    )
    await store.responses.put(
        ResponseRecord.of(resource("resp_new", 9_000)), item, owner="k", input_messages=messages
    )
    await store.conversations.create("conv_old", metadata={}, items=item, messages=messages, owner="k")
    before = await store.stored_bytes("k")
    done = await upkeep_once(store, Storage(response_ttl_s=3_600), now=10_000)
    assert done.expired_responses == 1
    assert await store.responses.get("resp_old", owner="k") is None
    assert await store.responses.get("resp_new", owner="k") is not None
    assert await store.conversations.get("conv_old", owner="k") is not None
    assert 0 < await store.stored_bytes("k") < before
    # No TTL: nothing expires.
    assert (await upkeep_once(store, Storage(response_ttl_s=None), now=10**12)).expired_responses == 0


def file_bytes(path: Path) -> int:
    return path.stat().st_size + (
        path.with_name(path.name + "-wal").stat().st_size
        if path.with_name(path.name + "-wal").exists()
        else 0
    )


async def test_deleted_space_goes_back_to_the_file_system(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    store = Store.sqlite(path)
    images = [noise_png(256) for _ in range(4)]  # ~200 KB each
    for index, url in enumerate(images):
        items = [StoredItem(f"m{index}", image_item(url))]
        await store.responses.put(
            ResponseRecord.of(resource(f"resp_{index}", 1)),
            items,
            input_messages=input_to_messages([image_item(url)]),
        )
    await store.maintain()
    full = file_bytes(path)
    assert full > 4 * 200_000
    for index in range(4):
        assert await store.responses.delete(f"resp_{index}")
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT COUNT(*) FROM images").fetchone() == (0,)
    assert file_bytes(path) < full / 4
    store.close()


async def vm_steps(store: Store, call: Callable[[], Awaitable[object]]) -> int:
    """SQLite virtual-machine steps a call takes (in tens): work, not time."""
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    database = store.db
    assert isinstance(database, SQLiteDatabase)
    database._db.set_progress_handler(count, 10)
    try:
        await call()
    finally:
        database._db.set_progress_handler(None, 10)
    return steps[0]


@pytest.mark.parametrize("order", ["asc", "desc"])
async def test_item_lists_read_one_page_whatever_the_size(tmp_path: Path, order: str) -> None:
    """`GET .../items?limit=1` used to load the whole conversation; now the work is the page's."""
    store = Store.sqlite(tmp_path / "s.sqlite3")
    for conversation, count in (("conv_small", 10), ("conv_big", 3_000)):
        items = [StoredItem(f"m{i}", {"role": "user", "content": "x" * 200}) for i in range(count)]
        await store.conversations.create(conversation, metadata={}, items=items)
        await store.responses.put(ResponseRecord.of(resource(f"resp_{conversation}", 1)), items)
    for list_items, key in (
        (store.conversations.list_items, "conv"),
        (store.responses.list_input_items, "resp_conv"),
    ):
        small, big = [
            await vm_steps(store, lambda: list_items(name, limit=1, order=order, after="m5"))  # noqa: B023
            for name in (f"{key}_small", f"{key}_big")
        ]
        assert big <= 2 * small + 2, (key, small, big)
        page = await list_items(f"{key}_big", limit=2, order=order, after="m5")
        assert page is not None
        assert [item.id for item in page.items] == (["m6", "m7"] if order == "asc" else ["m4", "m3"])
        assert page.has_more
    store.close()


async def test_upkeep_runs_on_its_interval_until_cancelled(tmp_path: Path) -> None:
    store = Store.sqlite(tmp_path / "s.sqlite3")
    task = asyncio.create_task(run_upkeep(store, Storage(response_ttl_s=60, maintenance_interval_s=0.05)))
    try:
        # Stored after the first run: only a later run can delete it.
        await asyncio.sleep(0.1)
        await store.responses.put(
            ResponseRecord.of(resource("resp_old", 1)), [StoredItem("m", {"role": "user", "content": "x"})]
        )
        for _ in range(100):
            if await store.responses.get("resp_old") is None:
                break
            await asyncio.sleep(0.05)
        assert await store.responses.get("resp_old") is None
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        store.close()


async def test_the_quota_is_checked_again_in_the_write(client_for: MakeClient, store: Store) -> None:
    """The early check estimates from the input alone; the write checks what it stores (the
    resource too), atomically. Here the estimate fits the quota and the write does not: what a
    request that lost a race with another (maybe on another facade) sees."""
    http = client_for(max_stored_bytes_per_key=300)
    refused = await respond(http, input="hi")
    error = refused.json()["error"]
    assert (refused.status_code, error["code"]) == (429, "storage_quota_exceeded")
    body = {"model": "default", "input": "hi", "stream": True}
    async with http.stream("POST", "/v1/responses", json=body) as reply:
        data = [line[5:].strip() async for line in aiter_lines(reply) if line.startswith("data:")]
    events = [json.loads(text) for text in data if text != "[DONE]"]
    assert [event["type"] for event in events] == [
        "response.created",
        "response.in_progress",
        "error",
        "response.failed",
    ]
    failed = events[-1]["response"]
    assert failed["error"]["code"] == "storage_quota_exceeded"
    assert (await http.get(f"/v1/responses/{failed['id']}")).status_code == 404
    assert await store.stored_bytes("anonymous") == 0

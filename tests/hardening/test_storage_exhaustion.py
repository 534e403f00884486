"""Storage under pressure (issue 26, findings 8 and 9).

8: on a full disk uploads and stored responses were a 500 (one connection reset), a stored stream
was cut before any event, `/readyz` said 200. Out of space is now 507 `insufficient_storage`
(the write seam raises ENOSPC / SQLite's "database or disk is full" here), nothing is left half
written, and below `--min-free-disk-bytes` `/readyz` is 503 and writes are refused up front.
9: 5 of 8 concurrent uploads passed a 10 MiB quota, and 2,000 one-byte files took 16.8 MB on disk
against a quota counting bytes only. The quota is now checked and taken under the owner's lock,
counts blocks on disk, and files per key are capped."""

from __future__ import annotations

import asyncio
import errno
import os
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from tests.facade.helpers import in_process, stream_events
from vlmserve.client import AsyncEngineClient
from vlmserve.facade import FacadeSettings, Store, create_app
from vlmserve.facade.settings import Files, Storage
from vlmserve.facade.store import database as database_module
from vlmserve.facade.store import disk_space as disk_module
from vlmserve.facade.store import files as file_store_module
from vlmserve.facade.store.files import FileQuota, FileQuotaExceededError, FileRepository

TEXT = b"plain text file\n"


async def upload(http: httpx.AsyncClient, content: bytes, name: str = "a.txt") -> httpx.Response:
    return await http.post(
        "/v1/files", files={"file": (name, content, "text/plain")}, data={"purpose": "user_data"}
    )


@pytest.fixture
async def http(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store
) -> AsyncIterator[httpx.AsyncClient]:
    limited = settings.replace(files=Files(max_file_bytes_per_key=100 * 1024, max_files_per_key=50))
    app = create_app(limited, engine=engine_client, store=store)
    async with in_process(app) as client:
        yield client


def test_concurrent_saves_never_pass_the_quota_together(tmp_path: Path) -> None:
    files = FileRepository(tmp_path / "files")
    data = b"x" * (40 * 1024)
    quota = FileQuota(max_disk_bytes=10 * 48 * 1024)
    barrier = threading.Barrier(16)
    outcomes: list[str] = []

    def save() -> None:
        barrier.wait()
        try:
            # Each on its own thread and loop: the saves meet at the owner's lock.
            asyncio.run(
                files.save(
                    "key_a", data, filename="a.txt", purpose="user_data", media_type="text/plain", quota=quota
                )
            )
            outcomes.append("saved")
        except FileQuotaExceededError:
            outcomes.append("refused")

    threads = [threading.Thread(target=save) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    count, on_disk = asyncio.run(files.usage("key_a"))
    # Each takes 40 KiB + a block for its record (44 KiB with 4 KiB blocks): 10 fit, never more.
    assert outcomes.count("saved") == count <= 10 < 16
    assert on_disk <= quota.max_disk_bytes


async def test_the_quota_counts_disk_blocks_and_files(http: httpx.AsyncClient) -> None:
    # One-byte files: each takes a block for its bytes and one for its record (8 KiB with
    # 4 KiB blocks), so a 100 KiB quota holds about a dozen, not 100 KiB of them.
    replies = [await upload(http, b"x", name=f"{index}.txt") for index in range(20)]
    statuses = [reply.status_code for reply in replies]
    accepted = statuses.count(200)
    assert 6 <= accepted <= 14 and statuses[accepted:] == [429] * (20 - accepted), statuses
    error = replies[-1].json()["error"]
    assert error["code"] == "storage_quota_exceeded" and "bytes on disk" in error["message"]


async def test_files_per_key_are_capped(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store
) -> None:
    app = create_app(settings.replace(files=Files(max_files_per_key=3)), engine=engine_client, store=store)
    async with in_process(app) as http:
        statuses = [(await upload(http, TEXT, name=f"{index}.txt")).status_code for index in range(4)]
        assert statuses == [200, 200, 200, 429]
        refused = await upload(http, TEXT)
        assert "3 files, its limit is 3" in refused.json()["error"]["message"]
        listed = (await http.get("/v1/files")).json()["data"]
        await http.delete(f"/v1/files/{listed[0]['id']}")
        assert (await upload(http, TEXT)).status_code == 200


async def test_a_full_disk_upload_is_a_507_and_leaves_nothing(
    http: httpx.AsyncClient, settings: FacadeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fsync = os.fsync
    calls = {"n": 0}

    def fsync(descriptor: int) -> None:
        # The record's write (the second) finds the disk full: the bytes, written first, must go.
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(descriptor)

    monkeypatch.setattr(file_store_module.os, "fsync", fsync)
    reply = await upload(http, TEXT)
    assert reply.status_code == 507, reply.text
    assert reply.json()["error"]["code"] == "insufficient_storage"
    folder = next((settings.files_directory()).iterdir())
    assert sorted(path.name for path in folder.iterdir()) == [".lock"]
    monkeypatch.setattr(file_store_module.os, "fsync", real_fsync)
    assert (await http.get("/v1/files")).json()["data"] == []
    assert (await upload(http, TEXT)).status_code == 200


class _Usage(NamedTuple):
    total: int
    used: int
    free: int


async def test_low_disk_makes_readyz_503_and_refuses_writes_up_front(
    settings: FacadeSettings,
    engine_client: AsyncEngineClient,
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(disk_module.shutil, "disk_usage", lambda _path: _Usage(10**9, 10**9 - 1000, 1000))
    app = create_app(
        settings.replace(storage=Storage(min_free_disk_bytes=1024 * 1024)), engine=engine_client, store=store
    )
    async with in_process(app) as http:
        ready = await http.get("/readyz")
        assert ready.status_code == 503 and ready.json()["error"]["code"] == "insufficient_storage"
        assert "1000 bytes free" in ready.json()["error"]["message"]
        for reply in (
            await http.post("/v1/responses", json={"input": "hi"}),
            await http.post("/v1/responses", json={"input": "hi", "stream": True}),
            await http.post("/v1/responses", json={"input": "hi", "background": True}),
            await upload(http, TEXT),
        ):
            assert reply.status_code == 507, reply.text
            assert reply.json()["error"]["code"] == "insufficient_storage"
        # Nothing to store: served.
        assert (await http.post("/v1/responses", json={"input": "hi", "store": False})).status_code == 200


async def test_a_store_that_finds_the_disk_full_fails_the_response_clearly(
    settings: FacadeSettings,
    engine_client: AsyncEngineClient,
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def full(*args: Any, **kwargs: Any) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    # The blocking write, so the error comes from the worker thread as a real one does.
    monkeypatch.setattr(store.responses, "_put", full)
    app = create_app(settings, engine=engine_client, store=store)
    async with in_process(app) as http:
        plain = await http.post("/v1/responses", json={"input": "hi"})
        assert plain.status_code == 507 and plain.json()["error"]["code"] == "insufficient_storage"
        streamed = await http.post("/v1/responses", json={"input": "hi", "stream": True})
        # A stream is never cut before its events: it begins, then fails with the reason.
        events = stream_events(streamed.text)
        assert events[0]["type"] == "response.created"
        assert events[-1]["type"] == "response.failed"
        assert events[-1]["response"]["error"]["code"] == "insufficient_storage"


async def test_low_disk_refuses_conversation_writes_up_front(
    settings: FacadeSettings,
    engine_client: AsyncEngineClient,
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = create_app(
        settings.replace(storage=Storage(min_free_disk_bytes=1024 * 1024)), engine=engine_client, store=store
    )
    item = {"type": "message", "role": "user", "content": "hi"}
    async with in_process(app) as http:
        created = await http.post("/v1/conversations", json={"items": [item]})
        assert created.status_code == 200, created.text
        conversation_id = created.json()["id"]
        monkeypatch.setattr(disk_module.shutil, "disk_usage", lambda _path: _Usage(10**9, 10**9 - 1000, 1000))
        # The free space is read at most once a second: a fresh app reads it now.
        app = create_app(
            settings.replace(storage=Storage(min_free_disk_bytes=1024 * 1024)),
            engine=engine_client,
            store=store,
        )
    async with in_process(app) as http:
        for reply in (
            await http.post("/v1/conversations", json={"items": [item]}),
            await http.post("/v1/conversations", json={}),
            await http.post(f"/v1/conversations/{conversation_id}/items", json={"items": [item]}),
            await http.post(f"/v1/conversations/{conversation_id}", json={"metadata": {"a": "b"}}),
            await http.post(
                "/v1/responses", json={"input": "hi", "conversation": conversation_id, "store": False}
            ),
        ):
            assert reply.status_code == 507, reply.text
            assert reply.json()["error"]["code"] == "insufficient_storage"
        # Reading is served, and nothing was added.
        listed = await http.get(f"/v1/conversations/{conversation_id}/items")
        assert listed.status_code == 200 and len(listed.json()["data"]) == 1
        assert (await http.get(f"/v1/conversations/{conversation_id}")).json()["metadata"] == {}


async def test_a_conversation_write_that_finds_the_disk_full_leaves_nothing(
    settings: FacadeSettings,
    engine_client: AsyncEngineClient,
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = create_app(settings, engine=engine_client, store=store)
    item = {"type": "message", "role": "user", "content": "hi"}
    async with in_process(app) as http:
        conversation_id = (await http.post("/v1/conversations", json={"items": [item]})).json()["id"]
        used = await store.stored_bytes("")

        def full(*args: Any, **kwargs: Any) -> None:
            # Raised at the transaction's end, after its rows were written: they must roll back.
            raise sqlite3.OperationalError("database or disk is full")

        monkeypatch.setattr(database_module.Transaction, "settle_usage", full)
        created = await http.post("/v1/conversations", json={"items": [item, item]})
        added = await http.post(f"/v1/conversations/{conversation_id}/items", json={"items": [item]})
        for reply in (created, added):
            assert reply.status_code == 507, reply.text
            assert reply.json()["error"]["code"] == "insufficient_storage"
        monkeypatch.undo()
        listed = (await http.get(f"/v1/conversations/{conversation_id}/items")).json()["data"]
        assert len(listed) == 1
        assert await store.stored_bytes("") == used
        (conversations,) = store.db.query("SELECT COUNT(*) FROM conversations", ())[0]
        (items,) = store.db.query("SELECT COUNT(*) FROM conversation_items", ())[0]
        assert (conversations, items) == (1, 1)

"""A response is stored (and appended to its conversation) before the client hears that it ended.

Issue 13.4: the final event went out before the final write, so a facade killed right after a
client read `response.completed` left the response stored `in_progress` (then `failed` on
restart). Here the store's writes are slowed down, and the test looks at the store the moment
the final event (or the non-stream answer) arrives.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from tests._sse import aiter_lines
from tests.facade.fake_engine import FakeEngine, Script
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade import FacadeSettings, Store
from vlmserve.facade.store.database import Transaction
from vlmserve.facade.store.sqlite import SQLiteDatabase

WRITE_DELAY_S = 0.3


class SlowDatabase(SQLiteDatabase):
    """Every write transaction takes WRITE_DELAY_S longer before it commits."""

    @contextmanager
    def transaction(self, *, frees_images: bool = False) -> Iterator[Transaction]:
        with super().transaction(frees_images=frees_images) as tx:
            yield tx
            time.sleep(WRITE_DELAY_S)


@pytest.fixture
def store(settings: FacadeSettings) -> Iterator[Store]:
    opened = Store(SlowDatabase(settings.store_path))
    yield opened
    opened.close()


def stored(path: Path, response_id: str) -> dict[str, Any]:
    """The response as a second connection (another process, a restarted facade) reads it."""
    with sqlite3.connect(path) as db:
        (text,) = db.execute("SELECT resource FROM responses WHERE id = ?", (response_id,)).fetchone()
    resource: dict[str, Any] = json.loads(text)
    return resource


def conversation_item_count(path: Path, conversation_id: str) -> int:
    with sqlite3.connect(path) as db:
        (count,) = db.execute(
            "SELECT COUNT(*) FROM conversation_items WHERE conversation_id = ?", (conversation_id,)
        ).fetchone()
    return int(count)


@pytest.mark.parametrize("final", ["response.completed", "response.incomplete", "response.failed"])
async def test_stream_final_event_comes_after_the_final_write(
    server_url: str, engine: FakeEngine, settings: FacadeSettings, final: str
) -> None:
    if final == "response.incomplete":
        engine.script = Script(finish_reason=pb.FINISH_REASON_LENGTH)
    elif final == "response.failed":
        engine.script = Script(error=(grpc.StatusCode.INTERNAL, "boom"), error_after=1)
    async with httpx.AsyncClient(base_url=server_url, timeout=10) as client:
        conversation = (await client.post("/v1/conversations", json={})).json()["id"]
        body = {"model": "default", "input": "hi", "stream": True, "conversation": conversation}
        async with client.stream("POST", "/v1/responses", json=body) as response:
            async for line in aiter_lines(response):
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                event = json.loads(line.removeprefix("data:"))
                if event["type"] == final:
                    # Looked at at once: nothing more is read from the stream first.
                    resource = stored(settings.store_path, event["response"]["id"])
                    assert resource["status"] == event["response"]["status"]
                    assert resource["output"] == event["response"]["output"]
                    expected_items = 0 if final == "response.failed" else 2
                    assert conversation_item_count(settings.store_path, conversation) == expected_items
                    break
            else:
                raise AssertionError(f"no {final} event")


async def test_non_stream_answer_comes_after_the_final_write(
    server_url: str, settings: FacadeSettings
) -> None:
    async with httpx.AsyncClient(base_url=server_url, timeout=10) as client:
        conversation = (await client.post("/v1/conversations", json={})).json()["id"]
        answer = await client.post(
            "/v1/responses", json={"model": "default", "input": "hi", "conversation": conversation}
        )
        assert answer.status_code == 200, answer.text
        resource = stored(settings.store_path, answer.json()["id"])
        assert resource["status"] == "completed"
        assert conversation_item_count(settings.store_path, conversation) == 2

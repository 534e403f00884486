"""Replays reuse the contract messages earlier turns were translated to (docs/responses-api.md,
"Replay cost").

A turn translates (and decodes the images of) its own items only: earlier turns come back from
the store as raw contract messages, images kept once per content hash, so the engine request is
the same as if every item had been translated again, without that work.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.facade.both_stores import on_both_store_backends  # noqa: F401
from tests.facade.fake_engine import FakeEngine, Script
from tests.facade.helpers import SCREENSHOT_TOOL, count_image_checks, png_data_url
from vlmserve.engine.prep.lowering import lower_messages
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade import Store
from vlmserve.facade.http.api_keys import ANONYMOUS_OWNER
from vlmserve.facade.store.records import ResponseRecord, StoredItem
from vlmserve.responses import build_generate_request, input_to_messages

CALL = pb.ToolCall(id="call_1", name="screenshot", arguments="{}", kind=pb.TOOL_KIND_FUNCTION)


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per image the translation checks (reads the header of)."""
    return count_image_checks(monkeypatch)


def screenshot_output(turn: int) -> dict[str, Any]:
    return {
        "type": "function_call_output",
        "call_id": CALL.id,
        "output": [
            {"type": "input_text", "text": f"step {turn}"},
            {"type": "input_image", "image_url": png_data_url((turn * 40 % 256, 0, 0)), "detail": "low"},
        ],
    }


async def agent_loop(http: httpx.AsyncClient, turns: int, **continuation: Any) -> list[dict[str, Any]]:
    """Turn 0 asks; every later turn answers the model's screenshot call with a new image."""
    bodies: list[dict[str, Any]] = []
    previous: str | None = None
    for turn in range(turns):
        body: dict[str, Any] = {"model": "default", "tools": [SCREENSHOT_TOOL], **continuation}
        body["input"] = "Look around." if turn == 0 else [screenshot_output(turn)]
        if previous is not None and "conversation" not in continuation:
            body["previous_response_id"] = previous
        reply = await http.post("/v1/responses", json=body)
        assert reply.status_code == 200, reply.text
        previous = reply.json()["id"]
        bodies.append(reply.json())
    return bodies


@pytest.mark.parametrize("continuation", ["previous_response_id", "conversation"])
async def test_each_turn_decodes_only_its_own_images(
    http: httpx.AsyncClient, engine: FakeEngine, decoded: list[int], continuation: str
) -> None:
    engine.script = Script(text_chunks=[], tool_calls=[CALL])
    extra: dict[str, Any] = {}
    if continuation == "conversation":
        extra["conversation"] = (await http.post("/v1/conversations", json={})).json()["id"]
    await agent_loop(http, 6, **extra)
    # One image a turn (turns 1..5), each checked once, though the last request carries five.
    assert len(decoded) == 5
    assert [len(lower_messages(request.messages)) for request in engine.requests] == [1, 4, 7, 10, 13, 16]
    last = engine.requests[-1]
    assert (
        sum(1 for m in lower_messages(last.messages) for p in m.parts if p.WhichOneof("kind") == "image") == 5
    )


async def test_replayed_request_equals_a_full_translation(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    """What the engine gets on turn 4 is what translating every item again would give."""
    engine.script = Script(text_chunks=["looking"], tool_calls=[CALL])
    responses = await agent_loop(http, 4)
    items: list[Any] = [{"type": "message", "role": "user", "content": "Look around."}]
    for turn, response in enumerate(responses[:-1]):
        items.extend(response["output"])
        items.append(screenshot_output(turn + 1))
    # The replay's last request, what the facade adds aside, equals the whole history translated.
    full = build_generate_request({"input": items, "tools": [SCREENSHOT_TOOL], "max_output_tokens": 1024})
    replayed = pb.GenerateRequest()
    replayed.CopyFrom(engine.requests[-1])
    for facade_field in ("request_id", "model", "partition_key"):
        replayed.ClearField(facade_field)
    assert replayed == full.request


async def test_chain_replays_after_a_restart(
    http: httpx.AsyncClient, engine: FakeEngine, another_store: Callable[[], Store]
) -> None:
    """From the database alone (nothing cached): a second store on it replays the same."""
    engine.script = Script(text_chunks=[], tool_calls=[CALL])
    responses = await agent_loop(http, 3)
    replay = await another_store().responses.replay(responses[-1]["id"], owner=ANONYMOUS_OWNER)
    assert replay is not None and replay.items == [], replay
    # Turn 2's request held turns 0-1 and its own input; the replay adds turn 2's output (one
    # assistant message with the call). The engine got them lowered.
    assert replay.messages[-1].tool_calls[0].id == CALL.id
    assert replay.messages[:-1] == list(engine.requests[-1].messages)


def message(item_id: str, text: str) -> StoredItem:
    return StoredItem(item_id, {"type": "message", "role": "user", "content": text})


def resource(response_id: str, previous: str | None = None) -> dict[str, Any]:
    return {
        "id": response_id,
        "created_at": 1,
        "status": "completed",
        "previous_response_id": previous,
        "output": [],
    }


async def test_images_are_stored_once_per_content(tmp_path: Path) -> None:
    store = Store.sqlite(tmp_path / "s.sqlite3")
    image = [
        {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": png_data_url()}]}
    ]
    messages = input_to_messages(image)
    for index in range(3):
        await store.responses.put(
            ResponseRecord.of(resource(f"resp_{index}")), [message(f"m{index}", "x")], input_messages=messages
        )
    with sqlite3.connect(tmp_path / "s.sqlite3") as db:
        assert db.execute("SELECT COUNT(*) FROM images").fetchone() == (1,)
    # Freed once nothing uses it any more.
    for index in range(3):
        await store.responses.delete(f"resp_{index}")
    with sqlite3.connect(tmp_path / "s.sqlite3") as db:
        assert db.execute("SELECT COUNT(*) FROM images").fetchone() == (0,)
    store.close()


async def test_responses_stored_without_messages_replay_their_items(tmp_path: Path) -> None:
    """Responses stored before messages were kept (or whose output did not translate)."""
    store = Store.sqlite(tmp_path / "s.sqlite3")
    await store.responses.put(
        ResponseRecord.of(resource("resp_1")), [message("m1", "one")], input_messages=input_to_messages("one")
    )
    await store.responses.put(ResponseRecord.of(resource("resp_2", "resp_1")), [message("m2", "two")])
    replay = await store.responses.replay("resp_2")
    assert replay is not None and replay.messages == []
    assert [stored.item["content"] for stored in replay.items] == ["one", "two"]
    first = await store.responses.replay("resp_1")
    assert first is not None and first.items == [] and first.messages == input_to_messages("one")
    store.close()

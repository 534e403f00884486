"""Long input texts are held out of the request's protobuf message and written into its bytes
as they are sent and stored (vlmserve.common.wire_encode): the engine, a replay and a
conversation see exactly the client's text, never a marker (docs/hardening.md, "Memory per
request byte")."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.facade.fake_engine import FakeEngine, Script
from vlmserve.common import wire_encode
from vlmserve.engine.v1 import engine_pb2 as pb

# Held from 200 characters on here, so that small bodies take the path 30 MiB ones take.
LONG = "long é😀漢 text " * 20
OTHER = "another long tool output " * 10


@pytest.fixture(autouse=True)
def hold_short_texts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire_encode, "HOLD_MIN_CHARS", 200)


def texts(request: pb.GenerateRequest) -> list[str]:
    found: list[str] = []
    for message in request.messages:
        found += [part.text.text for part in message.parts if part.WhichOneof("kind") == "text"]
        if message.HasField("tool_output"):
            found.append(message.tool_output.text)
    return found


async def post(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    reply = await http.post("/v1/responses", json={"model": "default", **body})
    assert reply.status_code == 200, reply.text
    result: dict[str, Any] = reply.json()
    return result


async def test_the_engine_and_a_replay_get_the_clients_text(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.script = Script(text_chunks=["ok"])
    first = await post(http, input=LONG)
    assert texts(engine.requests[-1]) == [LONG]
    second = await post(
        http,
        previous_response_id=first["id"],
        input=[
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": LONG + "!"}]},
        ],
    )
    # The first turn comes back from the store (its input is not cached: it held markers).
    assert texts(engine.requests[-1]) == [LONG, "ok", LONG + "!"]
    await post(http, previous_response_id=second["id"], input="short")
    assert texts(engine.requests[-1]) == [LONG, "ok", LONG + "!", "ok", "short"]
    items = (await http.get(f"/v1/responses/{first['id']}/input_items")).json()["data"]
    assert items[0]["content"][0]["text"] == LONG


async def test_a_conversation_keeps_the_clients_text(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.script = Script(text_chunks=["ok"])
    conversation = (await http.post("/v1/conversations", json={})).json()["id"]
    await post(http, conversation=conversation, input=LONG)
    await post(
        http,
        conversation=conversation,
        input=[{"type": "function_call_output", "call_id": "c1", "output": OTHER}],
    )
    await post(http, conversation=conversation, input="short")
    assert texts(engine.requests[-1]) == [LONG, "ok", OTHER, "ok", "short"]

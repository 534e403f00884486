"""Without `context_management`, a chained turn (`previous_response_id`, `conversation`) whose
prompt would not fit the context is compacted first (issue 36.1, mlx-vlm's behaviour):
the answer is generated on the compaction item and the recent items of the whole conversation
(stored turns and input), the item first in the output; `context_management: []` opts out (the
prompt is sent as it is, as before). The scripted engine counts a word as a token in a 4096-token
context; its `usage` is what the stored turn says it was sent. The real engine:
tests/e2e/test_context_real_stack.py."""

from __future__ import annotations

from typing import Any

import httpx

from tests.facade.fake_engine import FakeEngine
from tests.facade.test_auto_compaction import texts, words
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.responses import SUMMARY_INSTRUCTION

BIG = 2100


def first_turn() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": words("task", BIG)},
        {"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "seen"},
    ]


async def stored_turn(
    http: httpx.AsyncClient, engine: FakeEngine, *, answer: int = 0, **chain: Any
) -> dict[str, Any]:
    """A stored first turn of BIG words, its answer `answer` words long (0: a short one)."""
    chunks = engine.script.text_chunks
    if answer:
        engine.script.text_chunks = [words("answer", answer)]
    engine.script.usage = pb.Usage(input_tokens=BIG + 5, output_tokens=answer or 3)
    reply = await http.post("/v1/responses", json={"model": "default", "input": first_turn(), **chain})
    assert reply.status_code == 200, reply.text
    engine.script.text_chunks = chunks
    engine.script.usage = pb.Usage(input_tokens=11, output_tokens=3)
    engine.requests.clear()
    engine.count_requests.clear()
    resource: dict[str, Any] = reply.json()
    return resource


async def test_a_previous_response_chain_is_compacted(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    first = await stored_turn(http, engine)
    body = {
        "model": "default",
        "previous_response_id": first["id"],
        "input": [{"role": "user", "content": words("more", BIG)}],
    }
    reply = await http.post("/v1/responses", json=body)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert [item["type"] for item in answer["output"]] == ["compaction", "message"]
    summarising, answering = engine.requests
    # The summary was of the chain (what fits of it: its oldest turn left out) and the new input.
    assert texts(summarising)[-2:] == [words("more", BIG), SUMMARY_INSTRUCTION]
    # The answer: the summary, then the recent items (the last user message) and nothing before.
    assert texts(answering) == ["Summary of the conversation so far:\nHello, world.", words("more", BIG)]
    # The chain goes on from the compacted turn: a next turn replays from its summary.
    follow = {
        "model": "default",
        "previous_response_id": answer["id"],
        "input": "Go on.",
        "context_management": [],
    }
    assert (await http.post("/v1/responses", json=follow)).status_code == 200
    assert texts(engine.requests[-1])[0].startswith("Summary of the conversation so far:")
    assert words("task", BIG) not in texts(engine.requests[-1])


async def test_the_last_call_and_its_output_come_along(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    # The stored turn's answer fills the context (the scripted engine counts no tool output).
    first = await stored_turn(http, engine, answer=BIG)
    call = {"type": "function_call", "call_id": "c2", "name": "look", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c2", "output": "seen again"}
    body = {"model": "default", "previous_response_id": first["id"], "input": [call, output]}
    reply = await http.post("/v1/responses", json=body)
    assert reply.status_code == 200, reply.text
    answering = engine.requests[-1]
    # The last user message (from the stored turn), then the call and its output: no orphan output.
    assert [m.role for m in answering.messages] == [
        pb.ROLE_ASSISTANT,
        pb.ROLE_USER,
        pb.ROLE_ASSISTANT,
        pb.ROLE_TOOL,
    ]
    assert texts(answering)[1] == words("task", BIG)
    assert answering.messages[3].tool_output.text == "seen again"


async def test_a_conversation_is_compacted(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    conversation = (await http.post("/v1/conversations", json={})).json()["id"]
    await stored_turn(http, engine, conversation=conversation)
    body = {"model": "default", "conversation": conversation, "input": words("more", BIG)}
    reply = await http.post("/v1/responses", json=body)
    assert reply.status_code == 200, reply.text
    assert [item["type"] for item in reply.json()["output"]] == ["compaction", "message"]
    assert texts(engine.requests[-1]) == [
        "Summary of the conversation so far:\nHello, world.",
        words("more", BIG),
    ]


async def test_an_empty_list_opts_out(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    first = await stored_turn(http, engine)
    body = {
        "model": "default",
        "previous_response_id": first["id"],
        "input": words("more", BIG),
        "context_management": [],
    }
    await http.post("/v1/responses", json=body)
    # Sent as it is (the real engine answers that with its context_length_exceeded 400).
    (sent,) = engine.requests
    assert texts(sent)[0] == words("task", BIG) and engine.count_requests == []


async def test_a_short_chain_is_not_counted(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    first = (await http.post("/v1/responses", json={"model": "default", "input": "hi"})).json()
    engine.requests.clear()
    body = {"model": "default", "previous_response_id": first["id"], "input": "and?"}
    reply = await http.post("/v1/responses", json=body)
    assert [item["type"] for item in reply.json()["output"]] == ["message"]
    assert engine.count_requests == [] and len(engine.requests) == 1

"""`truncation: "auto"` (issue 36.1): the oldest turns are left out until the prompt fits, never
the instructions, never a call without its output, never the turn being answered; the response
says how many went (`truncated_items`). The scripted engine counts a word as a token
(tests/facade/fake_engine.py) in a 4096-token context."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.facade.fake_engine import FakeEngine
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade.responses.truncation import turn_groups


def words(tag: str, count: int) -> str:
    return " ".join([tag] * count)


def conversation() -> list[dict[str, Any]]:
    return [
        {"role": "developer", "content": "Keep to the point."},
        {"role": "user", "content": words("old", 1500)},
        {"role": "assistant", "content": words("older", 1500)},
        {"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "seen"},
        {"role": "user", "content": words("recent", 2500)},
        {"role": "assistant", "content": "noted"},
        {"role": "user", "content": "and now?"},
    ]


def texts(request: pb.GenerateRequest) -> list[str]:
    return [p.text.text.split(" ")[0] for m in request.messages for p in m.parts if p.HasField("text")]


async def test_the_oldest_turns_go_until_it_fits(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    body = {"model": "default", "input": conversation(), "truncation": "auto", "max_output_tokens": 100}
    reply = await http.post("/v1/responses", json=body)
    assert reply.status_code == 200, reply.text
    resource = reply.json()
    # 1500 + 1500 + 2500 + ... words in 4096 - 100: the first user turn goes, then the assistant
    # turn that called a tool goes with the tool's output (three messages), the instructions stay.
    assert resource["truncation"] == "auto" and resource["truncated_items"] == 3
    (sent,) = engine.requests
    assert texts(sent) == ["Keep", "recent", "noted", "and"]
    assert [m.role for m in sent.messages] == [
        pb.ROLE_DEVELOPER,
        pb.ROLE_USER,
        pb.ROLE_ASSISTANT,
        pb.ROLE_USER,
    ]
    # Stored whole: what the client sent.
    items = (await http.get(f"/v1/responses/{resource['id']}/input_items?order=asc")).json()["data"]
    assert len(items) == len(conversation())


async def test_nothing_goes_when_it_fits_and_the_field_stays_absent(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    body = {"model": "default", "input": "hi", "truncation": "auto"}
    resource = (await http.post("/v1/responses", json=body)).json()
    assert resource["truncation"] == "auto" and "truncated_items" not in resource
    assert len(engine.count_requests) == 1


async def test_disabled_counts_nothing_and_drops_nothing(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    # (`context_management: []`: not compacted either, which a prompt this long would be.)
    body = {"model": "default", "input": conversation(), "context_management": []}
    reply = await http.post("/v1/responses", json=body)
    assert reply.status_code == 200
    assert engine.count_requests == [] and "truncated_items" not in reply.json()
    assert len(engine.requests[0].messages) == 7


async def test_streamed_events_carry_the_count(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    body = {"model": "default", "input": conversation(), "truncation": "auto", "stream": True}
    reply = await http.post("/v1/responses", json=body)
    assert '"truncated_items":3' in reply.text.replace(" ", "")


CALL = pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(id="c", name="f")])
TOOL = pb.Message(role=pb.ROLE_TOOL)
USER = pb.Message(role=pb.ROLE_USER)
TEXT = pb.Message(role=pb.ROLE_ASSISTANT)
SYSTEM = pb.Message(role=pb.ROLE_SYSTEM)


@pytest.mark.parametrize(
    ("messages", "groups"),
    [
        ([SYSTEM, USER, TEXT, USER], [[1], [2], [3]]),
        ([USER, CALL, TOOL, TOOL, USER], [[0], [1, 2, 3], [4]]),
        # An instruction between a call and its output does not part them.
        ([USER, CALL, SYSTEM, TOOL, USER], [[0], [1, 3], [4]]),
        # A tool turn nobody called goes alone; text after the outputs is its own turn.
        ([TOOL, USER, CALL, TOOL, TEXT], [[0], [1], [2, 3], [4]]),
        ([SYSTEM], []),
    ],
)
def test_turn_groups(messages: list[pb.Message], groups: list[list[int]]) -> None:
    assert turn_groups(messages) == groups

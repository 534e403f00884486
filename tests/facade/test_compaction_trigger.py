"""`compaction_trigger` (issue 36.1): the conversation before it summarised into a sealed
`compaction` item, streamed with `response.compaction.*` events; the next turn's input holding
that item is expanded server-side (summary, kept screenshots); bad items are 400s naming the
field. The wire is asserted as sent (the model is scripted)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.facade.fake_engine import FakeEngine
from tests.facade.helpers import parse_sse, png_bytes, png_data_url
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.responses import SUMMARY_INSTRUCTION

TRIGGER = {"type": "compaction_trigger"}
RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


def screenshot_output(call_id: str, color: tuple[int, int, int]) -> dict[str, Any]:
    return {
        "type": "function_call_output",
        "call_id": call_id,
        "output": [{"type": "input_image", "image_url": png_data_url(color)}],
    }


def session() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": [{"type": "input_text", "text": "Open the editor."}]},
        {"type": "function_call", "call_id": "c1", "name": "screenshot", "arguments": "{}"},
        screenshot_output("c1", RED),
        {"type": "function_call", "call_id": "c2", "name": "screenshot", "arguments": "{}"},
        screenshot_output("c2", GREEN),
        {"type": "function_call", "call_id": "c3", "name": "screenshot", "arguments": "{}"},
        screenshot_output("c3", BLUE),
    ]


TOOLS = [{"type": "function", "name": "screenshot", "parameters": {"type": "object", "properties": {}}}]


def texts(message: pb.Message) -> list[str]:
    return [part.text.text for part in message.parts if part.HasField("text")]


async def compact(http: httpx.AsyncClient, **extra: Any) -> httpx.Response:
    body = {"model": "default", "input": [*session(), TRIGGER], "tools": TOOLS, **extra}
    return await http.post("/v1/responses", json=body)


async def test_the_answer_is_one_sealed_compaction_item(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.script.text_chunks = ["Goal: open the editor. ", '<tool_call>{"name": "screenshot"}</tool_call>']
    reply = await compact(http)
    assert reply.status_code == 200, reply.text
    resource = reply.json()
    assert resource["object"] == "response" and resource["status"] == "completed"
    (item,) = resource["output"]
    assert set(item) == {"id", "type", "encrypted_content"} and item["type"] == "compaction"
    assert item["id"].startswith("cmp_") and item["encrypted_content"].startswith("vlmserve.compaction.v2.")
    assert "Goal" not in item["encrypted_content"] and "R29hbD" not in item["encrypted_content"]
    # The model was asked for a summary of the conversation before the trigger, tools off; then
    # the next turn's prefix was prefilled (test_compaction_turn_store.py).
    sent, _ = engine.requests
    assert texts(sent.messages[-1]) == [SUMMARY_INSTRUCTION]
    # The summary's budget: a sixteenth of the (fake) model's 4096-token context.
    assert sent.sampling.max_tokens == 256
    assert sent.tool_choice.WhichOneof("choice") is not None or not sent.tools


async def test_the_next_turn_expands_the_item(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.script.text_chunks = ["Goal: open the editor. ", '<tool_call>{"name": "screenshot"}</tool_call>']
    (item,) = (await compact(http)).json()["output"]
    engine.script.text_chunks = ["Done."]
    # The client may send what came before the item too: the item covers it.
    body = {"model": "default", "input": [*session(), item, {"role": "user", "content": "Go on."}]}
    reply = await http.post("/v1/responses", json=body)
    assert reply.status_code == 200, reply.text
    sent = engine.requests[-1]
    assert [m.role for m in sent.messages] == [pb.ROLE_ASSISTANT, pb.ROLE_USER, pb.ROLE_USER]
    # The summary, clean of the model's tool-call markup.
    assert texts(sent.messages[0]) == ["Summary of the conversation so far:\nGoal: open the editor."]
    # The latest two screenshots kept as images (compaction_keep_images), the newest last.
    kept = [part.image.data for part in sent.messages[1].parts if part.HasField("image")]
    assert kept == [png_bytes(GREEN), png_bytes(BLUE)]
    assert texts(sent.messages[2]) == ["Go on."]


async def test_streamed_compaction_events(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    reply = await compact(http, stream=True)
    assert reply.status_code == 200
    events = [json.loads(event.data) for event in parse_sse(reply.text) if event.data != "[DONE]"]
    kinds = [event["type"] for event in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert set(kinds[3:-2]) == {"response.compaction.compacting"} and len(kinds[3:-2]) == 3
    assert kinds[-2:] == ["response.output_item.done", "response.completed"]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    added, done, completed = events[2], events[-2], events[-1]
    assert added["item"] == {"id": done["item"]["id"], "type": "compaction", "encrypted_content": ""}
    assert all(e["item_id"] == added["item"]["id"] and e["output_index"] == 0 for e in events[3:-2])
    assert completed["response"]["output"] == [done["item"]]
    # No summary text on the wire.
    assert "Hello" not in reply.text


async def test_the_openai_sdk_reads_the_stream(server_url: str, engine: FakeEngine) -> None:
    client = openai.AsyncOpenAI(base_url=f"{server_url}/v1", api_key="x", max_retries=0, timeout=10)
    events = await client.responses.create(model="default", input=[*session(), TRIGGER], stream=True)  # type: ignore[list-item]
    kinds = [event.type async for event in events]
    assert "response.compaction.compacting" in kinds and kinds[-1] == "response.completed"
    await client.close()


@pytest.mark.parametrize(
    ("items", "param"),
    [
        ([TRIGGER, {"role": "user", "content": "hi"}], "input[0]"),
        ([{"type": "compaction", "encrypted_content": "gAAAAABpM0Yj"}], "input[0].encrypted_content"),
        (
            [{"type": "compaction", "encrypted_content": "vlmserve.compaction.v1.eyJzdW1tYXJ5IjoieCJ9"}],
            "input[0].encrypted_content",
        ),
    ],
)
async def test_bad_items_are_400s_naming_them(
    http: httpx.AsyncClient, engine: FakeEngine, items: list[dict[str, Any]], param: str
) -> None:
    reply = await http.post("/v1/responses", json={"model": "default", "input": items})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param
    assert engine.requests == []


async def test_a_forged_item_is_a_400(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    (item,) = (await compact(http)).json()["output"]
    content = item["encrypted_content"]
    middle = len(content) // 2
    forged = content[:middle] + ("A" if content[middle] != "A" else "B") + content[middle + 1 :]
    body = {
        "model": "default",
        "input": [{**item, "encrypted_content": forged}, {"role": "user", "content": "x"}],
    }
    reply = await http.post("/v1/responses", json=body)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "input[0].encrypted_content"

"""stream: true: SSE framing, OpenAI's event order, schema-valid events, failures mid-stream."""

from __future__ import annotations

from typing import Any

import grpc
import httpx

from tests.facade.fake_engine import FakeEngine, Script
from tests.facade.helpers import EVENT_SCHEMAS, SCREENSHOT_TOOL, assert_valid, in_process, stream_events
from vlmserve.client import AsyncEngineClient
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade import FacadeSettings, Store, Timeouts, create_app

TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]
CALL_EVENTS = [
    "response.output_item.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
]


async def stream(http: httpx.AsyncClient, **body: Any) -> tuple[httpx.Response, list[dict[str, Any]]]:
    response = await http.post("/v1/responses", json={"model": "default", "stream": True, **body})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return response, stream_events(response.text)


def check_events(events: list[dict[str, Any]]) -> None:
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    for event in events:
        assert_valid(event, EVENT_SCHEMAS[event["type"]])


async def test_text_stream_follows_openai_order(http: httpx.AsyncClient) -> None:
    _, events = await stream(http, input="hi")
    assert [event["type"] for event in events] == [*TEXT_EVENTS, "response.completed"]
    check_events(events)
    deltas = "".join(event["delta"] for event in events if event["type"] == "response.output_text.delta")
    final = events[-1]["response"]
    assert final["status"] == "completed"
    assert final["output"][0]["content"][0]["text"] == deltas == "Hello, world."
    # Every event names the one message item the stream opened.
    item_id = events[2]["item"]["id"]
    assert {event["item_id"] for event in events if "item_id" in event} == {item_id}
    assert final["output"][0]["id"] == item_id


async def test_text_then_function_call_stream(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.script.text_chunks = ["Let me look", "."]
    engine.script.tool_calls = [pb.ToolCall(id="call_1", name="screenshot", arguments='{"zoom": 2}')]
    engine.script.finish_reason = pb.FINISH_REASON_TOOL_CALLS
    _, events = await stream(http, input="look", tools=[SCREENSHOT_TOOL])
    types = [event["type"] for event in events]
    message_events = [t for t in TEXT_EVENTS if t != "response.output_text.delta"]
    assert [t for t in types if t != "response.output_text.delta"] == [
        *message_events,
        *CALL_EVENTS,
        "response.completed",
    ]
    check_events(events)
    call_done = events[-2]["item"]
    assert call_done["type"] == "function_call" and call_done["arguments"] == '{"zoom": 2}'
    added = next(e for e in events if e["type"] == "response.output_item.added" and e["output_index"] == 1)
    assert added["item"]["status"] == "in_progress" and added["item"]["arguments"] == ""
    assert [item["type"] for item in events[-1]["response"]["output"]] == ["message", "function_call"]


async def test_call_only_stream_has_no_message(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.script.text_chunks = ["\n", " "]
    engine.script.tool_calls = [pb.ToolCall(id="call_1", name="screenshot", arguments="{}")]
    _, events = await stream(http, input="look", tools=[SCREENSHOT_TOOL])
    assert [event["type"] for event in events] == [
        "response.created",
        "response.in_progress",
        *CALL_EVENTS,
        "response.completed",
    ]
    check_events(events)


async def test_token_limit_ends_with_response_incomplete(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.script.finish_reason = pb.FINISH_REASON_LENGTH
    _, events = await stream(http, input="hi", max_output_tokens=3)
    assert events[-1]["type"] == "response.incomplete"
    check_events(events)
    final = events[-1]["response"]
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["status"] == "incomplete"


async def test_engine_error_mid_stream_sends_error_then_failed(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.script.error = (grpc.StatusCode.UNAVAILABLE, "engine went away")
    engine.script.error_after = 2
    response, events = await stream(http, input="hi")
    types = [event["type"] for event in events]
    assert types[-2:] == ["error", "response.failed"]
    assert types.count("response.output_text.delta") == 2
    check_events(events)
    assert events[-2]["error"]["code"] == "engine_unavailable"
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "engine_unavailable"
    assert "engine went away" not in response.text
    stored = (await http.get(f"/v1/responses/{failed['id']}")).json()
    assert stored["status"] == "failed"


async def test_streamed_response_is_stored_with_its_final_state(http: httpx.AsyncClient) -> None:
    _, events = await stream(http, input="hi")
    final = events[-1]["response"]
    stored = await http.get(f"/v1/responses/{final['id']}")
    assert stored.status_code == 200
    assert stored.json() == final


async def test_hosted_tool_header_on_a_stream(http: httpx.AsyncClient) -> None:
    response, _ = await stream(http, input="hi", tools=[{"type": "web_search"}, {"type": "file_search"}])
    assert response.headers["x-vlmserve-ignored-tools"] == "file_search,web_search"


async def test_heartbeats_during_a_long_prefill(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store, engine: FakeEngine
) -> None:
    quick = settings.replace(timeouts=Timeouts(heartbeat=0.05, stream_first_message=0.01))
    app = create_app(quick, engine=engine_client, store=store)
    engine.script.first_delay_s = 0.6
    async with in_process(app) as http:
        _, events = await stream(http, input="hi")
    check_events(events)
    types = [event["type"] for event in events]
    first_output = types.index("response.output_item.added")
    # created, the usual in_progress, then at least a few heartbeats before any output.
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[2:first_output] == ["response.in_progress"] * (first_output - 2)
    assert first_output - 2 >= 2
    assert types[-1] == "response.completed"


async def test_events_are_ascii_json_lines(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    """Non-ASCII text (U+2028 among it, which some line readers split on) travels escaped."""
    engine.script = Script(text_chunks=["héllo", "\u2028", "ツ\n"])
    response, events = await stream(http, input="hi")
    assert response.content.isascii()
    deltas = "".join(event["delta"] for event in events if event["type"] == "response.output_text.delta")
    assert deltas == "héllo\u2028ツ\n"


async def test_streams_are_framed_with_lf_only(http: httpx.AsyncClient) -> None:
    """Every line ends in LF, every event in an empty line: no CR anywhere (strict SSE parsers,
    the official Open Responses suite's among them, see no events in a CR LF stream)."""
    for path, body in [
        ("/v1/responses", {"input": "hi"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ]:
        response = await http.post(path, json={"model": "default", "stream": True, **body})
        assert response.status_code == 200, response.text
        raw = response.content
        assert b"\r" not in raw, raw[:200]
        assert raw.endswith(b"data: [DONE]\n\n"), raw[-60:]
        blocks = raw.decode().split("\n\n")[:-1]
        assert len(blocks) > 3
        for block in blocks:
            assert all(line.startswith(("event: ", "data: ", ": ")) for line in block.split("\n")), block

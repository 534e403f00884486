"""The streaming state machine on its own: engine messages in, events and final resource out."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from tests.facade.helpers import EVENT_SCHEMAS, assert_valid
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade.http.errors import APIError
from vlmserve.facade.responses.events import Event, ResponseEvents
from vlmserve.responses import ResponseResource


def base_resource() -> ResponseResource:
    return ResponseResource.model_validate(
        {
            "id": "resp_1",
            "object": "response",
            "created_at": 1,
            "completed_at": None,
            "status": "in_progress",
            "incomplete_details": None,
            "model": "m",
            "previous_response_id": None,
            "instructions": None,
            "output": [],
            "error": None,
            "tools": [],
            "tool_choice": "auto",
            "truncation": "disabled",
            "parallel_tool_calls": True,
            "text": {"format": {"type": "text"}},
            "top_p": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "top_logprobs": 0,
            "temperature": 1.0,
            "reasoning": None,
            "usage": None,
            "max_output_tokens": None,
            "max_tool_calls": None,
            "store": True,
            "background": False,
            "service_tier": "default",
            "metadata": {},
            "safety_identifier": None,
            "prompt_cache_key": None,
        }
    )


def as_json(events: list[Event]) -> list[dict[str, Any]]:
    return [event.to_json() for event in events]


def builder() -> ResponseEvents:
    counter = itertools.count()
    return ResponseEvents(base_resource(), new_id=lambda prefix: f"{prefix}_{next(counter)}")


def run(
    chunks: list[pb.GenerateChunk], result: pb.GenerateResult
) -> tuple[ResponseEvents, list[dict[str, Any]]]:
    events_builder = builder()
    sent = events_builder.start()
    for chunk in chunks:
        sent += events_builder.chunk(chunk)
    sent += events_builder.complete(result)
    events = as_json(sent)
    for event in events:
        if event["type"] in EVENT_SCHEMAS:
            assert_valid(event, EVENT_SCHEMAS[event["type"]])
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    return events_builder, events


def text(value: str) -> pb.GenerateChunk:
    return pb.GenerateChunk(text=value)


def call(name: str, call_id: str = "") -> pb.ToolCall:
    return pb.ToolCall(id=call_id, name=name, arguments="{}")


def output_summary(events_builder: ResponseEvents) -> list[tuple[str, str]]:
    summary = []
    for item in events_builder.snapshot().to_json()["output"]:
        value = item["content"][0]["text"] if item["type"] == "message" else item["name"]
        summary.append((item["type"], value))
    return summary


CASES = [
    pytest.param([text("Hi")], pb.GenerateResult(text="Hi"), [("message", "Hi")], id="text"),
    pytest.param(
        [], pb.GenerateResult(text="Unstreamed"), [("message", "Unstreamed")], id="text-only-in-result"
    ),
    pytest.param(
        [text("Hel")], pb.GenerateResult(text="Hello"), [("message", "Hello")], id="result-extends-stream"
    ),
    pytest.param([], pb.GenerateResult(), [("message", "")], id="empty-answer-still-a-message"),
    pytest.param(
        [text("\n"), pb.GenerateChunk(tool_call=call("f", "c1"))],
        pb.GenerateResult(text="\n", tool_calls=[call("f", "c1")]),
        [("function_call", "f")],
        id="whitespace-before-call-is-no-message",
    ),
    pytest.param(
        [],
        pb.GenerateResult(tool_calls=[call("f", "c1"), call("g", "c2")]),
        [("function_call", "f"), ("function_call", "g")],
        id="calls-only-in-result",
    ),
    pytest.param(
        [text("A"), pb.GenerateChunk(tool_call=call("f", "c1")), text("B")],
        pb.GenerateResult(text="AB", tool_calls=[call("f", "c1")]),
        [("message", "A"), ("function_call", "f"), ("message", "B")],
        id="text-after-a-call-opens-a-new-message",
    ),
]


@pytest.mark.parametrize(("chunks", "result", "expected"), CASES)
def test_outputs(chunks: list[pb.GenerateChunk], result: pb.GenerateResult, expected: list[Any]) -> None:
    events_builder, events = run(chunks, result)
    assert output_summary(events_builder) == expected
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["output"] == events_builder.snapshot().to_json()["output"]
    # Every item that was added is also done, in the same order.
    added = [e["item"]["id"] for e in events if e["type"] == "response.output_item.added"]
    done = [e["item"]["id"] for e in events if e["type"] == "response.output_item.done"]
    assert added == done == [item["id"] for item in events_builder.snapshot().to_json()["output"]]


def test_call_without_an_id_gets_one() -> None:
    events_builder, _ = run([], pb.GenerateResult(tool_calls=[call("f")]))
    assert events_builder.snapshot().to_json()["output"][0]["call_id"].startswith("call_")


def test_cancelled_result_is_cancelled() -> None:
    events_builder, events = run(
        [text("par")], pb.GenerateResult(text="par", finish_reason=pb.FINISH_REASON_CANCELLED)
    )
    assert events[-1]["type"] == "response.incomplete"
    assert events_builder.resource.status == "cancelled"


def test_failure_keeps_partial_text_and_ends_failed() -> None:
    events_builder = builder()
    sent = events_builder.start() + events_builder.chunk(text("par"))
    sent += events_builder.fail(APIError(503, "The engine is unavailable.", code="engine_unavailable"))
    events = as_json(sent)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    for event in events[-2:]:
        assert_valid(event, EVENT_SCHEMAS[event["type"]])
    final = events[-1]["response"]
    assert final["status"] == "failed"
    assert final["output"][0]["status"] == "incomplete" and final["output"][0]["content"][0]["text"] == "par"
    assert events_builder.finished


def test_usage_comes_from_the_result() -> None:
    usage = pb.Usage(input_tokens=5, output_tokens=7, cached_tokens=1)
    events_builder, _ = run([text("x")], pb.GenerateResult(text="x", usage=usage))
    assert events_builder.resource.usage.total_tokens == 12


def token(text: str, logprob: float, *alternatives: tuple[str, float]) -> pb.TokenLogprob:
    return pb.TokenLogprob(
        token=text,
        logprob=logprob,
        top_logprobs=[pb.TopLogprob(token=t, logprob=lp) for t, lp in alternatives],
    )


def logprob_json(entry: pb.TokenLogprob) -> dict[str, Any]:
    return {
        "token": entry.token,
        "logprob": pytest.approx(entry.logprob),
        "bytes": list(entry.token.encode()),
        "top_logprobs": [
            {"token": t.token, "logprob": pytest.approx(t.logprob), "bytes": list(t.token.encode())}
            for t in entry.top_logprobs
        ],
    }


def test_logprobs_stream_with_their_deltas_and_fill_the_part() -> None:
    # "\n" alone is held (no message yet); "" carries a token settled after the last text.
    tokens = [
        token("\n", -0.5),
        token("Hé", -0.25, ("Hé", -0.25), ("Ho", -1.5)),
        token("", -2.0),
        token("!", -0.1),
    ]
    chunks = [
        pb.GenerateChunk(text="\n", logprobs=tokens[:1]),
        pb.GenerateChunk(text="Hé", logprobs=tokens[1:2]),
        pb.GenerateChunk(text="", logprobs=tokens[2:3]),
    ]
    # The last token was never streamed: it comes from the result with the text it spells.
    events_builder, events = run(chunks, pb.GenerateResult(text="\nHé!", logprobs=tokens))
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [e["delta"] for e in deltas] == ["\nHé", "", "!"]
    streamed = [entry for e in deltas for entry in e["logprobs"]]
    assert streamed == [logprob_json(entry) for entry in tokens]
    (done,) = [e for e in events if e["type"] == "response.output_text.done"]
    assert done["logprobs"] == streamed
    part = events_builder.snapshot().to_json()["output"][0]["content"][0]
    assert part["text"] == "\nHé!" and part["logprobs"] == streamed
    assert "".join(entry["token"] for entry in part["logprobs"]) == part["text"]


def test_without_logprobs_the_lists_stay_empty() -> None:
    events_builder, events = run([text("Hi")], pb.GenerateResult(text="Hi"))
    assert all(e.get("logprobs", []) == [] for e in events)
    assert events_builder.snapshot().to_json()["output"][0]["content"][0]["logprobs"] == []

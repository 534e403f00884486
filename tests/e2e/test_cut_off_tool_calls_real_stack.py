"""A tool call the token limit cuts off, on the real stack (default model, forced call): one
`incomplete` function_call item on /v1/responses, its arguments as far as written, streamed or
not; on /v1/chat/completions left out of a whole completion and streamed as far as written; no
markup anywhere as text."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.facade.helpers import parse_sse, stream_events

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
CUT_OFF = 16


def responses_body(*, stream: bool) -> dict[str, Any]:
    return {
        "model": "default",
        "input": "What is the weather in Paris?",
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": CUT_OFF,
        "stream": stream,
    }


def assert_one_cut_off_call(response: dict[str, Any]) -> None:
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    [item] = response["output"]
    assert item["type"] == "function_call" and item["status"] == "incomplete"
    assert item["name"] == "get_weather"
    assert item["arguments"] and "<tool_call>" not in item["arguments"]
    # As far as written: the start of a JSON object, not a whole one.
    assert item["arguments"].startswith("{")
    with pytest.raises(ValueError):
        json.loads(item["arguments"])


@pytest.fixture(scope="module")
def http(facade_url: str) -> httpx.Client:
    return httpx.Client(base_url=facade_url, timeout=120)


def test_responses_plain(http: httpx.Client) -> None:
    reply = http.post("/v1/responses", json=responses_body(stream=False))
    assert reply.status_code == 200, reply.text
    assert "<tool_call>" not in reply.text
    assert_one_cut_off_call(reply.json())


def test_responses_streamed(http: httpx.Client) -> None:
    reply = http.post("/v1/responses", json=responses_body(stream=True))
    assert reply.status_code == 200, reply.text
    assert "tool_call>" not in reply.text
    events = stream_events(reply.text)
    kinds = [event["type"] for event in events]
    assert "response.output_text.delta" not in kinds
    added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
    assert added == ["function_call"]
    assert_one_cut_off_call(events[-1]["response"])
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert deltas == events[-1]["response"]["output"][0]["arguments"]


def chat_body(*, stream: bool) -> dict[str, Any]:
    function = {key: WEATHER[key] for key in ("name", "description", "parameters")}
    return {
        "model": "default",
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [{"type": "function", "function": function}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": CUT_OFF,
        "stream": stream,
    }


def test_chat_plain(http: httpx.Client) -> None:
    reply = http.post("/v1/chat/completions", json=chat_body(stream=False))
    assert reply.status_code == 200, reply.text
    assert "<tool_call>" not in reply.text
    [choice] = reply.json()["choices"]
    assert choice["finish_reason"] == "length"
    # Chat has no status to mark a call unfinished, so a client would run what it got: the cut-off
    # call is left out (as on Messages) and the completion is its empty text (issue 36.3).
    assert choice["message"]["content"] == ""
    assert choice["message"]["tool_calls"] is None


def test_chat_streamed(http: httpx.Client) -> None:
    reply = http.post("/v1/chat/completions", json=chat_body(stream=True))
    assert reply.status_code == 200, reply.text
    assert "tool_call>" not in reply.text
    chunks = [event.json() for event in parse_sse(reply.text)[:-1]]
    deltas = [choice["delta"] for chunk in chunks for choice in chunk["choices"]]
    assert not any(delta.get("content") for delta in deltas)
    finishes = [c["finish_reason"] for chunk in chunks for c in chunk["choices"] if c["finish_reason"]]
    assert finishes == ["length"]
    calls = [call for delta in deltas for call in delta.get("tool_calls") or []]
    assert calls[0]["function"]["name"] == "get_weather"
    assert {call["index"] for call in calls} == {0}

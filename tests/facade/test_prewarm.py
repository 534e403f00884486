"""`prompt_cache_options.prewarm` (issue 36.1): the prompt is prefilled (one engine call, one
token) and nothing is answered: `completed`, empty `output`, the prompt's usage; not stored."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.facade.fake_engine import FakeEngine
from tests.facade.helpers import parse_sse

WARM = {"prewarm": True}


async def test_a_prewarm_answers_nothing(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    body = {"model": "default", "input": "A long shared prefix.", "prompt_cache_options": WARM}
    reply = await http.post("/v1/responses", json=body)
    assert reply.status_code == 200, reply.text
    resource = reply.json()
    assert (resource["status"], resource["output"], resource["incomplete_details"]) == ("completed", [], None)
    assert resource["usage"]["input_tokens"] == 11
    (sent,) = engine.requests
    assert sent.sampling.max_tokens == 1
    assert (await http.get(f"/v1/responses/{resource['id']}")).status_code == 404


async def test_its_stream_is_the_lifecycle_only(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    body = {"model": "default", "input": "hi", "prompt_cache_options": WARM, "stream": True}
    reply = await http.post("/v1/responses", json=body)
    events = [json.loads(e.data) for e in parse_sse(reply.text) if e.data != "[DONE]"]
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.completed"]
    assert [e["sequence_number"] for e in events] == [0, 1, 2]
    assert events[-1]["response"]["output"] == []


async def test_prewarm_false_is_an_ordinary_response(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    body = {"model": "default", "input": "hi", "prompt_cache_options": {"prewarm": False}}
    reply = await http.post("/v1/responses", json=body)
    assert reply.json()["output"][0]["type"] == "message"


@pytest.mark.parametrize(
    ("value", "param"),
    [
        (True, "prompt_cache_options"),
        ({"prewarm": "yes"}, "prompt_cache_options.prewarm"),
        ({"x": 1}, "prompt_cache_options.x"),
    ],
)
async def test_bad_values_are_400s(
    http: httpx.AsyncClient, engine: FakeEngine, value: object, param: str
) -> None:
    reply = await http.post(
        "/v1/responses", json={"model": "default", "input": "hi", "prompt_cache_options": value}
    )
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param

"""Bad inputs that still failed badly (issue 26, finding 7, the parts not about PDFs): a
background stream resumed with `starting_after` >= 2**63 was a 200 whose stream was then cut (the
store's 64-bit integer overflowed); and (finding 13) an llguidance limit hit during a required
tool call, which came back `completed` and empty. The other part, 10 MB of arguments to /input_tokens, is
refused by the engine before tokenizing (tests/engine/test_request_prep.py)."""

from __future__ import annotations

import grpc
import httpx

from tests.facade.fake_engine import FakeEngine, Script
from tests.facade.helpers import stream_events
from vlmserve.client import AsyncEngineClient
from vlmserve.engine.request_errors import RequestError
from vlmserve.facade import FacadeSettings, Store, create_app


async def test_a_resume_point_past_64_bits_is_a_400_naming_it(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store
) -> None:
    app = create_app(settings, engine=engine_client, store=store)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        await _resume_past_64_bits(http)


async def _resume_past_64_bits(http: httpx.AsyncClient) -> None:
    created = await http.post("/v1/responses", json={"input": "hi", "background": True})
    response_id = created.json()["id"]
    for value in (2**63, 2**64 + 5, 10**30):
        reply = await http.get(
            f"/v1/responses/{response_id}", params={"stream": "true", "starting_after": value}
        )
        assert reply.status_code == 400, (value, reply.text[:200])
        assert reply.headers["content-type"].startswith("application/json")
        assert reply.json()["error"]["param"] == "starting_after"
    # The largest the store can compare is fine: nothing after it, the stream ends cleanly.
    reply = await http.get(
        f"/v1/responses/{response_id}", params={"stream": "true", "starting_after": 2**63 - 1}
    )
    assert reply.status_code == 200
    assert reply.text.rstrip().endswith("data: [DONE]")


async def test_a_grammar_limit_is_a_failed_response_with_its_reason(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store, engine: FakeEngine
) -> None:
    """Issue 26.13, the facade's half: the engine's ABORTED (constrained decoding stopped by an
    llguidance limit, tests/engine/test_grammar_limits.py) is a failed response naming it,
    never `completed` and empty."""
    engine.script = Script(
        text_chunks=["<tool_call>", '{"name": "wea'],
        error=RequestError(grpc.StatusCode.ABORTED, "constrained decoding stopped: lexer error: too many"),
        error_after=1,
    )
    body = {
        "input": "Weather?",
        "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}}],
        "tool_choice": "required",
    }
    app = create_app(settings, engine=engine_client, store=store)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        plain = await http.post("/v1/responses", json=body)
        assert plain.status_code == 500
        error = plain.json()["error"]
        assert error["code"] == "constrained_decoding_failed" and "too many" in error["message"]
        streamed = await http.post("/v1/responses", json={**body, "stream": True})
        events = stream_events(streamed.text)
        assert events[-1]["type"] == "response.failed"
        assert events[-1]["response"]["error"]["code"] == "constrained_decoding_failed"
        stored = await http.get(f"/v1/responses/{events[-1]['response']['id']}")
        assert stored.json()["status"] == "failed"

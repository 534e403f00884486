"""An llguidance limit hit during a required tool call came back `completed` and empty (issue
26, finding 13): the engine's ABORTED is a failed response naming it. (10 MB of arguments to
/input_tokens, the finding's other part, is refused by the engine before tokenizing:
tests/engine/test_request_prep.py.)"""

from __future__ import annotations

import grpc

from tests.facade.fake_engine import FakeEngine, Script
from tests.facade.helpers import in_process, stream_events
from vlmserve.client import AsyncEngineClient
from vlmserve.engine.request_errors import RequestError
from vlmserve.facade import FacadeSettings, Store, create_app


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
    async with in_process(app) as http:
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

"""An engine restarted on another model (issue 39, finding 7): the facade answered 404 for
`default` (and every request) until its cached model info expired (30 s). On the engine's "not
served here" answer it now refreshes the model info and retries once."""

from __future__ import annotations

from typing import Any

import pytest

from tests.facade.fake_engine import MODEL_ID, FakeEngine, model_info
from tests.facade.helpers import in_process
from vlmserve.client import AsyncEngineClient
from vlmserve.facade import FacadeSettings, Store, create_app

OTHER = "fixture/another-vlm"

CREATES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/responses", {"input": "hi"}),
    ("/v1/responses", {"input": "hi", "stream": True}),
    ("/v1/chat/completions", {"model": "default", "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/messages", {"model": "default", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/responses/input_tokens", {"input": "hi"}),
    ("/v1/messages/count_tokens", {"model": "default", "messages": [{"role": "user", "content": "hi"}]}),
]


def _restarted_on_another_model(engine: FakeEngine) -> None:
    engine.checks_model = True
    engine.info = model_info()
    engine.info.model_id = OTHER


@pytest.mark.parametrize(
    ("path", "body"), CREATES, ids=[f"{p}{'+stream' if b.get('stream') else ''}" for p, b in CREATES]
)
async def test_a_model_changed_under_the_facade_is_found_again_at_once(
    settings: FacadeSettings,
    engine_client: AsyncEngineClient,
    store: Store,
    engine: FakeEngine,
    path: str,
    body: dict[str, Any],
) -> None:
    app = create_app(settings.replace(model_info_ttl_s=3600.0), engine=engine_client, store=store)
    async with in_process(app) as http:
        assert (await http.post(path, json=body)).status_code == 200
        _restarted_on_another_model(engine)
        reply = await http.post(path, json=body)
        assert reply.status_code == 200, reply.text
        sent = engine.count_requests if "tokens" in path else engine.requests
        assert [request.model for request in sent[-2:]] == [MODEL_ID, OTHER]
        # The info is fresh from then on: one call per request again.
        before = len(sent)
        assert (await http.post(path, json=body)).status_code == 200
        assert len(sent) == before + 1 and sent[-1].model == OTHER


async def test_a_request_for_the_old_engine_id_is_not_sent_to_the_new_model(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store, engine: FakeEngine
) -> None:
    app = create_app(settings.replace(model_info_ttl_s=3600.0), engine=engine_client, store=store)
    async with in_process(app) as http:
        assert (await http.post("/v1/responses", json={"model": MODEL_ID, "input": "hi"})).status_code == 200
        _restarted_on_another_model(engine)
        reply = await http.post("/v1/responses", json={"model": MODEL_ID, "input": "hi"})
        assert reply.status_code == 404, reply.text
        assert reply.json()["error"]["code"] == "model_not_found"
        assert [request.model for request in engine.requests] == [MODEL_ID, MODEL_ID]

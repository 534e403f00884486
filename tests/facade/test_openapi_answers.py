"""The OpenAPI document lists what the routes really answer (issue 39, finding 8: it listed only
200 and FastAPI's 422, which the app never sends): the error statuses in OpenAI's (or
Anthropic's) shape, event streams where a route streams, a file's own types for its content."""

from __future__ import annotations

from typing import Any

import pytest

from tests.facade.fake_engine import FakeEngine, Script
from tests.facade.helpers import in_process
from vlmserve.client import AsyncEngineClient
from vlmserve.facade import FacadeSettings, Limits, Store, create_app
from vlmserve.facade.settings.api_keys import ApiKeys

KEY = "sk-openapi-answers"
AUTH = {"Authorization": f"Bearer {KEY}", "x-api-key": KEY}
HI = {"role": "user", "content": "hi"}


def _documented(app: Any, method: str, path: str) -> dict[str, Any]:
    operation = app.openapi()["paths"][path][method.lower()]
    return operation["responses"]


def test_every_operation_documents_its_errors_and_never_422(tmp_path: Any) -> None:
    app = create_app(FacadeSettings(store_path=tmp_path / "s.sqlite3", engine_address="127.0.0.1:1"))
    document = app.openapi()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            answers = operation["responses"]
            assert "422" not in answers, (method, path)
            if path == "/healthz":
                continue
            errors = {code: answer for code, answer in answers.items() if code != "200"}
            assert errors, (method, path)
            shape = "AnthropicError" if path.startswith("/v1/messages") else "Error"
            for answer in errors.values():
                assert answer["content"]["application/json"]["schema"]["$ref"].endswith(f"/{shape}")
    for path in ("/v1/responses", "/v1/chat/completions", "/v1/messages"):
        answers = document["paths"][path]["post"]["responses"]
        assert "text/event-stream" in answers["200"]["content"]
        assert {"400", "404", "413", "429", "503"} <= set(answers)
    content = document["paths"]["/v1/files/{file_id}/content"]["get"]["responses"]["200"]["content"]
    assert {"application/pdf", "image/png", "text/plain"} <= set(
        content
    ) and "application/json" not in content


async def test_the_statuses_the_routes_answer_are_documented(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store, engine: FakeEngine
) -> None:
    keyed = settings.replace(
        api_keys=ApiKeys.from_keys([KEY]),
        limits=Limits(max_request_bytes=4096, max_responses_per_key=1, max_request_parts=5),
    )
    app = create_app(keyed, engine=engine_client, store=store)
    big = "x" * 5000
    calls: list[tuple[str, str, dict[str, Any], int]] = [
        ("POST", "/v1/responses", {"json": {"input": 5}}, 400),
        ("POST", "/v1/responses", {"json": {"model": "nope", "input": "hi"}}, 404),
        ("POST", "/v1/responses", {"json": {"input": big}}, 413),
        ("POST", "/v1/responses/input_tokens", {"json": {"input": [HI] * 6}}, 400),
        ("POST", "/v1/chat/completions", {"json": {"model": "nope", "messages": [HI]}}, 404),
        ("POST", "/v1/chat/completions", {"json": {"messages": [HI], "x": big}}, 413),
        ("POST", "/v1/messages", {"json": {"model": "default", "max_tokens": 0, "messages": [HI]}}, 400),
        ("POST", "/v1/messages", {"json": {"model": "nope", "max_tokens": 5, "messages": [HI]}}, 404),
        ("POST", "/v1/messages/count_tokens", {"json": {"model": "d", "messages": [HI], "x": big}}, 413),
        ("GET", "/v1/responses/{response_id}", {"path": "resp_nope"}, 404),
        ("GET", "/v1/models/{model_id}", {"path": "nope"}, 404),
        ("GET", "/v1/files/{file_id}", {"path": "file-nope"}, 404),
        ("GET", "/v1/conversations/{conversation_id}/items", {"path": "conv_nope"}, 404),
        ("POST", "/v1/responses/compact", {"json": {"model": "default"}}, 400),
        ("GET", "/v1/models", {"headers": {}}, 401),
    ]
    async with in_process(app) as http:
        for method, path, options, status in calls:
            url = path.split("{")[0] + options.get("path", "") if "{" in path else path
            if path == "/v1/conversations/{conversation_id}/items":
                url = f"/v1/conversations/{options['path']}/items"
            reply = await http.request(
                method, url, json=options.get("json"), headers=options.get("headers", AUTH)
            )
            assert reply.status_code == status, (path, reply.text)
            assert str(status) in _documented(app, method, path), (method, path, status)
        # A key at its limit: 429; the engine's full queue: 503.
        engine.script = Script(hang=True)
        held = await http.post(
            "/v1/responses", json={"input": "hi", "background": True, "store": True}, headers=AUTH
        )
        assert held.status_code == 200
        refused = await http.post("/v1/responses", json={"input": "hi"}, headers=AUTH)
        assert refused.status_code == 429 and "429" in _documented(app, "POST", "/v1/responses")
        await http.post(f"/v1/responses/{held.json()['id']}/cancel", headers=AUTH)


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_the_probes_need_no_key(path: str, tmp_path: Any) -> None:
    app = create_app(FacadeSettings(store_path=tmp_path / "s.sqlite3", engine_address="127.0.0.1:1"))
    assert "401" not in app.openapi()["paths"][path]["get"]["responses"]

"""GET /v1/models, /healthz, /readyz and POST /v1/responses/input_tokens."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import grpc
import httpx
import jsonschema  # type: ignore[import-untyped]
import pytest
from openai.types.conversations import Conversation, ConversationDeletedResource
from openai.types.responses import InputTokenCountResponse

from tests.facade.fake_engine import CONTEXT_LENGTH, MODEL_ID, FakeEngine, RunningFakeEngine
from tests.facade.helpers import png_data_url
from vlmserve.responses import CreateResponseBody

CODEX_DATA = Path(__file__).resolve().parents[1] / "codex" / "data"


async def test_models_list_names_the_loaded_model(http: httpx.AsyncClient) -> None:
    response = await http.get("/v1/models")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    (model,) = body["data"]
    assert (model["id"], model["object"], model["owned_by"]) == (MODEL_ID, "model", "vlmserve")
    assert isinstance(model["created"], int)
    assert model["vlmserve"]["input_modalities"] == ["text", "image"]


@pytest.mark.parametrize("name", [MODEL_ID, "default"])
async def test_model_retrieve_by_id_or_alias(http: httpx.AsyncClient, name: str) -> None:
    response = await http.get(f"/v1/models/{name}")
    assert response.status_code == 200
    assert response.json()["id"] == MODEL_ID


async def test_unknown_model_retrieve_is_404(http: httpx.AsyncClient) -> None:
    response = await http.get("/v1/models/gpt-4o")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"


async def test_healthz_does_not_need_the_engine(
    http: httpx.AsyncClient, fake_engine: RunningFakeEngine
) -> None:
    await fake_engine.stop()
    response = await http.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


async def test_readyz_follows_engine_health(http: httpx.AsyncClient, fake_engine: RunningFakeEngine) -> None:
    ready = await http.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "model": MODEL_ID, "models": {MODEL_ID: "serving"}}
    await fake_engine.set_serving(False)
    not_serving = await http.get("/readyz")
    assert not_serving.status_code == 503
    assert not_serving.json()["error"]["code"] == "engine_unavailable"
    await fake_engine.set_serving(True)
    assert (await http.get("/readyz")).status_code == 200
    await fake_engine.stop()
    assert (await http.get("/readyz")).status_code == 503


async def test_input_tokens_counts_through_the_engine(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    body = {
        "model": "default",
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "three small words"},
                    {"type": "input_image", "image_url": png_data_url()},
                ],
            }
        ],
    }
    response = await http.post("/v1/responses/input_tokens", json=body)
    assert response.status_code == 200, response.text
    # The fake engine counts words plus ten per image: the request reached it lowered and whole.
    assert response.json() == {"object": "response.input_tokens", "input_tokens": 3 + 10}
    (counted,) = engine.count_requests
    assert counted.model == MODEL_ID
    assert engine.requests == []


async def test_input_tokens_errors(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    bad = await http.post("/v1/responses/input_tokens", json={"model": "default", "input": [{"type": "x"}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input[0].type"
    unknown = await http.post("/v1/responses/input_tokens", json={"model": "nope", "input": "hi"})
    assert unknown.status_code == 404
    engine.script.error = (grpc.StatusCode.OUT_OF_RANGE, "too long")
    too_long = await http.post("/v1/responses/input_tokens", json={"model": "default", "input": "hi"})
    error = too_long.json()["error"]
    assert too_long.status_code == 400 and error["code"] == "context_length_exceeded"
    assert str(CONTEXT_LENGTH) in error["message"]


async def test_openapi_document_lists_every_endpoint(http: httpx.AsyncClient) -> None:
    paths = (await http.get("/openapi.json")).json()["paths"]
    assert {
        "/v1/responses",
        "/v1/responses/input_tokens",
        "/v1/responses/{response_id}",
        "/v1/responses/{response_id}/input_items",
        "/v1/responses/{response_id}/cancel",
        "/v1/conversations",
        "/v1/models",
        "/healthz",
        "/readyz",
    } <= set(paths)
    body = paths["/v1/responses"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/CreateResponseBody"}


async def test_openapi_schemas_are_the_models(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    """The document is generated from the request and response models: every reference
    resolves, Codex's recorded bodies validate against the request schema, and a created
    response validates against the response schema."""
    document = (await http.get("/openapi.json")).json()
    schemas = document["components"]["schemas"]
    text = json.dumps(document)
    for name in set(re.findall(r'"#/components/schemas/([^"]+)"', text)):
        assert name in schemas, name
    assert set(schemas["CreateResponseBody"]["properties"]) == set(CreateResponseBody.model_fields)
    assert schemas["CreateResponseBody"]["required"] == ["input"]

    def validator(name: str) -> jsonschema.Draft202012Validator:
        return jsonschema.Draft202012Validator({"$ref": f"#/components/schemas/{name}", **document})

    for recorded in (
        CODEX_DATA / "codex_request_turn2.json",
        CODEX_DATA / "codex_request_known_model_turn1.json",
    ):
        validator("CreateResponseBody").validate(json.loads(recorded.read_text()))
    created = await http.post("/v1/responses", json={"model": "default", "input": "hi"})
    validator("ResponseResource").validate(created.json())
    links = paths_links(document, "/v1/responses")
    assert {link["operationId"] for link in links.values()} >= {"retrieveResponse", "cancelResponse"}


def paths_links(document: dict[str, Any], path: str) -> dict[str, Any]:
    links: dict[str, Any] = document["paths"][path]["post"]["responses"]["200"]["links"]
    return links


async def test_conversation_answers_parse_as_openai_types(http: httpx.AsyncClient) -> None:
    """The other answers are exact models too; OpenAI's own types read them."""
    created = (await http.post("/v1/conversations", json={"metadata": {"k": "v"}})).json()
    assert Conversation.model_validate(created).metadata == {"k": "v"}
    retrieved = (await http.get(f"/v1/conversations/{created['id']}")).json()
    assert retrieved == created
    deleted = (await http.delete(f"/v1/conversations/{created['id']}")).json()
    assert ConversationDeletedResource.model_validate(deleted).deleted
    counted = (await http.post("/v1/responses/input_tokens", json={"model": "default", "input": "hi"})).json()
    assert InputTokenCountResponse.model_validate(counted).input_tokens == counted["input_tokens"] > 0

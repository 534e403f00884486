"""The doors left open for hardening: a per-request image source and an owner-setting dependency."""

from __future__ import annotations

from fastapi import Depends, Request

from tests.facade.fake_engine import FakeEngine
from tests.facade.helpers import in_process, png_bytes
from vlmserve.client import AsyncEngineClient
from vlmserve.facade import FacadeSettings, Store, create_app


async def test_image_source_factory_fetches_remote_urls(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store, engine: FakeEngine
) -> None:
    image = png_bytes((9, 9, 9))
    fetched: list[str] = []

    def fetch(url: str) -> bytes:
        fetched.append(url)
        return image

    app = create_app(settings, engine=engine_client, store=store, image_sources=lambda: fetch)
    content = [{"type": "input_image", "image_url": "https://images.example/a.png"}]
    async with in_process(app) as http:
        response = await http.post("/v1/responses", json={"input": [{"role": "user", "content": content}]})
    assert response.status_code == 200, response.text
    assert fetched == ["https://images.example/a.png"]
    assert engine.requests[0].messages[0].parts[0].image.data == image


async def test_owner_dependency_separates_stored_objects(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store
) -> None:
    def owner_from_header(request: Request) -> None:
        request.state.owner = request.headers.get("x-test-owner", "")

    app = create_app(settings, engine=engine_client, store=store, dependencies=[Depends(owner_from_header)])
    async with in_process(app) as http:
        alice, bob = {"x-test-owner": "alice"}, {"x-test-owner": "bob"}
        created = (await http.post("/v1/responses", json={"input": "hi"}, headers=alice)).json()
        path = f"/v1/responses/{created['id']}"
        assert (await http.get(path, headers=alice)).status_code == 200
        for response in (
            await http.get(path, headers=bob),
            await http.get(f"{path}/input_items", headers=bob),
            await http.delete(path, headers=bob),
        ):
            assert response.status_code == 404
        # Continuing another owner's response reads exactly as continuing an unknown one: OpenAI's
        # 400 previous_response_not_found, so the answer reveals nothing of alice's response.
        foreign = await http.post(
            "/v1/responses", json={"input": "x", "previous_response_id": created["id"]}, headers=bob
        )
        unknown = await http.post(
            "/v1/responses", json={"input": "x", "previous_response_id": "resp_unknown"}, headers=bob
        )
        assert foreign.status_code == unknown.status_code == 400
        assert (
            foreign.json()["error"]["code"]
            == unknown.json()["error"]["code"]
            == "previous_response_not_found"
        )
        assert (await http.get("/healthz")).status_code == 200

"""GET /metrics: the facade's Prometheus figures move by what its requests did (routes and
status codes, responses by status, tokens, images and bytes, time to first output)."""

from __future__ import annotations

import grpc
import httpx
import pytest
from fastapi import FastAPI

from tests._prometheus import metric_samples, moved
from tests.facade.fake_engine import FakeEngine
from tests.facade.helpers import in_process, png_bytes, png_data_url
from vlmserve.client import AsyncEngineClient
from vlmserve.facade import FacadeSettings, Store, create_app
from vlmserve.facade.settings.api_keys import ApiKeys


async def scrape(http: httpx.AsyncClient, **headers: str) -> dict[str, float]:
    response = await http.get("/metrics", headers=headers)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return metric_samples(response.text)


def http_count(method: str, route: str, status: int) -> str:
    return f'vlmserve_facade_http_requests_total{{method="{method}",route="{route}",status="{status}"}}'


async def test_requests_responses_tokens_and_images_are_counted(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    before = await scrape(http)
    image = {"type": "input_image", "image_url": png_data_url((0, 255, 0), (20, 20))}
    created = await http.post(
        "/v1/responses",
        json={"model": "default", "input": [{"role": "user", "content": [image]}]},
    )
    assert created.status_code == 200
    streamed = await http.post("/v1/responses", json={"model": "default", "input": "hi", "stream": True})
    assert streamed.status_code == 200
    missing = await http.get("/v1/responses/resp_" + "0" * 48)
    assert missing.status_code == 404
    assert (await http.get("/no/such/path")).status_code == 404
    after = await scrape(http)

    assert moved(before, after, http_count("POST", "/v1/responses", 200)) == 2
    # The route's template, never the raw path (ids would make a label per response).
    assert moved(before, after, http_count("GET", "/v1/responses/{response_id}", 404)) == 1
    assert moved(before, after, http_count("GET", "unmatched", 404)) == 1
    assert moved(before, after, 'vlmserve_facade_responses_total{status="completed"}') == 2
    # The fake engine's usage: 11 in, 3 out per response.
    assert moved(before, after, "vlmserve_facade_input_tokens_total") == 22
    assert moved(before, after, "vlmserve_facade_output_tokens_total") == 6
    assert moved(before, after, "vlmserve_facade_images_total") == 1
    assert moved(before, after, "vlmserve_facade_image_bytes_total") == len(png_bytes((0, 255, 0), (20, 20)))
    assert moved(before, after, "vlmserve_facade_time_to_first_output_seconds_count") == 2
    assert (
        moved(
            before,
            after,
            'vlmserve_facade_http_request_duration_seconds_count{method="POST",route="/v1/responses"}',
        )
        == 2
    )
    assert after["vlmserve_facade_running_responses"] == 0


async def test_a_failed_response_is_counted_as_failed(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    before = await scrape(http)
    engine.script.error = (grpc.StatusCode.INTERNAL, "boom")
    engine.script.error_after = 1
    streamed = await http.post("/v1/responses", json={"model": "default", "input": "hi", "stream": True})
    assert "response.failed" in streamed.text
    after = await scrape(http)
    assert moved(before, after, 'vlmserve_facade_responses_total{status="failed"}') == 1


@pytest.fixture
def keyed_app(settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store) -> FastAPI:
    keys = settings.replace(
        api_keys=ApiKeys.from_keys(["sk-client"]), operator_keys=ApiKeys.from_keys(["sk-metrics-test"])
    )
    return create_app(keys, engine=engine_client, store=store)


async def test_metrics_need_an_operator_key_when_keys_are_configured(keyed_app: FastAPI) -> None:
    async with in_process(keyed_app) as client:
        assert (await client.get("/metrics")).status_code == 401
        # A client's key is not enough (tests/hardening/test_metrics_exposure.py).
        assert (
            await client.get("/metrics", headers={"authorization": "Bearer sk-client"})
        ).status_code == 403
        samples = await scrape(client, authorization="Bearer sk-metrics-test")
        # The refused scrape was counted too (the middleware is outside the key check).
        assert samples[http_count("GET", "/metrics", 401)] == 1

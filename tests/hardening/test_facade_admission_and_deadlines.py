"""A full engine queue is a 503 with Retry-After; a hung engine never hangs the facade, because
every facade -> engine call carries a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.facade.fake_engine import FakeEngine, Script
from tests.facade.helpers import in_process, stream_events
from vlmserve.client import ENGINE_SERVICE_NAME, AsyncEngineClient
from vlmserve.engine.request_errors import RequestError
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc
from vlmserve.facade import FacadeSettings, Store, Timeouts, create_app
from vlmserve.facade.responses import preparation as service_module

HANG_S = 3600.0


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/responses", {"input": "hi"}),
        ("/v1/responses", {"input": "hi", "stream": True}),
        ("/v1/responses/input_tokens", {"input": "hi"}),
    ],
)
async def test_a_full_engine_queue_is_a_503_with_the_configured_retry_after(
    settings: FacadeSettings,
    engine_client: AsyncEngineClient,
    store: Store,
    engine: FakeEngine,
    path: str,
    body: dict[str, Any],
) -> None:
    engine.script = Script(
        error=RequestError(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full (64 waiting)", retry_after_s=1.0)
    )
    app = create_app(settings.replace(retry_after_s=7), engine=engine_client, store=store)
    async with in_process(app) as http:
        reply = await http.post(path, json=body)
    assert reply.status_code == 503
    assert reply.headers["retry-after"] == "7"
    assert reply.json()["error"] == {
        "message": "The engine is at capacity; retry shortly.",
        "type": "server_error",
        "param": None,
        "code": "engine_overloaded",
    }


async def test_a_message_over_grpc_size_limits_is_a_413_not_a_retry(
    settings: FacadeSettings,
    engine_client: AsyncEngineClient,
    store: Store,
    engine: FakeEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RESOURCE_EXHAUSTED without the engine's RetryInfo is gRPC's "message larger than max":
    retrying would never help."""
    app = create_app(settings, engine=engine_client, store=store)
    async with in_process(app) as http:
        engine.script = Script(
            error=(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "Received message larger than max (5000000 vs. 4194304)",
            )
        )
        reply = await http.post("/v1/responses", json={"input": "hi"})
        assert (reply.status_code, reply.json()["error"]["param"]) == (413, "input")
        assert "retry-after" not in reply.headers
        # The facade checks the size it would send before sending it.
        engine.script = Script()
        monkeypatch.setattr(service_module, "MAX_MESSAGE_BYTES", 1000)
        reply = await http.post("/v1/responses", json={"input": "x" * 2000})
        assert (reply.status_code, reply.json()["error"]["code"]) == (413, "request_too_large")
        assert len(engine.requests) == 1


class HangingEngine(FakeEngine):
    """Answers nothing, ever, on the calls named in `hang`."""

    def __init__(self) -> None:
        super().__init__()
        self.hang: set[str] = set()

    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetModelInfoResponse:
        if "info" in self.hang:
            await asyncio.sleep(HANG_S)
        return await super().GetModelInfo(request, context)

    async def CountTokens(
        self, request: pb.CountTokensRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CountTokensResponse:
        if "count" in self.hang:
            await asyncio.sleep(HANG_S)
        return await super().CountTokens(request, context)


class HangingHealth(health.aio.HealthServicer):  # type: ignore[misc]
    hang = False

    async def Check(self, request: Any, context: Any) -> Any:
        if self.hang:
            await asyncio.sleep(HANG_S)
        return await super().Check(request, context)


@pytest.fixture
async def hanging() -> AsyncIterator[tuple[HangingEngine, HangingHealth, str]]:
    servicer, health_servicer = HangingEngine(), HangingHealth()
    server = grpc.aio.server()
    pb_grpc.add_EngineServiceServicer_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await health_servicer.set(ENGINE_SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    yield servicer, health_servicer, f"127.0.0.1:{port}"
    await server.stop(grace=None)


async def test_a_hung_engine_never_hangs_a_request(
    hanging: tuple[HangingEngine, HangingHealth, str], settings: FacadeSettings, store: Store
) -> None:
    servicer, health_servicer, address = hanging
    quick = Timeouts(generate=1.0, control=0.5, stream_first_message=0.2, heartbeat=0.3)
    # The client's own default deadlines are long: the facade must pass its own.
    async with AsyncEngineClient(address) as client:
        app = create_app(settings.replace(timeouts=quick), engine=client, store=store)
        async with in_process(app) as http:

            async def timed(method: str, path: str, **kwargs: Any) -> tuple[httpx.Response, float]:
                started = time.monotonic()
                reply = await asyncio.wait_for(http.request(method, path, **kwargs), 10)
                return reply, time.monotonic() - started

            # Generate hangs (the fake's `hang` with no chunks): the generation deadline.
            servicer.script = Script(text_chunks=[], hang=True)
            reply, took = await timed("POST", "/v1/responses", json={"input": "hi"})
            assert (reply.status_code, reply.json()["error"]["code"], took < 5) == (
                504,
                "engine_timeout",
                True,
            )
            reply, took = await timed("POST", "/v1/responses", json={"input": "hi", "stream": True})
            events = stream_events(reply.text)
            assert [event["type"] for event in events[-2:]] == ["error", "response.failed"]
            assert events[-2]["error"]["code"] == "engine_timeout" and took < 5
            # CountTokens, then GetModelInfo (the cache is cold in a new app), then health.
            servicer.hang = {"count"}
            reply, took = await timed("POST", "/v1/responses/input_tokens", json={"input": "hi"})
            assert (reply.status_code, took < 5) == (504, True)
            servicer.hang = {"info"}
            fresh = create_app(settings.replace(timeouts=quick), engine=client, store=store)
            async with in_process(fresh) as cold:
                for method, path, kwargs in (
                    ("POST", "/v1/responses", {"json": {"input": "hi"}}),
                    ("GET", "/v1/models", {}),
                ):
                    started = time.monotonic()
                    reply = await asyncio.wait_for(cold.request(method, path, **kwargs), 10)
                    assert (reply.status_code, time.monotonic() - started < 5) == (504, True), path
            health_servicer.hang = True
            reply, took = await timed("GET", "/readyz")
            assert (reply.status_code, took < 5) == (503, True)

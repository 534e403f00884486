"""The facade's side of engine authentication: it sends the shared token and speaks TLS / mutual
TLS to the engine, configured by settings; the engine side is `vlmserve.engine.rpc.auth`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.facade.fake_engine import FakeEngine
from tests.facade.helpers import in_process
from tests.hardening._certs import PKIFiles, make_pki
from vlmserve.client import ENGINE_SERVICE_NAME, server_options
from vlmserve.engine.rpc.auth import EngineSecurity
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc
from vlmserve.facade import FacadeSettings, Store, create_app
from vlmserve.facade.app import engine_client
from vlmserve.facade.cli import settings_from_args

TOKEN = "engine-token-0123456789abcdef"


async def start_engine(security: EngineSecurity) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server(options=server_options(), interceptors=security.interceptors())
    pb_grpc.add_EngineServiceServicer_to_server(FakeEngine(), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    # "localhost" is in the test server certificate's names.
    port = security.add_port(server, "localhost:0")
    await server.start()
    await health_servicer.set(ENGINE_SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    return server, f"localhost:{port}"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKIFiles:
    return make_pki(tmp_path_factory.mktemp("pki"))


async def create_status(settings: FacadeSettings, store: Store) -> int:
    client = engine_client(settings)
    try:
        app = create_app(settings, engine=client, store=store)
        async with in_process(app) as http:
            return (await http.post("/v1/responses", json={"input": "hi"})).status_code
    finally:
        await client.close()


@pytest.fixture
async def token_engine() -> AsyncIterator[str]:
    server, address = await start_engine(EngineSecurity(tokens=(TOKEN,)))
    yield address
    await server.stop(grace=None)


async def test_the_facade_sends_the_engine_token(
    token_engine: str, settings: FacadeSettings, store: Store
) -> None:
    with_token = settings.replace(engine_address=token_engine, engine_token=TOKEN)
    assert await create_status(with_token, store) == 200
    without = settings.replace(engine_address=token_engine)
    assert await create_status(without, store) == 502  # UNAUTHENTICATED: a misconfigured server
    wrong = with_token.replace(engine_token="not-the-engine-token-xxxx")
    assert await create_status(wrong, store) == 502


async def test_the_facade_speaks_mutual_tls_to_the_engine(
    pki: PKIFiles, settings: FacadeSettings, store: Store
) -> None:
    security = EngineSecurity(tls_cert=pki.server.cert, tls_key=pki.server.key, tls_client_ca=pki.ca_cert)
    server, address = await start_engine(security)
    try:
        base = settings.replace(engine_address=address, engine_tls_ca=pki.ca_cert)
        mutual = base.replace(engine_tls_cert=pki.client.cert, engine_tls_key=pki.client.key)
        assert await create_status(mutual, store) == 200
        # No client certificate, or one from another CA: the handshake fails, the engine is unavailable.
        assert await create_status(base, store) == 503
        stranger = base.replace(engine_tls_cert=pki.stranger.cert, engine_tls_key=pki.stranger.key)
        assert await create_status(stranger, store) == 503
        # Plain text to a TLS engine fails too.
        assert await create_status(settings.replace(engine_address=address), store) == 503
    finally:
        await server.stop(grace=None)


def test_engine_auth_settings_from_env_and_flags(tmp_path: Path, pki: PKIFiles) -> None:
    from_env = FacadeSettings.from_env({"VLMSERVE_ENGINE_TOKEN": f"{TOKEN}, older-token-0123456789"})
    assert from_env.engine_token == TOKEN and TOKEN not in repr(from_env)
    token_file = tmp_path / "token"
    token_file.write_text(f"# engine\n{TOKEN}\n", encoding="utf-8")
    flags = settings_from_args(
        [
            *("--engine-token-file", str(token_file)),
            *("--engine-tls-ca", str(pki.ca_cert)),
            *("--engine-tls-cert", str(pki.client.cert), "--engine-tls-key", str(pki.client.key)),
        ],
        {},
    )
    assert flags.engine_token == TOKEN
    assert (flags.engine_tls_ca, flags.engine_tls_cert, flags.engine_tls_key) == (
        pki.ca_cert,
        pki.client.cert,
        pki.client.key,
    )
    half = flags.replace(engine_tls_key=None)
    with pytest.raises(ValueError):
        engine_client(half)
    empty = tmp_path / "empty"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(SystemExit):
        settings_from_args(["--engine-token-file", str(empty)], {})

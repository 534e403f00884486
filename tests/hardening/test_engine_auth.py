"""The engine's token interceptor and TLS / mutual TLS, on a tiny in-process grpc.aio server.

The server carries the health service (exempt), reflection (not exempt) and a generic bytes
service with a unary and a client-streaming method; no model, no mlx.
"""

from __future__ import annotations

import argparse
import hmac
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

from tests.hardening._certs import PKIFiles, make_pki
from vlmserve.client import AsyncEngineClient, UnauthenticatedError, UnimplementedError
from vlmserve.engine.rpc import auth
from vlmserve.engine.rpc.auth import EngineSecurity, TokenAuthInterceptor
from vlmserve.server import secrets
from vlmserve.server.settings import add_arguments, load

TOKEN = "engine-token-0123456789abcdef"
ROTATED = "next-engine-token-fedcba9876543210"
TIMEOUT = 5.0


class Calls:
    def __init__(self) -> None:
        self.count = 0


def _identity(data: bytes) -> bytes:
    return data


def echo_service(calls: Calls) -> grpc.GenericRpcHandler:
    async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        calls.count += 1
        return request

    async def upload(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
        calls.count += 1
        return b"".join([chunk async for chunk in requests])

    return grpc.method_handlers_generic_handler(
        "test.Echo",
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary, _identity, _identity),
            "Upload": grpc.stream_unary_rpc_method_handler(upload, _identity, _identity),
        },
    )


async def start_server(
    interceptors: Sequence[grpc.aio.ServerInterceptor], security: EngineSecurity | None = None
) -> tuple[grpc.aio.Server, int, Calls]:
    calls = Calls()
    server = grpc.aio.server(interceptors=interceptors)
    health = HealthServicer()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(("test.Echo", reflection.SERVICE_NAME), server)
    server.add_generic_rpc_handlers((echo_service(calls),))
    port = (security or EngineSecurity()).add_port(server, "127.0.0.1:0")
    await server.start()
    return server, port, calls


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def call_unary(channel: grpc.aio.Channel, metadata: Iterable[tuple[str, str]] = ()) -> bytes:
    method = channel.unary_unary(
        "/test.Echo/Unary", request_serializer=_identity, response_deserializer=_identity
    )
    return bytes(await method(b"ping", metadata=tuple(metadata), timeout=TIMEOUT))


async def status_of(awaitable: object) -> grpc.StatusCode:
    try:
        await awaitable  # type: ignore[misc]
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


@pytest.fixture
async def token_server() -> AsyncIterator[tuple[grpc.aio.Channel, Calls]]:
    server, port, calls = await start_server([TokenAuthInterceptor([TOKEN, ROTATED])])
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield channel, calls
    await server.stop(grace=None)


@pytest.mark.parametrize("token", [TOKEN, ROTATED])
async def test_a_configured_token_is_let_through(
    token_server: tuple[grpc.aio.Channel, Calls], token: str
) -> None:
    channel, calls = token_server
    assert await call_unary(channel, bearer(token)) == b"ping"
    assert calls.count == 1


@pytest.mark.parametrize(
    "metadata",
    [
        (),
        bearer("wrong-token-0123456789abcdef"),
        bearer(TOKEN[:-1]),
        bearer(TOKEN + "x"),
        (("authorization", f"Basic {TOKEN}"),),
        (("authorization", TOKEN),),
        (("authorization", "Bearer "),),
        (("x-authorization", f"Bearer {TOKEN}"),),
        (*bearer(TOKEN), *bearer("wrong-token-0123456789abcdef")),  # two credentials: ambiguous
    ],
)
async def test_calls_without_the_token_are_unauthenticated_and_never_reach_the_handler(
    token_server: tuple[grpc.aio.Channel, Calls], metadata: tuple[tuple[str, str], ...]
) -> None:
    channel, calls = token_server
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call_unary(channel, metadata)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert caught.value.details() == "Missing or invalid engine token."
    assert calls.count == 0


async def test_bearer_scheme_is_case_insensitive(token_server: tuple[grpc.aio.Channel, Calls]) -> None:
    channel, _ = token_server
    assert await call_unary(channel, (("authorization", f"bearer {TOKEN}"),)) == b"ping"


async def test_client_streaming_calls_are_checked_too(token_server: tuple[grpc.aio.Channel, Calls]) -> None:
    channel, calls = token_server
    upload = channel.stream_unary(
        "/test.Echo/Upload", request_serializer=_identity, response_deserializer=_identity
    )
    # An empty request stream: the refusal must not depend on the request messages, and a client
    # write that races the server's early status is reported as INTERNAL by grpc.aio itself
    # (grpc/grpc#36066), which made this check flaky under load.
    assert await status_of(upload(iter([]), timeout=TIMEOUT)) == grpc.StatusCode.UNAUTHENTICATED
    assert calls.count == 0
    assert await upload(iter([b"a", b"b"]), metadata=bearer(TOKEN), timeout=TIMEOUT) == b"ab"


async def test_unknown_methods_look_the_same_as_known_ones_without_a_token(
    token_server: tuple[grpc.aio.Channel, Calls],
) -> None:
    channel, _ = token_server
    missing = channel.unary_unary(
        "/test.Echo/Missing", request_serializer=_identity, response_deserializer=_identity
    )
    assert await status_of(missing(b"x", timeout=TIMEOUT)) == grpc.StatusCode.UNAUTHENTICATED
    assert (
        await status_of(missing(b"x", metadata=bearer(TOKEN), timeout=TIMEOUT))
        == grpc.StatusCode.UNIMPLEMENTED
    )


async def test_health_is_exempt_for_probes(token_server: tuple[grpc.aio.Channel, Calls]) -> None:
    channel, _ = token_server
    stub = health_pb2_grpc.HealthStub(channel)
    reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    watch = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT)
    first = await watch.read()
    assert first.status == health_pb2.HealthCheckResponse.SERVING
    watch.cancel()


async def test_reflection_is_not_exempt(token_server: tuple[grpc.aio.Channel, Calls]) -> None:
    channel, _ = token_server
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")

    async def list_services(metadata: tuple[tuple[str, str], ...], *, send: bool = True) -> list[str]:
        requests = [request] if send else []
        call = stub.ServerReflectionInfo(iter(requests), metadata=metadata, timeout=TIMEOUT)
        reply = await call.read()
        return [service.name for service in reply.list_services_response.service]

    # Refused without a message sent: a client write racing the server's early status is
    # reported as INTERNAL by grpc.aio itself (grpc/grpc#36066), as in the upload test above.
    assert await status_of(list_services((), send=False)) == grpc.StatusCode.UNAUTHENTICATED
    assert "test.Echo" in await list_services(bearer(TOKEN))


async def test_exemptions_are_configurable() -> None:
    server, port, _ = await start_server([TokenAuthInterceptor([TOKEN], exempt_methods=())])
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            check = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=TIMEOUT
            )
            assert await status_of(check) == grpc.StatusCode.UNAUTHENTICATED
            watch = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(), timeout=TIMEOUT
            )
            assert await status_of(watch.read()) == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await server.stop(grace=None)


def test_every_configured_token_is_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    """No early exit on the first match, so timing does not tell which token (or how many) matched."""
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(secrets.hmac, "compare_digest", counting)
    interceptor = TokenAuthInterceptor([TOKEN, ROTATED, "third-token-0123456789abcdef"])
    assert interceptor.authorized(bearer(TOKEN))
    assert len(compared) == 3
    assert all(len(a) == len(b) == 32 for a, b in compared)  # digests: the length never leaks


@pytest.mark.parametrize("tokens", [[], [""], ["short"]])
def test_empty_or_weak_tokens_are_refused_at_startup(tokens: list[str]) -> None:
    with pytest.raises(ValueError):
        TokenAuthInterceptor(tokens)


# --- TLS ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKIFiles:
    return make_pki(tmp_path_factory.mktemp("engine-pki"))


def tls_channel(
    port: int, pki: PKIFiles, *, client_cert: bool = False, stranger: bool = False
) -> grpc.aio.Channel:
    identity = pki.stranger if stranger else pki.client
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pki.ca_cert.read_bytes(),
        private_key=identity.key.read_bytes() if client_cert else None,
        certificate_chain=identity.cert.read_bytes() if client_cert else None,
    )
    return grpc.aio.secure_channel(f"localhost:{port}", credentials)


async def health_status(channel: grpc.aio.Channel) -> grpc.StatusCode:
    async with channel:
        return await status_of(
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT)
        )


async def test_tls_serves_clients_that_trust_the_ca(pki: PKIFiles) -> None:
    security = EngineSecurity(tls_cert=pki.server.cert, tls_key=pki.server.key)
    server, port, _ = await start_server(security.interceptors(), security)
    try:
        assert await health_status(tls_channel(port, pki)) == grpc.StatusCode.OK
        assert (
            await health_status(grpc.aio.insecure_channel(f"localhost:{port}")) == grpc.StatusCode.UNAVAILABLE
        )
    finally:
        await server.stop(grace=None)


async def test_mutual_tls_requires_a_client_certificate_from_the_ca(pki: PKIFiles) -> None:
    security = EngineSecurity(tls_cert=pki.server.cert, tls_key=pki.server.key, tls_client_ca=pki.ca_cert)
    server, port, _ = await start_server(security.interceptors(), security)
    try:
        assert await health_status(tls_channel(port, pki, client_cert=True)) == grpc.StatusCode.OK
        assert await health_status(tls_channel(port, pki)) == grpc.StatusCode.UNAVAILABLE
        assert await health_status(tls_channel(port, pki, client_cert=True, stranger=True)) == (
            grpc.StatusCode.UNAVAILABLE
        )
    finally:
        await server.stop(grace=None)


async def test_token_and_tls_together(pki: PKIFiles) -> None:
    security = EngineSecurity(tokens=(TOKEN,), tls_cert=pki.server.cert, tls_key=pki.server.key)
    server, port, _ = await start_server(security.interceptors(), security)
    try:
        async with tls_channel(port, pki) as channel:
            assert await status_of(call_unary(channel)) == grpc.StatusCode.UNAUTHENTICATED
            assert await call_unary(channel, bearer(TOKEN)) == b"ping"
    finally:
        await server.stop(grace=None)


# --- settings -------------------------------------------------------------------------------------


def security_from(argv: list[str], environ: dict[str, str]) -> EngineSecurity:
    """As the engine's command line reads its authentication settings."""
    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_arguments(parser, EngineSecurity)
    return load(EngineSecurity, environ=environ, args=parser.parse_args(argv))


def test_security_from_flags_and_environment(tmp_path: Path, pki: PKIFiles) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text(f"# current and next\n{TOKEN}\n\n{ROTATED}\n", encoding="utf-8")
    security = security_from(
        [
            "--auth-token-file",
            str(token_file),
            "--tls-cert",
            str(pki.server.cert),
            "--tls-key",
            str(pki.server.key),
        ],
        {auth.TOKEN_ENV: "ignored-when-a-file-is-named-0123"},
    )
    assert security.tokens == (TOKEN, ROTATED)
    assert security.tls_cert is not None and security.is_protected
    assert security_from([], {auth.TOKEN_ENV: TOKEN}).tokens == (TOKEN,)
    assert security_from([], {}) == EngineSecurity()
    assert TOKEN not in repr(security)
    assert not EngineSecurity().is_protected
    assert EngineSecurity().interceptors() == []


@pytest.mark.parametrize(
    "argv", [["--tls-cert", "server.crt"], ["--tls-key", "server.key"], ["--tls-client-ca", "ca.crt"]]
)
def test_incomplete_tls_flags_are_refused(argv: list[str]) -> None:
    with pytest.raises(ValueError):
        security_from(argv, {})


def test_an_empty_token_file_is_refused(tmp_path: Path) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text("# nothing yet\n", encoding="utf-8")
    with pytest.raises(ValueError):
        security_from(["--auth-token-file", str(token_file)], {})


async def test_the_client_library_sends_the_token_the_interceptor_expects() -> None:
    server, port, _ = await start_server([TokenAuthInterceptor([TOKEN])])
    try:
        async with AsyncEngineClient(f"127.0.0.1:{port}") as anonymous:
            with pytest.raises(UnauthenticatedError):
                await anonymous.model_info()
        async with AsyncEngineClient(f"127.0.0.1:{port}", token=TOKEN) as client:
            # Authenticated, the call reaches the (here absent) engine service.
            with pytest.raises(UnimplementedError):
                await client.model_info()
    finally:
        await server.stop(grace=None)


@pytest.mark.parametrize(
    ("address", "local"),
    [
        ("unix:/run/vlmserve/engine.sock", True),
        ("127.0.0.1:50051", True),
        ("127.0.0.5:50051", True),
        ("[::1]:50051", True),
        ("localhost:50051", True),
        ("0.0.0.0:50051", False),
        ("[::]:50051", False),
        ("10.1.2.3:50051", False),
        ("engine.internal:50051", False),
    ],
)
def test_only_local_addresses_may_be_served_without_authentication(address: str, local: bool) -> None:
    assert auth.is_local_address(address) is local
    if local:
        EngineSecurity().check_address(address)
    else:
        with pytest.raises(ValueError, match="without authentication"):
            EngineSecurity().check_address(address)
    EngineSecurity(tokens=(TOKEN,)).check_address(address)  # a token makes any address acceptable

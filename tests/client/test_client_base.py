"""Both clients fail alike, from the shared base (`_base.py`): with no engine to answer, every
call raises the same `EngineError` subclass in either client, and a health probe answers False."""

from __future__ import annotations

import socket

import pytest

from vlmserve.client import AsyncEngineClient, EngineClient, EngineError, UnavailableError
from vlmserve.engine.v1 import engine_pb2 as pb

REQUEST = pb.GenerateRequest(
    messages=[pb.Message(role=pb.ROLE_USER, parts=[pb.Part(text=pb.TextPart(text="hi"))])]
)


@pytest.fixture
def nobody() -> str:
    """A loopback address nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"127.0.0.1:{port}"


def test_the_blocking_client_maps_every_failure(nobody: str) -> None:
    with EngineClient(nobody) as client:
        assert client.health(timeout=2) is False
        for call in (
            lambda: list(client.generate(REQUEST, timeout=2)),
            lambda: client.generate_unary(REQUEST, timeout=2),
            lambda: client.count_tokens(REQUEST, timeout=2),
            lambda: client.model_info(timeout=2),
            lambda: client.abort("x", timeout=2),
        ):
            with pytest.raises(UnavailableError) as raised:
                call()
            assert isinstance(raised.value, EngineError)
            assert raised.value.__suppress_context__  # the grpc error is not chained onto it


async def test_the_asyncio_client_maps_every_failure(nobody: str) -> None:
    async with AsyncEngineClient(nobody) as client:
        assert await client.health(timeout=2) is False
        with pytest.raises(UnavailableError):
            [response async for response in client.generate(REQUEST, timeout=2)]
        with pytest.raises(UnavailableError):
            await client.generate_unary(REQUEST, timeout=2)
        with pytest.raises(UnavailableError):
            await client.count_tokens(REQUEST, timeout=2)
        with pytest.raises(UnavailableError):
            await client.model_info(timeout=2)
        with pytest.raises(UnavailableError):
            await client.abort("x", timeout=2)

"""One client, several engines: gRPC's round_robin over the healthy ones (client-side health
checking), one retry for a call that failed UNAVAILABLE before the engine sent anything, none
after the first chunk. Real gRPC servers (scripted engines) on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from tests.facade.fake_engine import RunningFakeEngine, start_fake_engine
from vlmserve.client import AsyncEngineClient, UnavailableError, text_of
from vlmserve.client._targets import engine_target, names_several_engines
from vlmserve.engine.v1 import engine_pb2 as pb


@pytest.mark.parametrize(
    ("address", "target"),
    [
        ("127.0.0.1:50051", "127.0.0.1:50051"),
        ("unix:/tmp/engine.sock", "unix:/tmp/engine.sock"),
        ("dns:///engines.internal:50051", "dns:///engines.internal:50051"),
        ("ipv4:10.0.0.1:1,10.0.0.2:2", "ipv4:10.0.0.1:1,10.0.0.2:2"),
        ("10.0.0.1:1, 10.0.0.2:2", "ipv4:10.0.0.1:1,10.0.0.2:2"),
        ("[::1]:1,[::2]:2", "ipv6:[::1]:1,[::2]:2"),
        ("localhost:7,127.0.0.1:8", "ipv4:127.0.0.1:7,127.0.0.1:8"),
    ],
)
def test_engine_targets(address: str, target: str) -> None:
    assert engine_target(address) == target


@pytest.mark.parametrize("address", ["10.0.0.1:1,::1", "10.0.0.1:1,[::1]:2", "a,b"])
def test_a_bad_list_is_refused(address: str) -> None:
    with pytest.raises(ValueError):
        engine_target(address)


def test_only_target_names_that_may_hold_several_engines_are_balanced() -> None:
    assert names_several_engines("ipv4:127.0.0.1:1,127.0.0.1:2")
    assert names_several_engines("dns:///engines:50051")
    assert not names_several_engines("127.0.0.1:50051")
    assert not names_several_engines("unix:/tmp/engine.sock")


@pytest.fixture
async def engines() -> AsyncIterator[list[RunningFakeEngine]]:
    running = [await start_fake_engine(), await start_fake_engine()]
    yield running
    for engine in running:
        await engine.stop()


def request(index: int) -> pb.GenerateRequest:
    text = pb.Part(text=pb.TextPart(text=f"hi {index}"))
    return pb.GenerateRequest(request_id=f"r{index}", messages=[pb.Message(role=pb.ROLE_USER, parts=[text])])


async def collect(client: AsyncEngineClient, index: int) -> str:
    return text_of([message async for message in client.generate(request(index), timeout=10)])


async def connected(client: AsyncEngineClient, engines: list[RunningFakeEngine]) -> None:
    """round_robin picks only among connected engines: wait until a call reached each."""
    for _ in range(50):
        if all(engine.servicer.requests for engine in engines):
            break
        await collect(client, -1)
        await asyncio.sleep(0.02)
    for engine in engines:
        engine.servicer.requests.clear()


async def test_calls_are_spread_over_healthy_engines(engines: list[RunningFakeEngine]) -> None:
    first, second = engines
    async with AsyncEngineClient(f"{first.address},{second.address}") as client:
        await connected(client, engines)
        texts = [await collect(client, i) for i in range(10)]
        assert texts == ["Hello, world."] * 10
        assert len(first.servicer.requests) == len(second.servicer.requests) == 5

        # NOT_SERVING (loading, draining): the health watch takes it out of the rotation.
        await first.set_serving(False)
        await asyncio.sleep(0.3)
        before = len(first.servicer.requests)
        assert [await collect(client, i) for i in range(6)] == ["Hello, world."] * 6
        assert len(first.servicer.requests) == before


async def test_unavailable_before_the_first_chunk_is_retried_once_on_the_other_engine(
    engines: list[RunningFakeEngine],
) -> None:
    first, second = engines
    async with AsyncEngineClient(f"{first.address},{second.address}") as client:
        await connected(client, engines)
        first.servicer.script.error = (grpc.StatusCode.UNAVAILABLE, "going away")
        texts = [await collect(client, i) for i in range(8)]
    assert texts == ["Hello, world."] * 8
    # Some calls were tried on the failing engine first; every one finished on the other.
    assert first.servicer.requests
    assert [r.request_id for r in second.servicer.requests] == [f"r{i}" for i in range(8)]


async def test_a_failure_after_the_first_chunk_is_not_retried(engines: list[RunningFakeEngine]) -> None:
    first, second = engines
    failed = 0
    async with AsyncEngineClient(f"{first.address},{second.address}") as client:
        await connected(client, engines)
        first.servicer.script.error = (grpc.StatusCode.UNAVAILABLE, "died mid-answer")
        first.servicer.script.error_after = 1
        for i in range(8):
            try:
                await collect(client, i)
            except UnavailableError:
                failed += 1
    assert failed == len(first.servicer.requests) > 0
    # No call ran twice: the failed ones never reached the second engine.
    assert len(second.servicer.requests) == 8 - failed

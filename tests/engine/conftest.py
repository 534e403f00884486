"""One real engine per test session, in this process, on the fixture model, over loopback gRPC.

In-process so tests can read the engine's own accounting (tokens generated after a cancel) and
watch health before the model loads; every call still goes through a real gRPC channel.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests._fixture_models import RANDOM_MODEL_PATH
from vlmserve.client import channel_options
from vlmserve.engine.config import EngineConfig
from vlmserve.engine.grammar.compiler import GrammarCompiler
from vlmserve.engine.rpc.server import ENGINE_SERVICE_NAME, EngineServer
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc

T = TypeVar("T")

# Small on purpose: tests of the queue limit fill it with a handful of requests.
MAX_ACTIVE = 2
MAX_QUEUE = 2
MAX_OUTPUT_TOKENS = 512


def _generate_status(address: str) -> grpc.StatusCode:
    request = pb.GenerateRequest(
        messages=[pb.Message(role=pb.ROLE_USER, parts=[pb.Part(text=pb.TextPart(text="hi"))])]
    )
    with grpc.insecure_channel(address) as channel:
        try:
            list(pb_grpc.EngineServiceStub(channel).Generate(request, timeout=10))
        except grpc.RpcError as error:
            code: grpc.StatusCode = error.code()
            return code
    return grpc.StatusCode.OK


def _health_statuses(address: str) -> dict[str, int]:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return {
            service: stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
            for service in ("", ENGINE_SERVICE_NAME)
        }


@dataclass
class InProcessEngine:
    server: EngineServer
    address: str
    loop: asyncio.AbstractEventLoop
    health_before_load: dict[str, int] = field(default_factory=dict)
    health_after_load: dict[str, int] = field(default_factory=dict)
    generate_before_load: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 120) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def report(self, request_id: str, timeout: float = 30) -> Any:
        """The engine's accounting for a finished request (waits for it to finish)."""
        generator = self.server.generator
        assert generator.wait_idle(timeout), "engine did not become idle"
        for report in reversed(generator.reports):
            if report.request_id == request_id:
                return report
        raise AssertionError(f"no report for {request_id}")


@pytest.fixture(scope="session")
def engine() -> Iterator[InProcessEngine]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-engine-loop", daemon=True)
    thread.start()
    config = EngineConfig(
        model=str(RANDOM_MODEL_PATH),
        max_output_tokens=MAX_OUTPUT_TOKENS,
        max_queue=MAX_QUEUE,
        max_active=MAX_ACTIVE,
    )

    async def start() -> tuple[EngineServer, str]:
        server = EngineServer(config)
        return server, await server.start("127.0.0.1:0")

    server, address = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    engine = InProcessEngine(server=server, address=address, loop=loop)
    engine.health_before_load = _health_statuses(address)
    engine.generate_before_load = _generate_status(address)
    server.load()
    engine.run(server.wait_loaded())
    engine.health_after_load = _health_statuses(address)
    yield engine
    engine.run(server.shutdown(grace_seconds=5))
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@pytest.fixture
def idle_engine(engine: InProcessEngine) -> InProcessEngine:
    """The engine with nothing left over from an earlier test."""
    assert engine.server.generator.wait_idle(30), "a previous test left requests running"
    return engine


@pytest.fixture(scope="session")
def channel(engine: InProcessEngine) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(engine.address, options=channel_options()) as channel:
        yield channel


@pytest.fixture(scope="session")
def stub(channel: grpc.Channel) -> pb_grpc.EngineServiceStub:
    return pb_grpc.EngineServiceStub(channel)


@pytest.fixture(autouse=True)
def logits_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows run the test-only logits processors of their requests (tests/engine/_logits_hooks.py);
    a request without them is untouched."""
    from tests.engine._logits_hooks import install

    install(monkeypatch)


# The random fixture model's tokenizer, and a grammar compiler on it (one per module: a
# compiler keeps what it compiled). Modules on another tokenizer define their own `tokenizer`.
@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(RANDOM_MODEL_PATH))


@pytest.fixture(scope="module")
def compiler(tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, [tokenizer.eos_token_id])

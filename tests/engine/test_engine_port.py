"""A second engine on a port that is already taken refuses to start.

gRPC turns SO_REUSEPORT on by default: a second engine used to bind the same port silently and
the kernel split new connections between the two models.
"""

from __future__ import annotations

import subprocess

import pytest
from grpc_health.v1 import health_pb2

from tests._fixture_models import RANDOM_MODEL_PATH
from tests._services import BIN, process_env
from vlmserve.engine.config import EngineConfig
from vlmserve.engine.rpc.server import EngineServer

from .conftest import InProcessEngine, _health_statuses

pytestmark = pytest.mark.needs_model


def test_a_second_server_cannot_bind_a_taken_port(engine: InProcessEngine) -> None:
    async def start_second() -> str:
        return await EngineServer(EngineConfig(model=str(RANDOM_MODEL_PATH))).start(engine.address)

    with pytest.raises(OSError, match="in use"):
        engine.run(start_second())
    # The first engine still answers on its port.
    assert set(_health_statuses(engine.address).values()) == {health_pb2.HealthCheckResponse.SERVING}


def test_the_engine_cli_exits_when_its_port_is_taken(engine: InProcessEngine) -> None:
    completed = subprocess.run(
        [str(BIN / "vlmserve-engine"), "--address", engine.address, "--model", str(RANDOM_MODEL_PATH)],
        env=process_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 2, completed.stderr[-2000:]
    assert f"could not bind {engine.address}" in completed.stderr
    # It stopped before loading the model.
    assert "loading" not in completed.stderr

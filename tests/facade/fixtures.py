"""Fixtures shared by the facade and hardening tests: the scripted engine on a real gRPC
server, a client for it, settings and a store. conftest.py files import them from here."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.facade.fake_engine import FakeEngine, RunningFakeEngine, start_fake_engine
from vlmserve.client import AsyncEngineClient
from vlmserve.facade import FacadeSettings, ResponseStore, Timeouts

__all__ = ["engine", "engine_client", "fake_engine", "settings", "store"]


@pytest.fixture
async def fake_engine() -> AsyncIterator[RunningFakeEngine]:
    running = await start_fake_engine()
    yield running
    await running.stop()


@pytest.fixture
def engine(fake_engine: RunningFakeEngine) -> FakeEngine:
    """The scripted servicer: set `.script`, read `.requests`."""
    return fake_engine.servicer


@pytest.fixture
async def engine_client(fake_engine: RunningFakeEngine) -> AsyncIterator[AsyncEngineClient]:
    client = AsyncEngineClient(fake_engine.address)
    yield client
    await client.close()


@pytest.fixture
def settings(tmp_path: Path) -> FacadeSettings:
    return FacadeSettings(
        store_path=tmp_path / "facade.sqlite3",
        timeouts=Timeouts(generate=30.0, control=5.0, stream_first_message=1.0),
    )


@pytest.fixture
def store(settings: FacadeSettings) -> Iterator[ResponseStore]:
    opened = ResponseStore(settings.store_path)
    yield opened
    opened.close()

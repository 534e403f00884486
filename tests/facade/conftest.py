"""Facade tests run the app in-process against a scripted engine on a real gRPC server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from tests.facade.fake_engine import FakeEngine, RunningFakeEngine, start_fake_engine
from vlmserve.client import AsyncEngineClient
from vlmserve.facade import FacadeSettings, ResponseStore, Timeouts, create_app


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


@pytest.fixture
def app(settings: FacadeSettings, engine_client: AsyncEngineClient, store: ResponseStore) -> FastAPI:
    return create_app(settings, engine=engine_client, store=store)


@pytest.fixture
async def http(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://facade.test") as client:
        yield client


@pytest.fixture
async def server_url(app: FastAPI) -> AsyncIterator[str]:
    """The app behind a real uvicorn server on loopback (for disconnects and the OpenAI SDK)."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    await asyncio.wait_for(task, 10)

"""Fixtures shared by the facade and hardening tests: the scripted engine on a real gRPC
server, a client for it, settings and a store, clients of apps with other limits, an app on a
real loopback server. conftest.py files import them from here."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI

from tests.facade.fake_engine import FakeEngine, RunningFakeEngine, start_fake_engine
from tests.facade.helpers import AppClients, MakeClient, loopback, serving, with_fields
from vlmserve.client import AsyncEngineClient
from vlmserve.facade import FacadeSettings, Store, Timeouts

__all__ = [
    "another_store",
    "client_for",
    "engine",
    "engine_client",
    "fake_engine",
    "sdk",
    "server_lifespan",
    "server_url",
    "settings",
    "store",
    "store_backend",
]


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
def store_backend() -> str:
    """Which store `store` is: SQLite, unless a module runs on both (tests/facade/both_stores.py)."""
    return "sqlite"


@pytest.fixture
def another_store(
    settings: FacadeSettings, store_backend: str, request: pytest.FixtureRequest
) -> Iterator[Callable[[], Store]]:
    """Opens another store on what `store` keeps (a restarted or a second facade's); closed after."""
    url = request.getfixturevalue("postgres_url") if store_backend == "postgresql" else None
    opened: list[Store] = []

    def open_store() -> Store:
        store = Store.postgres(url, max_connections=4) if url else Store.sqlite(settings.store_path)
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        store.close()


@pytest.fixture
def store(another_store: Callable[[], Store]) -> Store:
    return another_store()


@pytest.fixture
async def client_for(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store
) -> AsyncIterator[MakeClient]:
    """`client_for(max_tools=2, max_conversation_bytes=...)`: an in-process client of an app
    whose `Limits` and `Storage` have those fields (the rest of `settings` as it is)."""
    clients = AppClients(engine_client, store)

    def make(**fields: Any) -> httpx.AsyncClient:
        return clients.open(with_fields(settings, **fields))

    yield make
    await clients.aclose()


@pytest.fixture
def server_lifespan() -> str:
    """Whether `server_url`'s server runs the app's lifespan: "off", unless a module needs it."""
    return "off"


@pytest.fixture
async def server_url(app: FastAPI, server_lifespan: str) -> AsyncIterator[str]:
    """The module's `app` behind a real uvicorn server on loopback (disconnects, real clients)."""
    async with serving(loopback(app, lifespan=server_lifespan), stop_timeout_s=10) as port:
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
async def sdk(server_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    """The OpenAI SDK on `server_url` (no retries). Anthropic's modules define their own `sdk`."""
    client = openai.AsyncOpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0, timeout=10)
    yield client
    await client.close()

"""Facade tests run the app in-process against a scripted engine on a real gRPC server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from vlmserve.client import AsyncEngineClient
from vlmserve.facade import FacadeSettings, Store, create_app


@pytest.fixture
def app(settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store) -> FastAPI:
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

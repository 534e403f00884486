"""Facade tests run the app in-process against a scripted engine on a real gRPC server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from tests.facade.helpers import in_process
from vlmserve.client import AsyncEngineClient
from vlmserve.facade import FacadeSettings, Store, create_app


@pytest.fixture
def app(settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store) -> FastAPI:
    return create_app(settings, engine=engine_client, store=store)


@pytest.fixture
async def http(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with in_process(app) as client:
        yield client

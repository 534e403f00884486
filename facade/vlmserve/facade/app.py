"""The FastAPI app: OpenAI Responses API over the engine."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.params import Depends

from vlmserve.client import AsyncEngineClient, Deadlines

from . import conversations_api, models_api, responses_api
from .catalog import ModelCatalog
from .errors import install_error_handlers
from .service import ImageSourceFactory, ResponsesService
from .settings import FacadeSettings
from .state import FacadeState
from .store import ResponseStore

logger = logging.getLogger("vlmserve.facade")


def engine_client(settings: FacadeSettings) -> AsyncEngineClient:
    timeouts = settings.timeouts
    return AsyncEngineClient(
        settings.engine_address,
        deadlines=Deadlines(
            generate=timeouts.generate,
            count_tokens=timeouts.control,
            model_info=timeouts.control,
            abort=timeouts.control,
            health=timeouts.control,
        ),
    )


def create_app(
    settings: FacadeSettings | None = None,
    *,
    engine: AsyncEngineClient | None = None,
    store: ResponseStore | None = None,
    dependencies: Sequence[Depends] = (),
    image_sources: ImageSourceFactory | None = None,
) -> FastAPI:
    """The facade app.

    `engine` and `store` default to a client for `settings.engine_address` (made when the app
    starts, on the server's event loop) and a store at `settings.store_path`; objects passed in
    are left open for their owner to close. `dependencies` apply to every route except the
    health checks (authentication plugs in here; a dependency that sets `request.state.owner`
    files stored objects under that owner). `image_sources` makes the fetcher for remote image
    URLs, once per request (none: remote URLs are refused with a 400).
    """
    settings = settings or FacadeSettings.from_env()
    owned_store = store is None
    the_store = store if store is not None else ResponseStore(settings.store_path)

    def build_state(client: AsyncEngineClient) -> FacadeState:
        catalog = ModelCatalog(client, ttl_s=settings.model_info_ttl_s, timeout_s=settings.timeouts.control)
        service = ResponsesService(
            settings=settings, engine=client, store=the_store, catalog=catalog, image_sources=image_sources
        )
        return FacadeState(
            settings=settings, engine=client, store=the_store, catalog=catalog, responses=service
        )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned_engine = None
        if engine is None:
            owned_engine = engine_client(settings)
            app.state.facade = build_state(owned_engine)
        try:
            yield
        finally:
            state: FacadeState = app.state.facade
            await state.responses.cancel_all()
            if owned_engine is not None:
                await owned_engine.close()
            if owned_store:
                the_store.close()

    app = FastAPI(
        title="vlmserve facade",
        summary="OpenAI Responses API over a vlmserve engine",
        version="0.1.0",
        lifespan=lifespan,
    )
    if engine is not None:
        # Ready without a lifespan run (in-process tests drive the app over ASGI directly).
        app.state.facade = build_state(engine)
    install_error_handlers(app)
    guarded: dict[str, Any] = {"dependencies": list(dependencies)}
    app.include_router(responses_api.router, **guarded)
    app.include_router(conversations_api.router, **guarded)
    app.include_router(models_api.models_router, **guarded)
    app.include_router(models_api.health_router)
    return app

"""The FastAPI app: OpenAI Responses API over the engine."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
from fastapi import Depends, FastAPI
from fastapi import params as fastapi_params
from fastapi.responses import JSONResponse

from vlmserve.client import AsyncEngineClient, Deadlines
from vlmserve.facade.engines.config import ModelRoute
from vlmserve.facade.engines.pools import ModelRouter
from vlmserve.facade.http.api_keys import install_api_keys, require_operator, require_owner
from vlmserve.facade.http.body_budget import BodyBudget
from vlmserve.facade.http.errors import APIError, install_error_handlers, insufficient_storage, map_error
from vlmserve.facade.http.limits import HeaderLimits
from vlmserve.facade.http.metrics import FacadeMetrics, HttpMetrics, metrics_endpoint
from vlmserve.facade.http.openapi import install_openapi
from vlmserve.facade.http.request_ids import RequestIds
from vlmserve.facade.remote_images.fetcher import image_fetcher_from_settings
from vlmserve.facade.responses.background import BackgroundRuns
from vlmserve.facade.responses.delivery import AbandonUnclaimed
from vlmserve.facade.responses.key_admission import EngineSlots, KeyAdmission
from vlmserve.facade.responses.preparation import ImageSourceFactory, ResponsesService
from vlmserve.facade.routes import anthropic as anthropic_routes
from vlmserve.facade.routes import chat as chat_routes
from vlmserve.facade.routes import compact as compact_routes
from vlmserve.facade.routes import conversations as conversations_routes
from vlmserve.facade.routes import files as files_routes
from vlmserve.facade.routes import models as models_routes
from vlmserve.facade.routes import responses as responses_routes
from vlmserve.facade.routes import responses_ws as responses_ws_routes
from vlmserve.facade.routes import ui as ui_routes
from vlmserve.facade.settings import FacadeSettings
from vlmserve.facade.state import FacadeState
from vlmserve.facade.store.disk_space import DiskSpace, OutOfSpaceError, is_out_of_space
from vlmserve.facade.store.files import FileRepository
from vlmserve.facade.store.repositories import Store
from vlmserve.facade.store.upkeep import INTERRUPTED_ERROR, fail_interrupted, run_lease, run_upkeep
from vlmserve.server.version import version

logger = logging.getLogger("vlmserve.facade")

__all__ = ["INTERRUPTED_ERROR", "create_app", "open_store"]


def engine_credentials(settings: FacadeSettings) -> grpc.ChannelCredentials | None:
    """TLS to the engine when a CA or a client certificate is configured (mutual TLS with both)."""
    if settings.engine_tls_ca is None and settings.engine_tls_cert is None:
        return None
    if (settings.engine_tls_cert is None) != (settings.engine_tls_key is None):
        raise ValueError("engine TLS: a client certificate needs its key, and a key its certificate")
    return grpc.ssl_channel_credentials(
        root_certificates=_read(settings.engine_tls_ca),
        private_key=_read(settings.engine_tls_key),
        certificate_chain=_read(settings.engine_tls_cert),
    )


def _read(path: Path | None) -> bytes | None:
    return path.read_bytes() if path is not None else None


def engine_client(settings: FacadeSettings, target: str | None = None) -> AsyncEngineClient:
    """A client for one model's engines (`target`; default: --engine-address)."""
    timeouts = settings.timeouts
    return AsyncEngineClient(
        target if target is not None else settings.engine_address,
        token=settings.engine_token,
        credentials=engine_credentials(settings),
        deadlines=Deadlines(
            generate=timeouts.generate,
            count_tokens=timeouts.control,
            model_info=timeouts.control,
            abort=timeouts.control,
            health=timeouts.control,
        ),
    )


def open_store(settings: FacadeSettings) -> Store:
    """PostgreSQL when `settings.store` names a database, else the SQLite file at `store_path`."""
    cache_bytes = settings.storage.replay_cache_bytes
    if settings.store is not None:
        return Store.postgres(settings.store, cache_bytes=cache_bytes)
    return Store.sqlite(settings.store_path, cache_bytes=cache_bytes)


async def _cancelled(task: asyncio.Task[None] | None) -> None:
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def model_router(settings: FacadeSettings, clients: Callable[[ModelRoute], AsyncEngineClient]) -> ModelRouter:
    return ModelRouter.build(
        settings.model_routes(),
        client=clients,
        limits=settings.limits,
        files=settings.files,
        timeouts=settings.timeouts,
        ttl_s=settings.model_info_ttl_s,
    )


def create_app(
    settings: FacadeSettings | None = None,
    *,
    engine: AsyncEngineClient | Mapping[str, AsyncEngineClient] | None = None,
    store: Store | None = None,
    dependencies: Sequence[fastapi_params.Depends] = (),
    image_sources: ImageSourceFactory | None = None,
) -> FastAPI:
    """The facade app.

    `engine` and `store` default to a client per model of `settings` (`model_routes()`: made
    when the app starts, on the server's event loop) and a store at `settings.store_path`;
    objects passed in are left open for their owner to close (`engine`: one client for the one
    model, or a client per model id of `settings`). Every route except `/healthz` requires one of
    `settings.api_keys` when any is configured (a dependency, `auth.require_owner`, which also
    files stored objects under the key's owner id); `dependencies` are added after it.
    `image_sources` makes the fetcher for remote image URLs, once per request; by default the
    safe fetcher when `settings.remote_images` enables it, else none (remote URLs are a 400).
    On start-up (the lifespan) the app takes a lease on the store as a new facade instance and
    marks `failed` the responses still `in_progress` under instances whose lease expired (several
    facades may share a PostgreSQL store); while the app runs, `store_upkeep` renews the lease,
    expires old responses and gives freed space back.
    """
    settings = settings or FacadeSettings.from_env()
    if image_sources is None:
        fetcher = image_fetcher_from_settings(settings.remote_images)
        image_sources = fetcher.for_request if fetcher is not None else None

    metrics = FacadeMetrics()
    files = FileRepository(settings.files_directory())
    disk = DiskSpace(
        [settings.files_directory(), *([settings.store_path] if settings.store is None else [])],
        min_free_bytes=settings.storage.min_free_disk_bytes,
    )

    def given_clients(given: AsyncEngineClient | Mapping[str, AsyncEngineClient]) -> ModelRouter:
        if isinstance(given, AsyncEngineClient):
            return model_router(settings, lambda route: given)
        return model_router(settings, lambda route: given[route.id or ""])

    def build_state(router: ModelRouter, the_store: Store) -> FacadeState:
        client, catalog = router.default.engine, router.default.catalog
        service = ResponsesService(
            settings=settings,
            models=router,
            store=the_store,
            image_sources=image_sources,
            metrics=metrics,
            files=files,
            admission=KeyAdmission(
                settings.limits.max_responses_per_key if settings.api_keys.enabled else None,
                max_logprobs_per_key=settings.limits.max_logprob_responses_per_key
                if settings.api_keys.enabled
                else None,
                retry_after_s=settings.retry_after_s,
            ),
            slots=EngineSlots(settings.limits.max_engine_calls),
            disk=disk,
        )
        metrics.watch_running(lambda: len(service.running))
        return FacadeState(
            settings=settings,
            engine=client,
            store=the_store,
            catalog=catalog,
            responses=service,
            body_budget=BodyBudget(
                settings.limits.max_body_bytes_in_flight,
                per_owner_bytes=settings.body_bytes_per_key(),
                retry_after_s=settings.retry_after_s,
            ),
            background=BackgroundRuns(
                the_store,
                max_event_bytes=settings.storage.max_response_event_bytes,
                control_s=settings.timeouts.control,
            ),
            files=files,
            disk=disk,
            models=router,
        )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # What this run opens, it closes; a later run (a test client's) opens its own again.
        opened: ModelRouter | None = None
        if engine is None:
            opened = model_router(settings, lambda route: engine_client(settings, route.target))
            the_store: Store = store if store is not None else open_store(settings)
            app.state.facade = build_state(opened, the_store)
        upkeep: asyncio.Task[None] | None = None
        lease: asyncio.Task[None] | None = None
        the_store = app.state.facade.store
        try:
            # This run is a new facade instance: what it starts is its own while its lease lives.
            # Responses of instances whose lease expired (a previous run killed, another facade
            # that died) are marked failed now and then every renewal.
            await the_store.leases.start(settings.storage.lease_ttl_s)
            await fail_interrupted(the_store)
            await files.remove_orphans()
            lease = asyncio.create_task(run_lease(the_store, settings.storage))
            upkeep = asyncio.create_task(run_upkeep(the_store, settings.storage))
            yield
        finally:
            await _cancelled(upkeep)
            state: FacadeState = app.state.facade
            await state.background.stop_all()
            await state.responses.cancel_all()
            # The lease held while the running responses were ended; now this instance is gone.
            await _cancelled(lease)
            with contextlib.suppress(Exception):
                await the_store.leases.release()
            if opened is not None:
                state.responses.close()
                await opened.close()
            if store is None:
                # Ours (opened above, or with the state when `engine` was given): close it.
                state.store.close()

    keys_required = settings.api_keys.enabled
    app = FastAPI(
        title="vlmserve facade",
        summary="OpenAI Responses API over a vlmserve engine",
        version=version(),
        lifespan=lifespan,
        # With keys, the schema is served behind the key below and the browser UIs are off
        # (they fetch the schema without a key).
        openapi_url=None if keys_required else "/openapi.json",
        docs_url=None if keys_required else "/docs",
        redoc_url=None if keys_required else "/redoc",
    )
    if engine is not None:
        # Ready without a lifespan run (in-process tests drive the app over ASGI directly).
        app.state.facade = build_state(
            given_clients(engine), store if store is not None else open_store(settings)
        )
    install_error_handlers(app, classify=_storage_error)
    map_error(app, OutOfSpaceError, lambda error: insufficient_storage(error.what))
    install_openapi(app, settings.limits)
    install_api_keys(app, settings.api_keys, settings.operator_keys)
    limits = settings.limits
    app.add_middleware(HeaderLimits, max_headers=limits.max_headers, max_header_bytes=limits.max_header_bytes)
    # Whatever fails after a response was admitted, what it took is given back when its request ends.
    app.add_middleware(AbandonUnclaimed)
    # A dependency on each route (not path matching): a route added later is guarded too.
    guarded: dict[str, Any] = {"dependencies": [Depends(require_owner), *dependencies]}
    app.include_router(compact_routes.router, **guarded)
    app.include_router(responses_routes.router, **guarded)
    app.include_router(conversations_routes.router, **guarded)
    app.include_router(files_routes.router, **guarded)
    app.include_router(chat_routes.router, **guarded)
    app.include_router(anthropic_routes.router, **guarded)
    app.include_router(models_routes.models_router, **guarded)
    # Probed without credentials; it tells a caller without a key only ready or not (models.py).
    app.include_router(models_routes.readiness_router, dependencies=list(dependencies))
    app.include_router(models_routes.health_router)
    # The page to try it (GET /ui): static, no data; its API calls carry the key (routes/ui.py).
    app.include_router(ui_routes.router)
    # Checks the same keys itself, at the handshake (the HTTP dependency needs a Request).
    app.include_router(responses_ws_routes.router)
    # The operator's: its figures count every key's traffic (none is labelled by owner).
    app.add_api_route(
        "/metrics",
        metrics_endpoint(metrics),
        methods=["GET"],
        include_in_schema=False,
        dependencies=[Depends(require_operator), *dependencies],
    )
    # Outermost: every answer is counted, a refusal by the limits or the keys too.
    app.add_middleware(HttpMetrics, metrics=metrics)
    # Around everything else, so every line logged while serving a request carries its id.
    app.add_middleware(RequestIds)
    if keys_required:

        @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(require_owner)])
        async def openapi_schema() -> JSONResponse:
            return JSONResponse(app.openapi())

    return app


def _storage_error(error: Exception) -> APIError | None:
    """A write the disk had no room for, raised as it was (ENOSPC, SQLite's full database): 507."""
    return insufficient_storage() if is_out_of_space(error) else None

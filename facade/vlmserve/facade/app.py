"""The FastAPI app: OpenAI Responses API over the engine."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from fastapi import Depends, FastAPI, Request
from fastapi import params as fastapi_params
from fastapi.responses import JSONResponse

from vlmserve.client import AsyncEngineClient, Deadlines
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
from vlmserve.facade.settings.model_routes import ModelRoute
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


@dataclass
class AppServices:
    """What one app is built from, made once by `create_app`; `state` is the one builder of what
    the routes share (`FacadeState`), called when the app is made (engine clients given) or by
    the lifespan (clients opened for it)."""

    settings: FacadeSettings
    metrics: FacadeMetrics
    files: FileRepository
    disk: DiskSpace
    image_sources: ImageSourceFactory | None
    # Given by the caller, left open for it to close; None: the lifespan opens (and closes) them.
    engine: AsyncEngineClient | Mapping[str, AsyncEngineClient] | None = None
    store: Store | None = None

    @classmethod
    def build(
        cls,
        settings: FacadeSettings,
        *,
        engine: AsyncEngineClient | Mapping[str, AsyncEngineClient] | None,
        store: Store | None,
        image_sources: ImageSourceFactory | None,
    ) -> AppServices:
        if image_sources is None:
            fetcher = image_fetcher_from_settings(settings.remote_images)
            image_sources = fetcher.for_request if fetcher is not None else None
        disk = DiskSpace(
            [settings.files_directory(), *([settings.store_path] if settings.store is None else [])],
            min_free_bytes=settings.storage.min_free_disk_bytes,
        )
        return cls(
            settings=settings,
            metrics=FacadeMetrics(),
            files=FileRepository(settings.files_directory()),
            disk=disk,
            image_sources=image_sources,
            engine=engine,
            store=store,
        )

    def opened_store(self) -> Store:
        """The store given, else the one of the settings (`open_store`)."""
        return self.store if self.store is not None else open_store(self.settings)

    def router(self) -> ModelRouter:
        """Every model's engines: the clients given, else a new client per model."""
        settings, given = self.settings, self.engine
        if given is None:
            return model_router(settings, lambda route: engine_client(settings, route.target))
        if isinstance(given, AsyncEngineClient):
            return model_router(settings, lambda route: given)
        return model_router(settings, lambda route: given[route.id or ""])

    def state(self, router: ModelRouter, store: Store) -> FacadeState:
        """What the routes share, for these engines and this store."""
        settings = self.settings
        limits = settings.limits
        per_key = settings.api_keys.enabled
        service = ResponsesService(
            settings=settings,
            models=router,
            store=store,
            image_sources=self.image_sources,
            metrics=self.metrics,
            files=self.files,
            admission=KeyAdmission(
                limits.max_responses_per_key if per_key else None,
                max_logprobs_per_key=limits.max_logprob_responses_per_key if per_key else None,
                retry_after_s=settings.retry_after_s,
            ),
            slots=EngineSlots(limits.max_engine_calls),
            disk=self.disk,
        )
        self.metrics.watch_running(lambda: len(service.running))
        return FacadeState(
            settings=settings,
            engine=router.default.engine,
            store=store,
            catalog=router.default.catalog,
            responses=service,
            body_budget=BodyBudget(
                limits.max_body_bytes_in_flight,
                per_owner_bytes=settings.body_bytes_per_key(),
                retry_after_s=settings.retry_after_s,
            ),
            background=BackgroundRuns(
                store,
                max_event_bytes=settings.storage.max_response_event_bytes,
                control_s=settings.timeouts.control,
            ),
            files=self.files,
            disk=self.disk,
            models=router,
        )


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """One run of the app: what it opens, it closes; a later run (a test client's) opens its own."""
    services: AppServices = app.state.services
    settings = services.settings
    opened: ModelRouter | None = None
    if services.engine is None:
        opened = services.router()
        app.state.facade = services.state(opened, services.opened_store())
    state: FacadeState = app.state.facade
    the_store = state.store
    upkeep: asyncio.Task[None] | None = None
    lease: asyncio.Task[None] | None = None
    try:
        # This run is a new facade instance: what it starts is its own while its lease lives.
        # Responses of instances whose lease expired (a previous run killed, another facade
        # that died) are marked failed now and then every renewal.
        await the_store.leases.start(settings.storage.lease_ttl_s)
        await fail_interrupted(the_store)
        await services.files.remove_orphans()
        lease = asyncio.create_task(run_lease(the_store, settings.storage))
        upkeep = asyncio.create_task(run_upkeep(the_store, settings.storage))
        yield
    finally:
        await _cancelled(upkeep)
        await state.background.stop_all()
        await state.responses.cancel_all()
        # The lease held while the running responses were ended; now this instance is gone.
        await _cancelled(lease)
        with contextlib.suppress(Exception):
            await the_store.leases.release()
        if opened is not None:
            state.responses.close()
            await opened.close()
        if services.store is None:
            # Ours (opened above, or with the state when `engine` was given): close it.
            state.store.close()


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
    services = AppServices.build(settings, engine=engine, store=store, image_sources=image_sources)
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
    app.state.services = services
    if engine is not None:
        # Ready without a lifespan run (in-process tests drive the app over ASGI directly).
        app.state.facade = services.state(services.router(), services.opened_store())
    install_error_handlers(app, classify=_storage_error)
    map_error(app, OutOfSpaceError, lambda error: insufficient_storage(error.what))
    install_openapi(app, settings.limits)
    install_api_keys(app, settings.api_keys, settings.operator_keys)
    limits = settings.limits
    app.add_middleware(HeaderLimits, max_headers=limits.max_headers, max_header_bytes=limits.max_header_bytes)
    # Whatever fails after a response was admitted, what it took is given back when its request ends.
    app.add_middleware(AbandonUnclaimed)
    _include_routes(app, services.metrics, dependencies)
    # Outermost: every answer is counted, a refusal by the limits or the keys too.
    app.add_middleware(HttpMetrics, metrics=services.metrics)
    # Around everything else, so every line logged while serving a request carries its id.
    app.add_middleware(RequestIds)
    return app


def _include_routes(
    app: FastAPI, metrics: FacadeMetrics, dependencies: Sequence[fastapi_params.Depends]
) -> None:
    # A dependency on each route (not path matching): a route added later is guarded too.
    guarded: dict[str, Any] = {"dependencies": [Depends(require_owner), *dependencies]}
    for router in _GUARDED_ROUTERS:
        app.include_router(router, **guarded)
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
    if app.openapi_url is None:
        # Keys required: the schema is served behind one.
        app.add_api_route(
            "/openapi.json",
            _openapi_schema,
            methods=["GET"],
            include_in_schema=False,
            dependencies=[Depends(require_owner)],
        )


_GUARDED_ROUTERS = (
    compact_routes.router,
    responses_routes.router,
    conversations_routes.router,
    files_routes.router,
    chat_routes.router,
    anthropic_routes.router,
    models_routes.models_router,
)


async def _openapi_schema(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


def _storage_error(error: Exception) -> APIError | None:
    """A write the disk had no room for, raised as it was (ENOSPC, SQLite's full database): 507."""
    return insufficient_storage() if is_out_of_space(error) else None

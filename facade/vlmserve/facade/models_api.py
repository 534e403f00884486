"""`/v1/models` from the engine's model info, and the health endpoints."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from .catalog import DEFAULT_MODEL_ALIAS, model_object
from .http_errors import APIError, model_not_found
from .state import FacadeState, facade_state

models_router = APIRouter(prefix="/v1/models", tags=["models"])
# Liveness stays outside authentication (docs/responses-api.md, "Authentication"): it says
# only that the process is up.
health_router = APIRouter(tags=["health"])
# Readiness names the model and reaches the engine: behind the key like every other route
# (probes that need it send the key; docs/responses-api.md, Authentication).
readiness_router = APIRouter(tags=["health"])
State = Annotated[FacadeState, Depends(facade_state)]


@models_router.get("")
async def list_models(state: State) -> dict[str, Any]:
    info = await state.catalog.info()
    return {"object": "list", "data": [model_object(info)]}


@models_router.get("/{model_id:path}")
async def retrieve_model(model_id: str, state: State) -> dict[str, Any]:
    info = await state.catalog.info()
    if model_id not in (info.model_id, DEFAULT_MODEL_ALIAS):
        raise model_not_found(model_id)
    return model_object(info)


@health_router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up (it does not ask the engine)."""
    return {"status": "ok"}


@readiness_router.get("/readyz")
async def readyz(state: State) -> dict[str, str]:
    """The engine is reachable and SERVING, and its model is known."""
    if not await state.engine.health(timeout=state.settings.timeouts.control):
        raise APIError(503, "The engine is not serving.", code="engine_unavailable")
    info = await state.catalog.info()
    return {"status": "ready", "model": info.model_id}

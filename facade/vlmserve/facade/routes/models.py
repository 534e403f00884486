"""`/v1/models` from the engine's model info, and the health endpoints.

The list and its model objects carry both OpenAI's fields (`object`, `created`, `owned_by`) and
Anthropic's (`type`, `display_name`, `created_at`; the list's `has_more`, `first_id`,
`last_id`): neither SDK minds the other's, so both read the same answer.
"""

from __future__ import annotations

import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends

from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade.http.errors import APIError, model_not_found
from vlmserve.facade.responses.catalog import DEFAULT_MODEL_ALIAS, model_object
from vlmserve.facade.state import FacadeState, facade_state

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
    listed = _model(info)
    return {
        "object": "list",
        "data": [listed],
        "has_more": False,
        "first_id": listed["id"],
        "last_id": listed["id"],
    }


@models_router.get("/{model_id:path}")
async def retrieve_model(model_id: str, state: State) -> dict[str, Any]:
    info = await state.catalog.info()
    if model_id not in (info.model_id, DEFAULT_MODEL_ALIAS):
        raise model_not_found(model_id)
    return _model(info)


def _model(info: pb.GetModelInfoResponse) -> dict[str, Any]:
    """The model object, with Anthropic's fields beside OpenAI's."""
    loaded = datetime.datetime.fromtimestamp(int(info.loaded_at), tz=datetime.UTC)
    anthropic = {
        "type": "model",
        "display_name": info.model_id,
        "created_at": loaded.isoformat().replace("+00:00", "Z"),
    }
    return {**model_object(info), **anthropic}


@health_router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up (it does not ask the engine)."""
    return {"status": "ok"}


@readiness_router.get("/readyz")
async def readyz(state: State) -> dict[str, str]:
    """The engine is reachable and SERVING, and its model is known."""
    if not await state.engine.health(timeout=state.settings.timeouts.control):
        raise APIError(503, "The engine is not serving.", code="engine_unavailable")
    low = state.disk.low() if state.disk is not None else None
    if low is not None:
        # Nothing could be stored: not ready (disk_space.py).
        raise APIError(503, f"The server is out of storage space: {low}.", code="insufficient_storage")
    info = await state.catalog.info()
    return {"status": "ready", "model": info.model_id}

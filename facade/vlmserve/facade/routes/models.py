"""`/v1/models` from the engine's model info, and the health endpoints.

The list and its model objects carry both OpenAI's fields (`object`, `created`, `owned_by`) and
Anthropic's (`type`, `display_name`, `created_at`; the list's `has_more`, `first_id`,
`last_id`): neither SDK minds the other's, so both read the same answer.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from vlmserve.client import EngineError
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade.engines.catalog import model_object
from vlmserve.facade.engines.pools import PoolStatus
from vlmserve.facade.http.api_keys import authenticate
from vlmserve.facade.http.errors import APIError
from vlmserve.facade.state import FacadeState, facade_state

models_router = APIRouter(prefix="/v1/models", tags=["models"])
# Liveness stays outside authentication (docs/responses-api.md, "Authentication"): it says
# only that the process is up.
health_router = APIRouter(tags=["health"])
# Readiness answers without a key (orchestrators probe without credentials), but only with the
# key (or with keys off) does it say which models serve and why not: without one it reveals
# nothing but ready or not (docs/responses-api.md, Authentication).
readiness_router = APIRouter(tags=["health"])
State = Annotated[FacadeState, Depends(facade_state)]


@models_router.get("")
async def list_models(state: State) -> dict[str, Any]:
    """Every model served (by its id; its aliases under `vlmserve`), with its engine's model info.
    An error only when no model's engines can be asked and none was ever described."""
    listing = await state.models.listing(timeout_s=state.settings.timeouts.control, strict=True)
    data = [
        _model(status.id, status.info, aliases=status.pool.aliases, available=status.serving)
        for status in listing
    ]
    return {
        "object": "list",
        "data": data,
        "has_more": False,
        "first_id": data[0]["id"],
        "last_id": data[-1]["id"],
    }


@models_router.get("/{model_id:path}")
async def retrieve_model(model_id: str, state: State) -> dict[str, Any]:
    """One model, by its id or an alias (the object names its id)."""
    model = await state.models.resolve(model_id)
    return _model(model.id, model.info, aliases=model.pool.aliases)


def _model(
    model_id: str, info: pb.GetModelInfoResponse | None, *, aliases: Sequence[str], available: bool = True
) -> dict[str, Any]:
    """The model object, with Anthropic's fields beside OpenAI's."""
    loaded = datetime.datetime.fromtimestamp(int(info.loaded_at) if info is not None else 0, tz=datetime.UTC)
    anthropic = {
        "type": "model",
        "display_name": model_id,
        "created_at": loaded.isoformat().replace("+00:00", "Z"),
    }
    return {**model_object(model_id, info, aliases=aliases, available=available), **anthropic}


@health_router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up (it does not ask the engine)."""
    return {"status": "ok"}


async def _why_not(status: PoolStatus, state: FacadeState) -> str:
    try:
        await status.pool.engine.model_info(timeout=state.settings.timeouts.control)
    except EngineError as error:
        return error.details
    return "not serving"


@readiness_router.get("/readyz")
async def readyz(request: Request, state: State) -> JSONResponse:
    """Ready while some model's engines are reachable and SERVING and describe their model, and
    there is room to store; the body says which models serve (`models`). 503 when none does.
    Without a valid key (keys on): the same status, and a body that says only that."""
    listing = await state.models.listing(timeout_s=state.settings.timeouts.control)
    ready = any(status.serving for status in listing)
    low = state.disk.low() if state.disk is not None else None
    try:
        authenticate(request)
    except APIError:
        if ready and low is None:
            return JSONResponse({"status": "ready"})
        raise APIError(503, "The server is not ready.", code="not_ready") from None
    models = {status.id: "serving" if status.serving else "unavailable" for status in listing}
    if not ready:
        # What each engine says it is doing (a loading one: its phase and times, load_progress.py).
        reasons = await asyncio.gather(*(_why_not(status, state) for status in listing))
        detail = "; ".join(f"{status.id}: {reason}" for status, reason in zip(listing, reasons, strict=True))
        raise APIError(503, f"No engine is serving ({detail}).", code="engine_unavailable")
    if low is not None:
        # Nothing could be stored: not ready (disk_space.py).
        raise APIError(503, f"The server is out of storage space: {low}.", code="insufficient_storage")
    return JSONResponse({"status": "ready", "model": listing[0].id, "models": models})

"""What the routes share: settings, engine client, store, model catalog, running generations,
background runs."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from fastapi import Request

from vlmserve.client import AsyncEngineClient
from vlmserve.facade.engines.catalog import ModelCatalog
from vlmserve.facade.engines.pools import ModelRouter
from vlmserve.facade.http.body_budget import BodyBudget
from vlmserve.facade.responses.background import BackgroundRuns
from vlmserve.facade.responses.preparation import ResponsesService
from vlmserve.facade.settings import FacadeSettings
from vlmserve.facade.store.disk_space import DiskSpace
from vlmserve.facade.store.files import FileRepository
from vlmserve.facade.store.repositories import Store


@dataclass
class FacadeState:
    settings: FacadeSettings
    # The default model's engines and catalog (what needs no `model`: conversation items).
    engine: AsyncEngineClient
    store: Store
    catalog: ModelCatalog
    responses: ResponsesService
    # Bytes of request bodies being read and translated (http/body_budget.py).
    body_budget: BodyBudget
    # Runs of background responses, and their stored events (responses/background.py).
    background: BackgroundRuns
    # Every model served, and the resolver of a request's `model` (engines/pools.py).
    models: ModelRouter
    # Uploaded files (store/files.py), on disk beside the store.
    files: FileRepository | None = None
    # Free space where the store and the files are (store/disk_space.py).
    disk: DiskSpace | None = None
    # Open WebSocket connections by owner (routes/responses_ws.py bounds them per key).
    websockets: Counter[str] = field(default_factory=Counter)


def facade_state(request: Request) -> FacadeState:
    state: FacadeState = request.app.state.facade
    return state

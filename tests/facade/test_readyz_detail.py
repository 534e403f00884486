"""/readyz says why it is not ready: each model's engine in its own words — a loading engine's
phase and times (engine/load_progress.py), one that does not serve, one that cannot be reached."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import httpx

from tests.facade.fake_engine import MODEL_ID, RunningFakeEngine
from vlmserve.client import UnavailableError
from vlmserve.facade.routes.models import _why_not

LOADING = (
    "the model is still loading: warming up (step 3 of 3, 1.2 s; reading weights took 4.0 s); retry shortly"
)


class Loading:
    async def model_info(self, *, timeout: float | None = None) -> Any:
        raise UnavailableError(LOADING)


async def test_a_loading_engine_s_words_are_passed_on() -> None:
    status: Any = SimpleNamespace(pool=SimpleNamespace(engine=Loading()))
    state: Any = SimpleNamespace(settings=SimpleNamespace(timeouts=SimpleNamespace(control=1.0)))
    assert await _why_not(status, state) == LOADING


async def test_not_serving_and_unreachable(http: httpx.AsyncClient, fake_engine: RunningFakeEngine) -> None:
    await fake_engine.set_serving(False)
    reply = await http.get("/readyz")
    assert reply.status_code == 503
    # The model's id (the engine's, or `default` before it was ever described) and why.
    pattern = rf"No engine is serving \((default|{re.escape(MODEL_ID)}): not serving\)\."
    assert re.fullmatch(pattern, reply.json()["error"]["message"])
    await fake_engine.stop()
    reply = await http.get("/readyz")
    assert reply.status_code == 503
    message = reply.json()["error"]["message"]
    assert message.startswith("No engine is serving (") and not message.endswith(": not serving).")

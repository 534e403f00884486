"""/readyz says why it is not ready: each model's engine in its own words — a loading engine's
phase and times (engine/load_progress.py), one that does not serve, one that cannot be reached."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import httpx

from tests.facade.fake_engine import MODEL_ID, RunningFakeEngine
from tests.facade.helpers import in_process
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


async def test_probed_without_a_key_it_says_only_ready_or_not(
    settings: Any, engine_client: Any, store: Any, fake_engine: RunningFakeEngine
) -> None:
    """Orchestrators probe without credentials (issue 39, finding 8: with keys on /readyz was a
    401): with keys on, no key (or a wrong one) gets the status and nothing else; the key gets
    the models and the reasons."""
    from vlmserve.facade import create_app
    from vlmserve.facade.settings.api_keys import ApiKeys

    app = create_app(
        settings.replace(api_keys=ApiKeys.from_keys(["sk-probe"])), engine=engine_client, store=store
    )
    keyed = {"Authorization": "Bearer sk-probe"}
    async with in_process(app) as http:
        for headers in ({}, {"Authorization": "Bearer sk-wrong"}):
            assert (await http.get("/readyz", headers=headers)).json() == {"status": "ready"}
        assert (await http.get("/readyz", headers=keyed)).json()["models"] == {MODEL_ID: "serving"}
        await fake_engine.set_serving(False)
        bare = await http.get("/readyz")
        assert bare.status_code == 503
        assert bare.json()["error"]["message"] == "The server is not ready."
        assert MODEL_ID not in bare.text and "serving" not in bare.text
        detailed = await http.get("/readyz", headers=keyed)
        assert detailed.status_code == 503 and "not serving" in detailed.json()["error"]["message"]

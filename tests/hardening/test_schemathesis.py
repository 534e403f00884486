"""schemathesis against the facade's own OpenAPI schema, in-process over ASGI, fake engine behind:
positive and negative generation, a bounded number of cases per operation; no 5xx, ever.

schemathesis drives the app from its own event loop thread (a blocking portal), so the app makes
its engine client in its lifespan, there, and the scripted engine runs on a loop thread of its
own. The schema is loaded at import (`from_fixture` does not work with pytest 9); the engine
behind it starts with the first test.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import hypothesis.strategies as st
import pytest
import schemathesis

from tests._services import free_port
from tests.facade.fake_engine import RunningFakeEngine, start_fake_engine
from vlmserve.facade import FacadeSettings, Timeouts, create_app

# Fuzzing takes ~40 CPU-s: `make test` runs it, the inner loop (`make test-fast`) does not.
pytestmark = pytest.mark.slow

MAX_EXAMPLES = 40
STATEFUL_SCENARIOS = 15
CONFIG = schemathesis.Config.from_dict(
    {"seed": 20251130, "generation": {"mode": "all", "max-examples": MAX_EXAMPLES}}
)
ENGINE_ADDRESS = f"127.0.0.1:{free_port()}"
STORE_DIR = Path(tempfile.mkdtemp(prefix="vlmserve-schemathesis-"))

APP = create_app(
    FacadeSettings(
        engine_address=ENGINE_ADDRESS,
        store_path=STORE_DIR / "facade.sqlite3",
        timeouts=Timeouts(generate=10.0, control=5.0, stream_first_message=1.0),
    )
)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP, config=CONFIG)

# Status codes per operation, for the report.
SEEN: dict[str, Counter[int]] = {}


@pytest.fixture(scope="module", autouse=True)
def fake_engine() -> Iterator[RunningFakeEngine]:
    loop = asyncio.new_event_loop()
    started = threading.Event()
    running: list[RunningFakeEngine] = []

    def serve() -> None:
        asyncio.set_event_loop(loop)
        running.append(loop.run_until_complete(start_fake_engine(ENGINE_ADDRESS)))
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, name="fake-engine", daemon=True)
    thread.start()
    assert started.wait(10)
    yield running[0]
    asyncio.run_coroutine_threadsafe(running[0].stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    shutil.rmtree(STORE_DIR, ignore_errors=True)
    print("schemathesis statuses:", {label: dict(sorted(seen.items())) for label, seen in SEEN.items()})


def record(case: schemathesis.Case, response: schemathesis.Response) -> None:
    SEEN.setdefault(case.operation.label, Counter())[response.status_code] += 1
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.text[:500]}"


@schema.parametrize()
def test_no_server_errors(case: schemathesis.Case) -> None:
    record(case, case.call())


class FacadeWorkflow(schema.as_state_machine()):  # type: ignore[misc]
    """Sequences of calls following the schema's links: create a response or a conversation,
    then retrieve, list, cancel, add to and delete it, by the id the first call returned."""

    def validate_response(
        self, response: schemathesis.Response, case: schemathesis.Case, **kwargs: Any
    ) -> None:
        STATEFUL[case.operation.label] += 1
        record(case, response)


STATEFUL: Counter[str] = Counter()

# schemathesis' state machine does not start from POST /v1/responses (it reads
# `previous_response_id` as needing a resource nothing produces), so this test walks the
# response links itself, with schemathesis-generated cases at every step.
CREATE = schema["/v1/responses"]["POST"]
POSITIVE, NEGATIVE = schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE
# With the id fixed, only input_items has anything to make invalid (its query); asking for a
# negative case of the others is unsatisfiable, and hypothesis would drop the walk silently.
FOLLOW_UPS = [
    ("/v1/responses/{response_id}", "GET", [POSITIVE]),
    ("/v1/responses/{response_id}/input_items", "GET", [POSITIVE, NEGATIVE]),
    ("/v1/responses/{response_id}/cancel", "POST", [POSITIVE]),
    ("/v1/responses/{response_id}", "DELETE", [POSITIVE]),
    ("/v1/responses/{response_id}", "GET", [POSITIVE]),
]


@hypothesis.given(case=CREATE.as_strategy(POSITIVE), data=st.data())
@hypothesis.settings(
    max_examples=STATEFUL_SCENARIOS * 2,
    deadline=None,
    suppress_health_check=list(hypothesis.HealthCheck),
    database=None,
    derandomize=True,
)
def _walk_a_created_response(case: schemathesis.Case, data: st.DataObject) -> None:
    if isinstance(case.body, dict):
        case.body.update(store=True, stream=False)
    created = case.call()
    record(case, created)
    if created.status_code != 200:
        return  # a generated body the facade refused (4xx): nothing to follow
    response_id = created.json()["id"]
    WALKED["created"] += 1
    follow_up = data.draw(CREATE.as_strategy(POSITIVE))
    if isinstance(follow_up.body, dict):
        follow_up.body.pop("conversation", None)
        follow_up.body["previous_response_id"] = response_id
    record(follow_up, follow_up.call())
    for path, method, modes in FOLLOW_UPS:
        mode = data.draw(st.sampled_from(modes))
        step = data.draw(schema[path][method].as_strategy(mode, path_parameters={"response_id": response_id}))
        WALKED[f"{method} {path}"] += 1
        record(step, step.call())
    WALKED["completed"] += 1


WALKED: Counter[str] = Counter()


def test_created_responses_through_their_links() -> None:
    """Every step of every walk is checked for 5xx by `record`; and the walks must really have
    happened: enough generated bodies were accepted and walked to the end (hypothesis drops an
    example whose draw overruns its buffer, so not every created response is walked)."""
    WALKED.clear()
    _walk_a_created_response()
    print("walked:", dict(WALKED))
    assert WALKED["completed"] >= STATEFUL_SCENARIOS // 3, WALKED
    for path, method, _modes in FOLLOW_UPS:
        assert WALKED[f"{method} {path}"] >= WALKED["completed"], (method, path, WALKED)


def test_stateful_workflows_have_no_server_errors() -> None:
    FacadeWorkflow.run(
        settings=hypothesis.settings(
            max_examples=STATEFUL_SCENARIOS,
            stateful_step_count=6,
            deadline=None,
            suppress_health_check=list(hypothesis.HealthCheck),
            database=None,
            derandomize=True,
        )
    )
    # Links were followed: operations that need an existing id were reached with one.
    followed = {label for label in STATEFUL if "{conversation_id}" in label}
    print("stateful calls:", dict(STATEFUL))
    assert len(followed) >= 3, STATEFUL

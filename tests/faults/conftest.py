"""A small engine (one running request, one waiting) behind its own facade, for the fault tests.

With one generation slot, a generation that keeps running after its client left is visible from
outside: the next request cannot start until it ends. With one queue place, the admission limit
is reached by two requests.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests._services import ServiceProcess, start_facade
from tests.faults.stack import WAIT_S, loopback_address, start_engine_at

MAX_ACTIVE = 1
MAX_QUEUE = 1


@dataclass(frozen=True)
class SmallStack:
    engine: ServiceProcess
    facade: ServiceProcess

    @property
    def url(self) -> str:
        return self.facade.address

    def http(self, timeout: float = WAIT_S) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout)


@pytest.fixture(scope="session")
def small_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SmallStack]:
    log_dir = tmp_path_factory.mktemp("small-stack")
    extra = ("--max-active", str(MAX_ACTIVE), "--max-queue", str(MAX_QUEUE))
    engine = start_engine_at(log_dir, loopback_address(), extra=extra)
    try:
        facade = start_facade(log_dir, engine.address, store_path=log_dir / "responses.sqlite3")
    except BaseException:
        engine.stop()
        raise
    yield SmallStack(engine, facade)
    facade.stop()
    engine.stop()


@pytest.fixture
def idle_small_stack(small_stack: SmallStack) -> Iterator[SmallStack]:
    """The small stack; after the test, one short request must get through (the slot is free again)."""
    yield small_stack
    with small_stack.http() as http:
        # One short request goes through only once the single slot is free again. A cancel
        # reaches the engine asynchronously (within a step, after the gRPC cancel lands), so
        # the place may take a moment: a few seconds, never for good.
        deadline = time.monotonic() + 10
        while True:
            answer = http.post(
                "/v1/responses", json={"model": "default", "input": "idle?", "max_output_tokens": 1}
            )
            if answer.status_code != 503 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert answer.status_code == 200, answer.text

"""Fixtures for the squares proof: the trained model, in-process and behind the real services.

When the session engine (tests/conftest.py) already serves the squares model — the project's
default once it is switched — it is reused; otherwise an engine + facade pair on the squares
model is started once for this directory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._services import REPO, ServiceProcess, start_engine, start_facade

SQUARES_MODEL = REPO / "models" / "qwen2-vl-squares"


def _session_model() -> Path:
    """The model the session-wide engine fixture starts (see tests/_services.start_engine)."""
    chosen = os.environ.get("VLMSERVE_TEST_MODEL") or os.environ.get("VLMSERVE_MODEL")
    if chosen:
        return Path(chosen).resolve()
    from vlmserve.engine.model import DEFAULT_MODEL_PATH

    return DEFAULT_MODEL_PATH.resolve()


def _session_serves_squares() -> bool:
    return _session_model() == SQUARES_MODEL.resolve()


@pytest.fixture(scope="session")
def squares_mlx() -> tuple[Any, Any]:
    """(model, processor) of the committed squares model, loaded by the unchanged mlx_vlm.load."""
    from mlx_vlm.utils import load

    return load(str(SQUARES_MODEL))


@pytest.fixture(scope="session")
def squares_services(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """(engine address, facade URL) serving the squares model."""
    if _session_serves_squares():
        yield request.getfixturevalue("engine_address"), request.getfixturevalue("facade_url")
        return
    logs = tmp_path_factory.mktemp("squares-services")
    engine: ServiceProcess = start_engine(logs, model=str(SQUARES_MODEL))
    try:
        facade = start_facade(logs, engine.address, store_path=logs / "responses.sqlite3")
        try:
            yield engine.address, facade.address
        finally:
            facade.stop()
    finally:
        engine.stop()


@pytest.fixture(scope="session")
def squares_engine_address(squares_services: tuple[str, str]) -> str:
    return squares_services[0]


@pytest.fixture(scope="session")
def squares_facade_url(squares_services: tuple[str, str]) -> str:
    return squares_services[1]

"""Session-wide fixtures: a real engine process and a real facade process, on loopback.

Tests that need the full product (engine on the fixture model + facade) take
`facade_url` / `engine_address`; both processes start once per test session.
Tests that need their own processes (fault tests) use `tests._services` directly.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import _marker_guard
from tests._engine_recorder import EngineRecorder, start_engine_recorder
from tests._services import ServiceProcess, start_engine, start_facade

# The scripted-engine fixtures (fake_engine, engine, engine_client, settings, store) serve the
# facade and hardening tests alike.
pytest_plugins = ["tests.facade.fixtures", "tests._family_models", "tests._postgres"]

# `needs_model` (pyproject): the test loads a real model or starts processes; `make test-fast`
# leaves those out. A test gets it from its module's `pytestmark`, or here when it uses one of
# these fixtures (by where the fixture is defined: the facade's scripted `engine` is not the
# engine tests' real one).
MODEL_FIXTURES = {
    ("tests.conftest", "engine_process"),
    ("tests.conftest", "random_engine_address"),
    ("tests.engine.conftest", "engine"),
    ("tests._family_models", "family_models"),
    ("tests._family_models", "drafter_models"),
    ("tests._postgres", "postgres_server"),
    ("tests.e2e.conftest", "squares_mlx"),
    ("tests.e2e.conftest", "squares_services"),
    ("tests.faults.conftest", "small_stack"),
    ("tests.engine.test_kv_quantized", "quantized"),
    ("tests.engine.test_speculative_decoding", "generators"),
    ("tests.engine.test_request_prep", "wide_range_preparer"),
    ("tests.engine.test_speculation", "fixture_logits"),
    ("tests.e2e.test_squares_training_data", "model_float32"),
    ("tests.e2e.test_structured_real_clients", "any_facade_url"),
    ("tests.e2e.test_no_error_logs_real_stack", "stack"),
}


def _uses_model_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        (definitions[-1].func.__module__, name) in MODEL_FIXTURES
        for name, definitions in info.name2fixturedefs.items()
        if definitions
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("needs_model") is None and _uses_model_fixture(item):
            item.add_marker(pytest.mark.needs_model)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _marker_guard.running(item)
    try:
        return (yield)
    finally:
        _marker_guard.running(None)


@pytest.fixture(scope="session", autouse=True)
def _model_loads_need_the_marker() -> None:
    """Set up before any module's fixtures, so a module fixture's load is checked too."""
    _marker_guard.guard_model_loads()


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built by its own build backend (hatchling) from this tree: once a
    session for the packaging tests (tests/client; one xdist group, so one worker builds it)."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = out.glob("vlmserve-*.whl")
    return wheel


@pytest.fixture(scope="session")
def service_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("service-logs")


@pytest.fixture(scope="session")
def engine_process(service_logs: Path) -> Iterator[ServiceProcess]:
    """The real engine (`vlmserve-engine`) on the default fixture model."""
    service = start_engine(service_logs)
    yield service
    service.stop()


@pytest.fixture(scope="session")
def engine_address(engine_process: ServiceProcess) -> str:
    return engine_process.address


@pytest.fixture(scope="session")
def facade_process(
    engine_process: ServiceProcess, service_logs: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    """The real facade (`vlmserve-facade`) in front of `engine_process`."""
    store = tmp_path_factory.mktemp("facade-store") / "responses.sqlite3"
    service = start_facade(service_logs, engine_process.address, store_path=store)
    yield service
    service.stop()


@pytest.fixture(scope="session")
def facade_url(facade_process: ServiceProcess) -> str:
    return facade_process.address


@pytest.fixture(scope="session")
def random_engine_address(service_logs: Path) -> Iterator[str]:
    """An engine on the random-weight fixture model, which never ends a turn by itself:
    for tests that need a generation to still be running (cancel, abort, deadlines)."""
    from tests._fixture_models import RANDOM_MODEL_PATH

    service = start_engine(service_logs, model=str(RANDOM_MODEL_PATH))
    yield service.address
    service.stop()


@pytest.fixture(scope="session")
def random_facade_url(
    random_engine_address: str, service_logs: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A real facade in front of `random_engine_address`: what the real-client tests drive (the
    grammar makes the random model's tool calls and JSON happen; its free text runs to the cap)."""
    store = tmp_path_factory.mktemp("random-facade-store") / "responses.sqlite3"
    service = start_facade(service_logs, random_engine_address, store_path=store)
    yield service.address
    service.stop()


@pytest.fixture(scope="session")
def engine_recorder(engine_address: str) -> Iterator[EngineRecorder]:
    """A recording gRPC hop in front of the session engine: tests see the exact engine requests."""
    recorder = start_engine_recorder(engine_address)
    yield recorder
    recorder.stop()


@pytest.fixture(scope="session")
def recorded_facade(
    engine_recorder: EngineRecorder, service_logs: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    """A real facade whose engine calls pass through `engine_recorder`."""
    store = tmp_path_factory.mktemp("recorded-store") / "responses.sqlite3"
    service = start_facade(service_logs, engine_recorder.address, store_path=store)
    yield service
    service.stop()

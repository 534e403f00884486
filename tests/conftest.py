"""Session-wide fixtures: a real engine process and a real facade process, on loopback.

Tests that need the full product (engine on the fixture model + facade) take
`facade_url` / `engine_address`; both processes start once per test session.
Tests that need their own processes (fault tests) use `tests._services` directly.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# The scripted-engine fixtures (fake_engine, engine, engine_client, settings, store) serve the
# facade and hardening tests alike.
pytest_plugins = ["tests.facade.fixtures", "tests._family_models", "tests._postgres"]

# `needs_model` (pyproject): the test loads a real model or starts processes; `make test-fast`
# leaves those out. A test gets it from its module's `pytestmark`, or here when it uses one of
# these fixtures (by where the fixture is defined: the facade's scripted `engine` is not the
# engine tests' real one). `_refuse_models_and_processes` keeps the marking exact.
MODEL_FIXTURES = {
    ("tests.conftest", "engine_process"),
    ("tests.conftest", "random_engine_address"),
    ("tests.engine.conftest", "engine"),
    ("tests._family_models", "family_models"),
    ("tests._postgres", "postgres_server"),
    ("tests.e2e.conftest", "squares_mlx"),
    ("tests.e2e.conftest", "squares_services"),
    ("tests.faults.conftest", "small_stack"),
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


# Programs that mean "a process of the product or of a real client" (the standard library's own
# helpers, such as `uname` behind platform.platform(), are not).
_PROCESS_PROGRAMS = (
    "python",
    "vlmserve",
    "node",
    "npx",
    "npm",
    "codex",
    "postgres",
    "pg_ctl",
    "initdb",
    "make",
)


def _program(args: Any) -> str:
    first = args if isinstance(args, str | bytes | Path) else (list(args) or [""])[0]
    text = first.decode() if isinstance(first, bytes) else str(first)
    return Path(text.split()[0] if text.strip() else "").name


@pytest.fixture(autouse=True)
def _refuse_models_and_processes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test without `needs_model` that loads a model or starts one of the product's (or a real
    client's) processes fails, saying so."""
    if request.node.get_closest_marker("needs_model") is not None:
        return

    def refuse(*args: Any, **kwargs: Any) -> Any:
        pytest.fail("this test loads a model or starts a process: mark it needs_model", pytrace=False)

    popen = subprocess.Popen.__init__

    def checked_popen(self: Any, args: Any, *rest: Any, **kwargs: Any) -> None:
        program = _program(args)
        if program == Path(sys.executable).name or program.startswith(_PROCESS_PROGRAMS):
            refuse()
        popen(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", checked_popen)
    for module, name in (("mlx_vlm", "load"), ("mlx_vlm.utils", "load"), ("mlx_vlm.utils", "sharded_load")):
        if (loaded := sys.modules.get(module)) is not None and hasattr(loaded, name):
            monkeypatch.setattr(loaded, name, refuse)

"""`from tests.facade.both_stores import on_both_store_backends  # noqa: F401` in a test module
runs its tests with `store` on SQLite and on PostgreSQL (the fixture overrides `store_backend`
there only; it is not in a plugin, which would make it everyone's)."""

from __future__ import annotations

import pytest


@pytest.fixture(name="store_backend", params=["sqlite", "postgresql"])
def on_both_store_backends(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    return backend

"""Keeps the `needs_model` marker honest: `make test-fast` selects by it, so a test without it
that loads model weights or starts a process fails at once, saying which marker it lacks,
instead of quietly making the inner loop slower."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest

_current: list[pytest.Item] = []


class UnmarkedModelUse(RuntimeError):
    pass


def check(what: str) -> None:
    """Raise unless the running test is out of `make test-fast` by its markers (`needs_model`
    or `slow`); outside a test: allowed."""
    if _current and not any(_current[-1].get_closest_marker(name) for name in ("needs_model", "slow")):
        raise UnmarkedModelUse(
            f"{_current[-1].nodeid} {what} but is not marked needs_model (pyproject markers), "
            "so make test-fast runs it; mark it, or take a fixture listed in tests/conftest.py "
            "MODEL_FIXTURES"
        )


def _guarded(function: Callable[..., Any], what: str) -> Callable[..., Any]:
    @functools.wraps(function)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        check(what)
        return function(*args, **kwargs)

    guarded.__marker_guarded__ = True  # type: ignore[attr-defined]
    return guarded


def guard_model_loads() -> None:
    """Wrap mlx-vlm's loaders (the engine imports them at call time, so the wrapper is what runs)."""
    import mlx_vlm
    import mlx_vlm.utils

    for owner, name in ((mlx_vlm, "load"), (mlx_vlm.utils, "load"), (mlx_vlm.utils, "load_model")):
        function = getattr(owner, name)
        if not getattr(function, "__marker_guarded__", False):
            setattr(owner, name, _guarded(function, f"loads model weights (mlx_vlm {name})"))


def running(item: pytest.Item | None) -> None:
    _current[:] = [item] if item is not None else []

"""The guard that keeps `make test-fast`'s selection honest (tests/_marker_guard.py)."""

from __future__ import annotations

import pytest

from tests import _marker_guard


def test_an_unmarked_test_that_loads_a_model_fails_naming_the_marker() -> None:
    import mlx_vlm

    with pytest.raises(_marker_guard.UnmarkedModelUse, match="is not marked needs_model"):
        mlx_vlm.load("models/qwen2-vl-tiny")


def test_an_unmarked_test_that_starts_an_engine_fails_before_starting_it(tmp_path: object) -> None:
    from tests._services import start_engine

    with pytest.raises(_marker_guard.UnmarkedModelUse, match="starts an engine process"):
        start_engine(tmp_path)  # type: ignore[arg-type]


@pytest.mark.needs_model
def test_a_marked_test_passes_the_guard() -> None:
    _marker_guard.check("loads model weights")


@pytest.mark.slow
def test_a_slow_test_passes_the_guard() -> None:
    """`make test-fast` leaves slow tests out too, whatever they load."""
    _marker_guard.check("starts an engine process")

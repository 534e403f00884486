"""The committed copying model (bench/speculative_vs_mlx_vlm.py's copying workload) loads with the
unchanged `mlx_vlm.load`, stays tiny, and copies: by real greedy generation it returns held-out
JSON objects and functions of training/copying.py exactly, and keeps most lines of the edit cases
(models/qwen2-vl-copying/README.md has its figures over 50 cases each).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests._services import REPO
from training.copying_eval import held_out_cases, score

COPYING_MODEL = REPO / "models" / "qwen2-vl-copying"

pytestmark = [pytest.mark.needs_model, pytest.mark.slow]


@pytest.fixture(scope="module")
def copying_mlx() -> tuple[Any, Any]:
    from mlx_vlm.utils import load

    return load(str(COPYING_MODEL))


def test_model_is_small_and_loads_with_plain_mlx_vlm(copying_mlx: tuple[Any, Any]) -> None:
    model, _ = copying_mlx
    assert (COPYING_MODEL / "model.safetensors").stat().st_size < 5_000_000
    assert model.config.model_type == "qwen2_vl"
    assert json.loads((COPYING_MODEL / "config.json").read_text())["num_hidden_layers"] == 3


def test_model_returns_held_out_objects_and_functions_exactly(copying_mlx: tuple[Any, Any]) -> None:
    model, processor = copying_mlx
    scores = score(model, processor, held_out_cases(12, unchanged=1.0))
    assert scores.exact == 1.0, scores.misses[:2]


def test_model_keeps_most_lines_of_an_edit(copying_mlx: tuple[Any, Any]) -> None:
    """Edits are the part it learnt least (README): most of each answer is still the prompt's."""
    model, processor = copying_mlx
    assert score(model, processor, held_out_cases(12)).lines >= 0.6

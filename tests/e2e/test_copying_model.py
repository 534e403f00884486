"""The committed copying model (bench/speculative_vs_mlx_vlm.py's copying workload) loads with the
unchanged `mlx_vlm.load` and stays tiny. It is partly trained (training/train_copying.py's status):
a test that it copies held-out cases of training/copying.py exactly belongs here once it does.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests._services import REPO

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

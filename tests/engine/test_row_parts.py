"""The pure parts of a row's split (no model): which prompts may share a prefill forward
(prefill.py `groupable`) and a row's clock (row_output.py `RowClock`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from vlmserve.engine.loop import row_output
from vlmserve.engine.loop.model_inputs import ModelInputs
from vlmserve.engine.loop.prefill import groupable

M_ROPE = np.zeros((1, 1))


def inputs(prefill_kwargs: dict[str, Any], rope_deltas: Any = M_ROPE) -> ModelInputs:
    return ModelInputs(
        token_ids=(1, 2, 3),
        image_spans=(),
        input_ids=None,
        embeds=None,
        prefill_kwargs=prefill_kwargs,
        rope_deltas=rope_deltas,
    )


@pytest.mark.parametrize(
    ("case", "prefill_kwargs", "rope_deltas", "expected"),
    [
        ("text, M-RoPE positions (2-D)", {"position_ids": np.zeros((1, 3))}, M_ROPE, True),
        ("image, M-RoPE positions (3-D) and grids", {"position_ids": np.zeros((3, 1, 3)),
         "image_grid_thw": np.ones((1, 3))}, M_ROPE, True),
        ("no explicit positions", {}, M_ROPE, False),
        ("plain RoPE (no deltas)", {"position_ids": np.zeros((1, 3))}, None, False),
        ("positions of another shape", {"position_ids": np.zeros(3)}, M_ROPE, False),
        ("an argument the shared forward cannot carry", {"position_ids": np.zeros((1, 3)),
         "pixel_values": np.zeros(1)}, M_ROPE, False),
    ],
)  # fmt: skip
def test_which_prompts_can_share_a_prefill_forward(
    case: str, prefill_kwargs: dict[str, Any], rope_deltas: Any, expected: bool
) -> None:
    assert groupable(inputs(prefill_kwargs, rope_deltas)) is expected, case


def test_a_rows_clock_keeps_each_gap_until_read(monkeypatch: pytest.MonkeyPatch) -> None:
    times = iter([10.5, 11.25, 11.5])
    monkeypatch.setattr(row_output.time, "perf_counter", lambda: next(times))
    clock = row_output.RowClock(started_at=10.0)
    assert clock.first_token_at is None
    clock.tick()
    assert (clock.first_token_at, clock.inter_token_seconds, clock.token_gaps) == (10.5, None, [])
    clock.tick()
    clock.tick()
    assert clock.first_token_at == 10.5 and clock.last_token_at == 11.5
    assert clock.inter_token_seconds == 0.25 and clock.token_gaps == [0.75, 0.25]

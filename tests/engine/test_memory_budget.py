"""Admission by memory (loop/memory_budget.py): what a request is estimated to hold, and the
refusal of one that can never fit. The engine-level behaviour (waiting, refusing over gRPC) is
in test_memory_admission.py."""

from __future__ import annotations

import grpc
import pytest

from vlmserve.engine.loop.memory_budget import MemoryBudget, default_budget_bytes
from vlmserve.engine.request_errors import RequestError

BUDGET = MemoryBudget(budget_bytes=10_000, kv_bytes_per_token=10)

COSTS = [
    ("prompt and output tokens at the cache's precision", 100, 50, 0, 1_500),
    ("images add their arrays", 100, 0, 2_000, 3_000),
    ("exactly the budget fits", 900, 100, 0, 10_000),
]


@pytest.mark.parametrize(("name", "prompt", "output", "images", "expected"), COSTS, ids=[c[0] for c in COSTS])
def test_cost(name: str, prompt: int, output: int, images: int, expected: int) -> None:
    assert BUDGET.cost(prompt, output, images) == expected
    assert BUDGET.check_fits(prompt, output, images) == expected


def test_a_request_that_can_never_fit_is_refused_with_what_to_change() -> None:
    with pytest.raises(RequestError) as raised:
        BUDGET.check_fits(900, 101, 0)
    error = raised.value
    assert error.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.field == "sampling.max_tokens"
    assert "lower max_tokens" in str(error) and "900 prompt + 101 output tokens" in str(error)


@pytest.mark.parametrize(
    ("device", "model", "expected"),
    [(16 << 30, 4 << 30, 8 << 30), (8 << 30, 8 << 30, 0)],
    ids=["three quarters less the model", "never negative"],
)
def test_default_budget(device: int, model: int, expected: int) -> None:
    assert default_budget_bytes(device, model) == expected

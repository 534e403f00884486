"""Admission by memory (loop/memory_budget.py): what a request is estimated to hold, and the
refusal of one that can never fit. The engine-level behaviour (waiting, refusing over gRPC) is
in test_memory_admission.py."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from vlmserve.engine.loop.memory_budget import MemoryBudget, default_budget_bytes
from vlmserve.engine.loop.vision_memory import FITTED, VisionCost, vision_cost
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


# The vision tower's transient (loop/vision_memory.py): width_bytes x (per_image + linear x t +
# quadratic x t^2) per image of t tokens, beside the KV, for as long as the prefill.
VISION = VisionCost(width_bytes=4, per_image=100.0, linear=2.0, quadratic=0.5)
WITH_VISION = MemoryBudget(budget_bytes=1 << 30, kv_bytes_per_token=10, vision=VISION)

TRANSIENTS = [
    ("no images, no transient", (), 0),
    ("one image: per image, linear and square terms", (10,), 4 * (100 + 20 + 50)),
    ("the square is per image, not of the sum", (10, 10), 2 * 4 * (100 + 20 + 50)),
    ("one large image costs more than its tokens split in two", (20,), 4 * (100 + 40 + 200)),
    ("an image with no tokens costs nothing", (0,), 0),
]


@pytest.mark.parametrize(("name", "tokens", "expected"), TRANSIENTS, ids=[c[0] for c in TRANSIENTS])
def test_vision_transient(name: str, tokens: tuple[int, ...], expected: int) -> None:
    assert WITH_VISION.transient(tokens) == expected
    # The reservation: KV for prompt + output, the images' arrays, and the transient.
    assert WITH_VISION.cost(100, 50, 2_000, tokens) == 1_500 + 2_000 + expected


IMAGE_TOKENS = [
    ("the prepared images' own counts", (1, 5, 1, 1, 5), (3, 4), (3, 4)),
    ("joint families: the placeholders shared evenly", (1, 5, 5, 5, 1, 5, 5), (0, 0), (3, 3)),
    ("no images", (1, 5, 5), (), ()),
]


@pytest.mark.parametrize(
    ("name", "prompt", "counts", "expected"), IMAGE_TOKENS, ids=[c[0] for c in IMAGE_TOKENS]
)
def test_image_tokens(
    name: str, prompt: tuple[int, ...], counts: tuple[int, ...], expected: tuple[int, ...]
) -> None:
    assert (
        MemoryBudget(budget_bytes=1, kv_bytes_per_token=1, image_token_id=5).image_tokens(prompt, counts)
        == expected
    )


def test_a_request_whose_images_can_never_fit_is_refused_naming_them() -> None:
    small = MemoryBudget(budget_bytes=10_000, kv_bytes_per_token=10, vision=VISION)
    with pytest.raises(RequestError) as raised:
        small.check_fits(100, 50, 0, (100,))  # 1,500 of KV, 4 x 5,300 of activations
    assert raised.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert raised.value.field == "messages"
    assert "vision-tower activations for 100 image tokens" in str(raised.value)


FAMILY_COSTS = [
    # (family, vision hidden size, dtype bytes, image tokens, MiB at least, MiB at most)
    ("qwen2_vl", 1280, 2, 1995, 150, 8_000),
    ("qwen2_5_vl", 1280, 2, 1260, 100, 8_000),
    ("gemma3", 1152, 2, 256, 1, 500),
]


@pytest.mark.parametrize(("family", "hidden", "dtype", "tokens", "low", "high"), FAMILY_COSTS)
def test_fitted_family_costs_grow_with_the_image(
    family: str, hidden: int, dtype: int, tokens: int, low: int, high: int
) -> None:
    cost = vision_cost(family, hidden, dtype)
    assert low << 20 <= cost.transient([tokens]) <= high << 20
    assert cost.transient([tokens]) > cost.transient([tokens // 2])


def test_a_family_not_measured_takes_the_largest_terms() -> None:
    unknown = vision_cost("not_a_family", 32, 2)
    for family in FITTED:
        assert unknown.transient([1000]) >= vision_cost(family, 32, 2).transient([1000])


def test_the_fitted_table_covers_every_measured_point() -> None:
    """The committed figures are the bench's (bench/results/vision-memory.json): at every
    measured size, the model is at least the measured transient."""
    report = json.loads((Path(__file__).parents[2] / "bench/results/vision-memory.json").read_text())
    checked = 0
    for name, result in report["families"].items():
        if name not in FITTED:
            continue
        cost = vision_cost(name, result["vision_hidden_size"], result["dtype_bytes"])
        for point in result["points"]:
            assert cost.transient([point["image_tokens"]]) >= point["transient_bytes"] * 0.999, (name, point)
            checked += 1
    assert checked >= 40

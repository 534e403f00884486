"""The step policy (loop/scheduler.py) as tables: row snapshots in, decisions out, no MLX."""

from __future__ import annotations

import pytest

from vlmserve.engine.loop.scheduler import (
    Budget,
    PrefillRow,
    admit_count,
    chunks,
    prefill_group,
    preparations,
)


@pytest.mark.parametrize(
    ("costs", "room", "in_use", "budget", "expected"),
    [
        ([], 4, 0, None, 0),
        ([1, 1, 1], 2, 0, None, 2),  # room bounds
        ([1, 1, 1], 0, 0, None, 0),  # no room
        ([5, 5, 5], 4, 0, 10, 2),  # the budget bounds
        ([5, 5, 5], 4, 6, 10, 0),  # in flight counts against it
        ([50, 1], 4, 0, 10, 1),  # nothing in flight: the oldest joins however large
        ([50, 1], 4, 1, 10, 0),  # something in flight: a large head waits (FIFO, no overtaking)
        ([3, 20, 1], 4, 0, 10, 1),  # stops at the first that does not fit
    ],
)
def test_admit_count(costs: list[int], room: int, in_use: int, budget: int | None, expected: int) -> None:
    assert admit_count(costs, room=room, in_use=in_use, budget=budget) == expected


@pytest.mark.parametrize(
    ("image_tokens", "tokens", "expected", "left"),
    [
        ([0, 0, 0], 2, 2, 0),  # a text-only preparation costs one token
        ([300, 0], 256, 1, -44),  # the first always runs, even past the budget
        ([0], 0, 1, -1),  # ... even with nothing left (decode rows took it all)
        ([10, 10, 10], 15, 2, -5),  # runs while something is left
    ],
)
def test_preparations(image_tokens: list[int], tokens: int, expected: int, left: int) -> None:
    budget = Budget(tokens)
    assert preparations(image_tokens, budget) == expected
    assert budget.tokens == left


def row(key: int, remaining: int, chunk: int = 256, *, groupable: bool = False) -> PrefillRow:
    return PrefillRow(key=key, remaining=remaining, next_chunk=min(chunk, remaining), groupable=groupable)


@pytest.mark.parametrize(
    ("rows", "tokens", "ran", "expected", "left"),
    [
        ([row(0, 1000), row(1, 1000)], 256, False, [0], 0),  # whole chunks only
        ([row(0, 1000), row(1, 100)], 300, False, [0], 44),  # the second does not fit: skipped
        ([row(0, 1000), row(1, 40)], 300, False, [0, 1], 4),  # a later, smaller one still may
        ([row(0, 1000)], 10, False, [0], -246),  # the step's first chunk always runs
        ([row(0, 1000)], 10, True, [], 10),  # ... but not when something ran already
        ([], 256, False, [], 256),
    ],
)
def test_chunks(rows: list[PrefillRow], tokens: int, ran: bool, expected: list[int], left: int) -> None:
    budget = Budget(tokens, ran=ran)
    assert chunks(rows, budget) == expected
    assert budget.tokens == left
    assert budget.ran == (ran or bool(expected))


@pytest.mark.parametrize(
    ("rows", "tokens", "expected", "left"),
    [
        ([row(0, 30, groupable=True), row(1, 20, groupable=True)], 256, [1, 0], 206),  # shortest first
        ([row(0, 30, groupable=True)], 256, [], 256),  # one alone is no group
        ([row(0, 30, groupable=True), row(1, 20)], 256, [], 256),  # only groupable rows
        (
            [row(0, 200, groupable=True), row(1, 100, groupable=True), row(2, 50, groupable=True)],
            256,
            [2, 1],
            106,
        ),
        ([row(0, 200, groupable=True), row(1, 100, groupable=True)], 250, [], 250),  # not both
    ],
)
def test_prefill_group(rows: list[PrefillRow], tokens: int, expected: list[int], left: int) -> None:
    budget = Budget(tokens)
    assert prefill_group(rows, budget) == expected
    assert budget.tokens == left

"""`--prefix-ramp` (training/train_squares_click.py): the most of the tools block an untooled row
gets back rises from none to all of it over the ramp's steps, then stays at all."""

from __future__ import annotations

import pytest

from training.train_squares_click import parse_args, ramped_prefix_cap


@pytest.mark.parametrize(
    ("step", "ramp", "limit", "cap"),
    [
        (0, 100, 1000, 0),
        (1, 100, 1000, 10),
        (50, 100, 1000, 500),
        (99, 100, 1000, 990),
        (100, 100, 1000, 1000),
        (5000, 100, 1000, 1000),
        (1, 3, 1001, 334),
        (2, 3, 1001, 667),
        (7, 1, 0, 0),
    ],
)
def test_the_cap_rises_from_none_to_all_of_it(step: int, ramp: int, limit: int, cap: int) -> None:
    assert ramped_prefix_cap(step, ramp, limit) == cap


@pytest.mark.parametrize("ramp", [0, -5])
def test_a_ramp_of_no_steps_is_refused(ramp: int) -> None:
    with pytest.raises(ValueError, match="ramp"):
        ramped_prefix_cap(1, ramp, 1000)


def test_the_ramp_is_off_unless_asked_and_read_from_the_command_line() -> None:
    assert parse_args([]).prefix_ramp == 0
    assert parse_args(["--prefix-ramp", "1200"]).prefix_ramp == 1200

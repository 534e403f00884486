"""Quiet steps (speculation/quiet.py): plain steps decided ahead, kept while the batch's rows
change until their summed hopes rise past the gate's headroom. Pure: keys and numbers."""

from __future__ import annotations

import pytest

from vlmserve.engine.speculation.quiet import QuietSteps


def _begun(steps: int = 4, headroom: float = 1.0) -> QuietSteps:
    quiet = QuietSteps()
    quiet.begin(steps, 8, {"a": 0.2, "b": 0.1}, headroom)
    return quiet


@pytest.mark.parametrize(
    ("keys", "size", "expected"),
    [
        (("a", "b"), 8, []),  # the same rows
        (("a",), 8, []),  # a row left: nothing to value
        (("a", "b", "c"), 8, ["c"]),  # a row joined: its hope is to be valued
        (("b", "d", "c"), 8, ["d", "c"]),
        (("a", "b"), 16, None),  # another bucket: over
    ],
)
def test_a_step_is_quiet_unless_the_bucket_changed_and_names_the_rows_that_joined(
    keys: tuple[str, ...], size: int, expected: list[str] | None
) -> None:
    assert _begun().joined(keys, size) == expected


def test_quiet_steps_run_out() -> None:
    quiet = _begun(steps=2)
    for _ in range(2):
        assert quiet.joined(("a", "b"), 8) == []
        quiet.runs()
    assert quiet.joined(("a", "b"), 8) is None
    assert quiet.end() == (["a", "b"], 2)  # the rows' rests count the two steps


@pytest.mark.parametrize(
    ("hopes", "over"),
    [
        ([("c", 0.9)], False),  # a joining row's hope, within the headroom
        ([("c", 0.9), ("a", 0.4)], True),  # 0.9 + 0.2 > 1.0
        ([("a", 1.1)], False),  # a row's look: its own rise only (0.9)
        ([("a", 1.3)], True),
        ([("a", 0.0), ("c", 1.1)], False),  # a falling hope leaves room for another's rise
    ],
)
def test_the_rows_summed_rise_past_the_headroom_ends_them(hopes: list[tuple[str, float]], over: bool) -> None:
    quiet = _begun()
    for key, hoped in hopes:
        quiet.hope(key, hoped)
    assert (quiet.joined(("a", "b", "c"), 8) is None) == over

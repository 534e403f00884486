"""The step gate (speculation/step_cost.py): measured step costs per batch-size bucket, and
whether a step verifies or runs plain, from the rows' hoped drafts against those costs. Pure:
the costs are fed here as the verifier feeds them from its clock."""

from __future__ import annotations

from collections.abc import Hashable

import pytest

from tests.engine._drafting_row import LookupRow
from vlmserve.engine.speculation.drafter import Speculator
from vlmserve.engine.speculation.policy import RowDrafts, verify_width
from vlmserve.engine.speculation.step_clock import StepClock
from vlmserve.engine.speculation.step_cost import StepCosts, StepGate, bucket, verify_rate


@pytest.mark.parametrize(
    ("rows", "expected"),
    [(0, 1), (1, 1), (2, 2), (3, 3), (4, 4), (5, 8), (8, 8), (9, 16), (16, 16), (17, 32)],
)
def test_batch_sizes_share_a_bucket_from_five_rows(rows: int, expected: int) -> None:
    assert bucket(rows) == expected


def _costs(rows: int, plain: float | None, verify: dict[int, float], times: int = 3) -> StepCosts:
    costs = StepCosts(position_cost=0.065)
    for _ in range(times):
        if plain is not None:
            costs.observe(rows, 0, plain)
        for width, seconds in verify.items():
            costs.observe(rows, width, seconds)
    return costs


def test_a_cost_is_known_after_three_measurements_then_is_the_median_of_the_recent_ones() -> None:
    costs = StepCosts()
    costs.observe(8, 0, 0.1)
    costs.observe(8, 0, 5.0)  # preempted: the median of the first three ignores it
    assert costs.plain(8) is None
    costs.observe(7, 0, 0.2)  # 7 rows: the same bucket as 8
    assert costs.plain(8) == pytest.approx(0.2)
    costs.observe(8, 0, 0.1)
    assert costs.plain(8) == pytest.approx(0.1)  # median of 0.1, 0.1, 0.2, 5.0 (the lower middle)
    assert costs.plain(4) is None and costs.verify(8, 1) is None
    for _ in range(9):  # the last nine only: the machine got slower
        costs.observe(8, 0, 0.3)
    assert costs.plain(8) == pytest.approx(0.3)


def test_an_answer_given_before_a_measurement_is_not_given_after_it() -> None:
    """The gate asks the same prices many times a step (StepCosts keeps its answers): each
    measurement, and forgetting the plain step's cost, is seen by the next answer."""
    costs = StepCosts()
    for _ in range(3):
        costs.observe(16, 0, 0.003)
        costs.observe(16, 3, 0.002)  # measured below a plain step: priced at the plain step's
    assert costs.verify(16, 3) == pytest.approx(0.003)
    for _ in range(5):
        costs.observe(16, 3, 0.009)
    assert costs.verify(16, 3) == pytest.approx(0.009) and costs.plain(16) == pytest.approx(0.003)
    for _ in range(5):
        costs.observe(16, 0, 0.012)
    # The verifies were measured beside plain steps of 3 ms: they move with the plain step.
    assert costs.plain(16) == pytest.approx(0.012) and costs.verify(16, 3) == pytest.approx(0.018)
    costs.forget_plain(16)
    assert costs.plain(16) is None and costs.verify(16, 3) == pytest.approx(0.009)
    assert costs.plain(15) is None and costs.verify(12, 3) == pytest.approx(0.009)


@pytest.mark.parametrize(
    ("odd", "expected"),
    [
        ([100.0], 0.1),  # the gap also ran a prompt
        ([0.001], 0.1),  # every row ended: nothing computed
        ([100.0, 0.001, 50.0], 0.1),  # three odd ones in nine
        ([100.0] * 5, 100.0),  # most of the recent ones: that is what it costs now
    ],
)
def test_odd_steps_do_not_move_a_cost_until_they_are_most_of_the_recent_ones(
    odd: list[float], expected: float
) -> None:
    costs = _costs(1, 0.1, {}, times=9)
    for seconds in odd:
        costs.observe(1, 0, seconds)
    assert costs.plain(1) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("rows", "plain", "measured", "width", "expected"),
    [
        # Only a five-wide verify measured at 16 rows: width 2 on the line from the plain step
        # (5 ms) to it, a quarter of the way, not the prior's 0.4 of it (6.8 ms).
        (16, 0.005, {5: 0.017}, 2, 0.008),
        (16, 0.005, {5: 0.017}, 6, 0.020),  # wider: along the same line
        (16, 0.005, {3: 0.007, 5: 0.017}, 2, 0.006),
        (16, 0.005, {1: 0.006, 5: 0.017}, 3, 0.0115),  # width 1 measured: between the two
        # Never below a plain step: a nine-wide verify of 9 rows measured under the plain
        # steps of 16 in the same bucket.
        (16, 0.0135, {9: 0.0094}, 9, 0.0135),
        (16, 0.0135, {2: 0.014, 9: 0.0094}, 5, 0.0135),
    ],
)
def test_a_verify_is_priced_from_the_plain_step_and_never_below_it(
    rows: int, plain: float, measured: dict[int, float], width: int, expected: float
) -> None:
    assert _costs(rows, plain, measured).verify(rows, width) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("rows", "measured", "width", "expected"),
    [
        (1, {1: 0.1}, 1, 0.1),
        (1, {1: 0.1}, 3, 0.1 * (1 + 0.065 * 2)),  # extrapolated with the prior position cost
        (8, {1: 0.2, 5: 0.5}, 5, 0.5),
        (8, {1: 0.2, 5: 0.5}, 6, 0.5 + 0.3 / 4),  # wider than measured: along the two widest
        (8, {1: 0.2, 5: 0.2}, 9, 0.2),  # ... never cheaper than the widest measured
        (8, {5: 0.5}, 6, 0.5 * (1 + 0.52 * 5) / (1 + 0.52 * 4)),  # one measured: the prior from it
        (8, {1: 0.2, 5: 0.5}, 2, 0.2 + 0.3 / 4),  # between measured widths: interpolated
        (8, {2: 0.2}, 1, 0.2 / (1 + 0.52)),
        (8, {}, 2, None),
    ],
)
def test_a_verify_width_not_measured_is_interpolated_or_extrapolated(
    rows: int, measured: dict[int, float], width: int, expected: float | None
) -> None:
    got = _costs(rows, None, measured).verify(rows, width)
    assert got == (pytest.approx(expected) if expected is not None else None)


def _measured(samples: list[tuple[int, int, float, int]]) -> StepCosts:
    """(rows, width, seconds, times) measurements, in order."""
    costs = StepCosts(position_cost=0.065)
    for rows, width, seconds, times in samples:
        for _ in range(times):
            costs.observe(rows, width, seconds)
    return costs


# The copying fixture at 16 streams (issue 37.1, the step clock's measurements recorded): plain
# steps of 16 rows, three-wide verifies of 16 rows and of 9 (a wave's tail) in the same bucket.
_WAVE = [(16, 0, 0.00310, 9), (16, 3, 0.00814, 5), (9, 3, 0.00592, 4)]


@pytest.mark.parametrize(
    ("samples", "rows", "width", "expected"),
    [
        # Priced at the step's rows along the per-row slope between the measurements (0.317 ms
        # a row), not at the bucket's one median (5.92 ms at 16 rows: the 9-row verifies).
        (_WAVE, 16, 3, 0.00814),
        (_WAVE, 9, 3, 0.00592),
        (_WAVE, 12, 3, 0.00592 + 3 * (0.00814 - 0.00592) / 7),
        # Plain steps measured at 16 rows only: their median at any rows of the bucket.
        (_WAVE, 9, 0, 0.00310),
        # A verify measured at one batch size takes its width times the bucket's other verifies'
        # slope a row and position (five-wide: 4.7 ms over 7 rows), not the plain step's (~0).
        (
            [(16, 0, 0.0034, 3), (9, 0, 0.0034, 3), (16, 5, 0.013, 2), (9, 5, 0.0083, 2), (16, 3, 0.0101, 3)],
            9,
            3,
            0.0101 - 7 * 3 * (0.013 - 0.0083) / 7 / 5,
        ),
        # No verify with a slope: the plain step's (0.2 ms a row).
        ([(16, 0, 0.005, 3), (12, 0, 0.0042, 3), (12, 3, 0.006, 3)], 16, 3, 0.0068),
        ([(16, 0, 0.005, 3), (12, 0, 0.0042, 3), (12, 3, 0.006, 3)], 12, 0, 0.0042),
        # A step with more rows never costs less: a falling slope (noise) is none.
        ([(16, 0, 0.003, 3), (9, 0, 0.004, 3)], 16, 0, 0.003),
        ([(16, 0, 0.003, 3), (9, 0, 0.004, 3)], 9, 0, 0.003),
        # One preempted step at other rows moves neither the slope nor the cost.
        ([(16, 0, 0.003, 8), (9, 0, 0.100, 1)], 16, 0, 0.003),
        ([(16, 0, 0.003, 8), (9, 0, 0.100, 1)], 9, 0, 0.003),
        ([(16, 0, 0.003, 4), (9, 0, 0.0001, 1), (16, 0, 0.003, 4)], 9, 0, 0.003),
        # At most all of a step's cost is per row: a slope of 9 ms a row between 9 and 10 rows
        # (steps that also ran other work) is cut to 3 ms / 9 rows.
        ([(9, 0, 0.003, 2), (10, 0, 0.012, 2)], 16, 0, 0.003 + 7 * 0.003 / 9),
        # ... nor two at one size of two measured there (the lower middle).
        ([(16, 0, 0.003, 5), (9, 0, 0.0018, 1), (9, 0, 0.100, 1)], 16, 0, 0.003),
        ([(16, 0, 0.003, 5), (9, 0, 0.0018, 1), (9, 0, 0.100, 1)], 9, 0, 0.0018),
    ],
)
def test_a_cost_is_priced_at_the_steps_rows_within_its_bucket(
    samples: list[tuple[int, int, float, int]], rows: int, width: int, expected: float
) -> None:
    costs = _measured(samples)
    got = costs.plain(rows) if width == 0 else costs.verify(rows, width)
    assert got == pytest.approx(expected)


@pytest.mark.parametrize(("rows", "verifies"), [(16, False), (9, True)])
def test_a_verify_measured_on_a_waves_tail_does_not_price_the_full_batchs(rows: int, verifies: bool) -> None:
    # Lookup's drafts accepted at 75 %, two a row: ~2.3 tokens a row a three-wide verify. At 16
    # rows 16 x 2.3 / 8.14 ms = 4.5 tokens a ms against 16 / 3.10 = 5.2 plain: plain (priced at
    # the bucket's one median, 5.92 ms, it verified: 6.2); at 9 rows 9 x 2.3 / 5.92 = 3.5
    # against 2.9: it verifies.
    gate = StepGate(_measured(_WAVE))
    assert gate.verifies([RowDrafts(2, 0.75)] * rows, 3) is verifies


class _Recorded(StepCosts):
    def __init__(self, plain: float | None = None) -> None:
        super().__init__()
        self.samples: list[tuple[int, int, float]] = []
        self._plain = plain

    def observe(self, rows: int, width: int, seconds: float) -> None:
        self.samples.append((rows, width, seconds))

    def plain(self, rows: int) -> float | None:
        return self._plain


def _clocked(events: list[tuple[object, ...]], plain: float | None = None) -> list[tuple[int, int, float]]:
    costs = _Recorded(plain)
    clock = StepClock(costs)
    for event in events:
        match event:
            case ("start", float() | int() as now, int() as rows, bool() as verifies):
                clock.start(now, rows, verifies=verifies)
            case ("launch", float() | int() as now, int() as width):
                clock.launch(now)  # the tokens in flight are read: it drafts, then its width
                clock.width(width)
            case ("stop",):
                clock.stop()
            case ("disturbed",):
                clock.disturbed()
    return [(rows, width, round(seconds, 9)) for rows, width, seconds in costs.samples]


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        # Plain steps: each from its start to the next one's.
        ([("start", 0, 1, False), ("start", 1, 1, False), ("start", 3, 1, False)], [(1, 0, 1), (1, 0, 2)]),
        # A verify after a plain step waits for its forward (reading the tokens in flight) until
        # its launch at 4: the verify runs from 4 to 6. Plain steps next to a verify are not
        # plain steps' costs (what they cost beyond one is the verify's: the next test).
        (
            [
                ("start", 0, 1, False),
                ("start", 1, 1, True),
                ("launch", 4, 5),
                ("start", 6, 1, False),
                ("start", 7, 1, False),
                ("start", 8, 1, False),
            ],
            [(1, 5, 2), (1, 0, 1)],
        ),
        # Verifies after verifies (their tokens are read already): start to start.
        (
            [
                ("start", 0, 2, True),
                ("launch", 0.5, 3),
                ("start", 2, 2, True),
                ("launch", 2.1, 3),
                ("start", 4, 2, False),
                ("start", 5, 2, False),
            ],
            [(2, 3, 2), (2, 3, 2)],
        ),
        # The batch changed size (a row joined: the gap holds its prompt) or emptied: not counted.
        (
            [("start", 0, 2, False), ("start", 1, 3, False), ("start", 2, 3, False), ("start", 3, 3, False)],
            [(3, 0, 1), (3, 0, 1)],
        ),
        (
            [
                ("start", 0, 2, False),
                ("start", 1, 3, True),
                ("launch", 2, 4),
                ("start", 5, 3, False),
                ("start", 6, 3, False),
            ],
            [(3, 4, 3)],
        ),
        ([("start", 0, 1, False), ("stop",), ("start", 5, 1, False)], []),
        # A step after which the runner ran a prompt chunk, or that computed nothing: not
        # counted, the next one is.
        (
            [("start", 0, 1, False), ("disturbed",), ("start", 3, 1, False), ("start", 4, 1, False)],
            [(1, 0, 1)],
        ),
        ([("start", 0, 1, False), ("disturbed",), ("start", 3, 1, True), ("launch", 4, 5)], []),
        ([("start", 0, 1, True), ("launch", 0, 5), ("disturbed",), ("start", 3, 1, True)], []),
        ([("start", 0, 1, False), ("start", 1, 1, True), ("stop",), ("launch", 2, 3)], []),
    ],
)
def test_the_step_clock_times_a_verify_from_its_launch_and_a_plain_step_between_plain_steps(
    events: list[tuple[object, ...]], expected: list[tuple[int, int, float]]
) -> None:
    assert _clocked(events) == expected


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        # Plain steps cost 1 s. The one before the verify ends at its launch 2.5 s in (1.5 s
        # more) and the one after it lasts 2 s (1 s more): both extras are the verify's
        # (2.5 + 1.5 + 1 s), neither plain step is measured.
        (
            [
                ("start", 0, 1, False),
                ("start", 1, 1, False),
                ("start", 2, 1, True),
                ("launch", 3.5, 5),
                ("start", 6, 1, False),
                ("start", 8, 1, False),
                ("start", 9, 1, False),
            ],
            [(1, 0, 1), (1, 5, 5.0), (1, 0, 1)],
        ),
        # A plain step between two verifies: its extra is the first's only.
        (
            [
                ("start", 0, 1, True),
                ("launch", 0, 2),
                ("start", 2, 1, False),
                ("start", 3.5, 1, True),
                ("launch", 4, 2),
                ("start", 6, 1, True),
            ],
            [(1, 2, 3.0), (1, 2, 2)],
        ),
        # A plain step cheaper than plain steps (noise): the difference counts both ways, or
        # noise alone would make verifies dearer; the batch changed size after the verify: the
        # verify alone.
        (
            [("start", 0, 1, True), ("launch", 0, 2), ("start", 2, 1, False), ("start", 2.5, 1, False)],
            [(1, 2, 1.5)],
        ),
        (
            [("start", 0, 1, True), ("launch", 0, 2), ("start", 2, 1, False), ("start", 4, 2, False)],
            [(1, 2, 2)],
        ),
    ],
)
def test_what_a_plain_step_next_to_a_verify_costs_beyond_a_plain_step_is_the_verifys(
    events: list[tuple[object, ...]], expected: list[tuple[int, int, float]]
) -> None:
    assert _clocked(events, plain=1.0) == expected


# One copying row (8 drafts at 0.9), one guessing row (2 at 0.3), nothing to copy (lookup found
# nothing lately: chance 0.1).
COPYING, GUESSING, NOTHING, RESTING = (
    RowDrafts(8, 0.9),
    RowDrafts(2, 0.3),
    RowDrafts(4, 0.6, 0.1),
    RowDrafts(0, 0),
)


@pytest.mark.parametrize(
    ("offers", "plain", "verify", "expected"),
    [
        # Nothing measured: verify first (what it costs is measured), then plain.
        ([COPYING], None, {}, True),
        ([COPYING], None, {1: 0.1, 9: 0.15}, False),
        # One copying row on a CPU: a 9-wide step at ~1.5x a plain one gives ~7 tokens.
        ([COPYING], 0.1, {1: 0.11, 9: 0.15}, True),
        # Nothing to copy: a verify step dearer than a plain one never pays.
        ([NOTHING], 0.1, {1: 0.12, 5: 0.2}, False),
        ([RESTING] * 8, 0.2, {1: 0.21}, False),
        # The same drafts at 8 rows: one guessing row does not pay for the batch's wider step.
        ([GUESSING] + [RESTING] * 7, 0.2, {1: 0.22, 3: 0.4}, False),
        # A drafter whose forwards cost as much as the target's (verify 2x plain): only rows
        # that are mostly right pay for it.
        ([RowDrafts(4, 0.5)] * 8, 0.2, {1: 0.4, 5: 0.6}, False),
        ([RowDrafts(4, 0.95)] * 8, 0.2, {1: 0.4, 5: 0.6}, True),
        # A verify one position wide gives what a plain step gives at no less cost: where its
        # measured cost came out below the plain step's (noise), it still does not win.
        ([NOTHING], 0.1, {1: 0.08, 2: 0.12}, False),
        ([RESTING] * 8, 0.2, {1: 0.15}, False),
        # No verify measured at this batch size: measured first, whatever the rows offer now
        # (a drafter model's rows offer nothing until a verify gives them a state).
        ([RESTING] * 16, 0.2, {}, True),
        ([RowDrafts(1, 0.5)], 0.1, {1: 0.05, 2: 0.2}, False),
        # Within the margin (5 %): plain.
        ([RowDrafts(1, 0.5)], 0.1, {1: 0.1, 2: 0.143}, False),
        ([RowDrafts(1, 0.5)], 0.1, {1: 0.1, 2: 0.135}, True),
    ],
)
def test_a_step_verifies_only_where_the_expected_tokens_pay_for_it(
    offers: list[RowDrafts], plain: float | None, verify: dict[int, float], expected: bool
) -> None:
    gate = StepGate(_costs(len(offers), plain, verify))
    assert gate.verifies(offers, 9) is expected


def test_wide_verifies_are_measured_before_the_prior_decides() -> None:
    # 16 copying rows, plain and one-position verifies measured: the prior position cost
    # (0.065 x 16 per extra position) says no width pays, so without exploring no wide verify
    # would ever run and none would be measured (issue 37.1: lookup never drafted at 16 streams).
    costs = _costs(16, 0.5, {1: 0.55})
    gate = StepGate(costs)
    assert not costs.explored(16)
    assert gate.verifies([COPYING] * 16, 9)
    for width in (5, 6, 7, 6):  # exploration's widths vary with the rows' draft lengths
        costs.observe(16, width, 0.6)
    assert not costs.explored(16)  # no wide width measured three times yet: still exploring
    assert gate.verifies([COPYING] * 16, 9)
    costs.observe(16, 6, 0.6)
    assert costs.explored(16) and costs.verify(16, 6) == pytest.approx(0.6)
    assert gate.verifies([COPYING] * 16, 9)  # measured: 7 tokens a row for 1.2x a plain step
    # Rows that hope for drafts lookup never finds explore a few steps, then the prior decides.
    quiet = StepGate(_costs(16, 0.5, {1: 0.55}))
    assert [quiet.verifies([NOTHING] * 16, 9) for _ in range(10)] == [True] * 8 + [False] * 2


def test_a_probe_is_a_trial_whose_drafts_the_rates_do_not_cut() -> None:
    # Rows whose rate was learnt on text with nothing to copy: plain wins, and a probe every 16
    # steps is a trial (drafter.py then verifies its drafts at the exploration width instead of
    # cutting them by that rate: else the rate never moves again).
    gate = StepGate(_costs(1, 0.1, {1: 0.105, 5: 0.108}))  # probes cheap enough for every 16 steps
    trials = []
    for _ in range(16):
        verified = gate.verifies([RowDrafts(4, 0.05)], 9)
        trials.append((verified, gate.trial))
    assert trials == [(False, False)] * 15 + [(True, True)]
    assert gate.verifies([COPYING], 9) and not gate.trial  # a win: the measured widths decide
    speculator = Speculator(max_draft=8, gate=StepGate(_costs(1, 0.1, {1: 0.12, 5: 0.2})))
    row = LookupRow(0)
    row.generated.extend([5, 6, 7, 5, 6, 7, 5, 6])  # lookup has drafts for it
    speculator._state(row).length.rate = 0.05
    assert speculator.drafts([row], [[]]) == [[]]  # not a trial: cut by the low rate
    assert speculator.gate is not None
    speculator.gate.trial = True
    assert len(speculator.drafts([row], [[]])[0]) == 4  # a trial: the exploration width (5)


@pytest.mark.parametrize(("accepted", "verifies_next"), [(4, True), (1, True), (0, False)])
def test_a_trial_that_paid_verifies_again(accepted: int, verifies_next: bool) -> None:
    gate = StepGate(_costs(1, 0.1, {1: 0.12, 5: 0.2}))
    speculator = Speculator(max_draft=8, gate=gate)
    row = LookupRow(0)
    row.generated.extend([5, 6, 7, 5, 6, 7, 5, 6])
    speculator._state(row).length.rate = 0.05  # learnt where nothing was accepted: plain wins
    gate.trial = True  # the step being settled was a probe
    speculator.record(row, 4, accepted)
    assert speculator.speculates([row]) is verifies_next
    assert gate.trial is verifies_next


def test_paying_trials_buy_two_more_at_most() -> None:
    gate = StepGate(_costs(1, 0.1, {1: 0.2, 5: 0.4}))  # plain wins for any drafts
    steps = []
    for _ in range(3):
        gate.reward(1)  # every trial paid
        steps.append(gate.verifies([COPYING], 9))
    assert steps == [True, True, False]  # then the measured costs decide


def test_certain_drafts_always_verify() -> None:
    gate = StepGate(_costs(1, 0.1, {1: 0.5}))
    assert gate.verifies([RESTING], 9, certain=True)


@pytest.mark.parametrize(("probe_steps", "expected"), [(1, [16, 48, 112]), (2, [16, 17, 49, 50, 114, 115])])
def test_while_plain_wins_a_probe_verifies_ever_less_often(probe_steps: int, expected: list[int]) -> None:
    gate = StepGate(_costs(1, 0.1, {1: 0.105, 5: 0.108}), probe_steps=probe_steps)
    verified = [step for step in range(1, 121) if gate.verifies([NOTHING], 9)]
    assert verified == expected


@pytest.mark.parametrize(
    ("verify", "probe_steps", "expected"),
    [
        # A probe step costs 0.008 s more than a plain one (0.1 s): the doubling gap governs.
        (0.108, 1, [16, 48, 112, 240]),
        # 0.1 s more: every 100 steps at most (1 % of their time), until the doubling gap is wider
        (0.2, 1, [100, 200, 300, 428]),
        # ... two verify steps a probe (a drafter model's): every 200.
        (0.2, 2, [200, 201, 401, 402]),
        # A verify at 8 plain steps (this CPU's five-wide MTP verify of one row): every 700.
        (0.8, 1, [700, 1400, 2100, 2800]),
    ],
)
def test_probes_cost_at_most_one_percent_of_the_plain_steps_between_them(
    verify: float, probe_steps: int, expected: list[int]
) -> None:
    gate = StepGate(_costs(1, 0.1, {1: 0.105, 5: verify}), probe_steps=probe_steps)
    verified = [step for step in range(1, 3000) if gate.verifies([NOTHING], 9)]
    assert verified[:4] == expected


def test_a_win_resets_the_probe_gap() -> None:
    gate = StepGate(_costs(1, 0.1, {1: 0.108, 9: 0.108}))
    steps = [gate.verifies([NOTHING], 9) for _ in range(48)]
    assert steps.count(True) == 2  # at 16 and 48
    assert gate.verifies([COPYING], 9)  # copying now: verifies, the gap is 16 again
    assert [step for step in range(1, 17) if gate.verifies([NOTHING], 9)] == [16]


def test_measured_costs_choose_the_width() -> None:
    rows = [RowDrafts(8, 0.9)]
    # The prior (0.065 per position) takes all 8; measured, width 3 costs 3x width 1: plain.
    assert verify_width(rows, position_cost=0.065, max_width=9) == 9
    costs = _costs(1, None, {1: 0.1, 3: 0.3, 9: 0.9}).relative(1, 9)
    assert costs is not None
    assert verify_width(rows, position_cost=0.065, max_width=9, costs=costs) == 1


class _Drafter:
    """A drafter model's bookkeeping only (which rows it holds)."""

    capture_layer_ids = ()

    def __init__(self) -> None:
        self.held: set[Hashable] = set()

    def ready(self, row: LookupRow) -> bool:
        return row.key in self.held

    def forget(self, row: LookupRow) -> None:
        self.held.discard(row.key)


def test_a_plain_step_drops_the_drafter_models_rows_and_counts_a_forward() -> None:
    drafter = _Drafter()
    speculator = Speculator(max_draft=4, model_drafter=drafter)  # type: ignore[arg-type]
    assert speculator.gate is not None and speculator.gate.probe_steps == 2
    rows = [LookupRow(0), LookupRow(100)]
    drafter.held = {row.key for row in rows}
    assert speculator.speculates(rows)  # nothing measured yet: verify
    for _ in range(3):
        speculator.gate.costs.observe(2, 0, 0.1)
        speculator.gate.costs.observe(2, 1, 0.3)
        speculator.gate.costs.observe(2, 5, 0.5)
    assert not speculator.speculates(rows)
    assert drafter.held == set() and speculator.counts.forwards == 1


def _plain_wins_at_one_row() -> tuple[_Drafter, Speculator]:
    """A Speculator with a drafter model, measured: at one row a verify costs 3x a plain step."""
    drafter = _Drafter()
    speculator = Speculator(max_draft=4, model_drafter=drafter)  # type: ignore[arg-type]
    assert speculator.gate is not None
    for _ in range(3):
        speculator.gate.costs.observe(1, 0, 0.1)
        speculator.gate.costs.observe(1, 1, 0.3)
        speculator.gate.costs.observe(1, 5, 0.5)
    return drafter, speculator


def test_a_rows_first_decode_step_verifies_so_its_drafter_starts_over_the_prompt() -> None:
    drafter, speculator = _plain_wins_at_one_row()
    row = LookupRow(0)  # one token taken: its first decode step is next
    assert speculator.speculates([row])
    row.generated.append(1)
    assert not speculator.speculates([row])  # not its first: plain wins
    row.generated[:] = [0]
    drafter.held = {row.key}  # its drafter has started: plain wins
    assert not speculator.speculates([row])


def test_a_new_rows_drafter_is_not_started_while_plain_steps_win() -> None:
    _, speculator = _plain_wins_at_one_row()
    older = LookupRow(0)
    older.generated.append(1)
    assert not speculator.speculates([older])  # plain wins at one row
    assert not speculator.speculates([LookupRow(100)])  # a new row's first step: plain all the same


def test_a_prompts_hidden_states_are_kept_only_while_its_drafter_would_start_over_them() -> None:
    _, speculator = _plain_wins_at_one_row()
    assert speculator.keeps_prompt_hidden()  # nothing decided yet: its first step verifies
    older = LookupRow(0)
    older.generated.append(1)
    assert not speculator.speculates([older])  # plain wins at one row
    assert speculator.keeps_prompt_hidden()  # it would join as a second row: nothing decided there
    speculator.forget(older)
    # Alone, where plain wins: its first step is plain, its drafter starts later from
    # the tokens since, so the prompt's hidden states would be kept for nothing.
    assert not speculator.keeps_prompt_hidden()
    assert not Speculator(max_draft=4).keeps_prompt_hidden()  # no drafter model, nothing to keep


def test_a_new_row_starts_from_the_recent_rows_acceptance_rate() -> None:
    speculator = Speculator(max_draft=4)
    first = LookupRow(0)
    speculator.speculates([first])
    assert speculator._rows[first].length.rate == pytest.approx(0.6)  # the prior: nothing verified yet
    speculator.record(first, 4, 4)
    speculator.record(first, 4, 4)
    second = LookupRow(100)
    speculator.speculates([second])
    assert speculator._rows[second].length.rate == pytest.approx(1.0)
    speculator.record(first, 4, 0)
    third = LookupRow(200)
    speculator.speculates([third])
    assert speculator._rows[third].length.rate == pytest.approx(0.9)


@pytest.mark.parametrize(
    ("lookup", "ready", "lookup_hit", "verifies"),
    [
        (False, True, 1.0, True),  # its drafter follows: the drafts pay
        # A plain step dropped its drafter's state: this step it could only follow (one
        # position wide, a cost), so no verify is won for it ...
        (False, False, 1.0, False),
        # ... unless lookup drafts for it (auto), as often as lookup has had drafts for it.
        (True, False, 1.0, True),
        (True, False, 0.05, False),
        (True, True, 0.05, True),
    ],
)
def test_a_row_whose_drafter_has_no_state_hopes_only_for_lookups_drafts(
    lookup: bool, ready: bool, lookup_hit: float, verifies: bool
) -> None:
    drafter = _Drafter()
    speculator = Speculator(max_draft=4, lookup=lookup, model_drafter=drafter)  # type: ignore[arg-type]
    assert speculator.gate is not None
    for _ in range(3):  # a verify of 3 costs 1.1 plain steps: drafts at the prior rate 0.6 pay
        speculator.gate.costs.observe(1, 0, 0.1)
        speculator.gate.costs.observe(1, 1, 0.1)
        speculator.gate.costs.observe(1, 5, 0.12)
    row = LookupRow(0)
    row.generated.append(1)  # not its first decode step
    drafter.held = {row.key} if ready else set()
    speculator._state(row).length.lookup_hit = lookup_hit
    assert speculator.speculates([row]) is verifies


def test_width_one_costs_at_least_a_plain_step_when_widths_are_weighed() -> None:
    # Width 1 measured (noisily) at half a plain step: the step gate finds drafts paying
    # against the plain step, and the width is weighed against the plain step too: 3 (1.96
    # tokens for 1.2 plain steps' cost; width 2 costs at least a plain step, 1.6 tokens), not
    # cut to one position (against width 1's measured cost no width pays: a verify that
    # drafts nothing).
    rows = [RowDrafts(2, 0.6)]
    costs = _costs(1, 0.1, {1: 0.05, 3: 0.12})
    assert StepGate(costs).verifies(rows, 9)
    relative = costs.relative(1, 9)
    assert relative is not None and relative[2] == pytest.approx(1.2)
    assert verify_width(rows, position_cost=0.065, max_width=9, costs=relative) == 3


def test_while_verifies_win_the_plain_steps_cost_is_measured_again() -> None:
    # The plain step measured when the machine was busy (20 ms), the verifies since (8 ms):
    # verifies win on paper. After 64 won in a row, plain steps until its cost is known again
    # (three), then the measured costs decide: plain (5 ms) wins now.
    costs = _costs(16, 0.020, {2: 0.008, 5: 0.017})
    gate = StepGate(costs)
    offers = [RowDrafts(1, 0.2)] * 16
    assert [gate.verifies(offers, 9) for _ in range(64)] == [True] * 63 + [False]
    assert costs.plain(16) is None
    for _ in range(3):
        assert not gate.verifies(offers, 9)
        costs.observe(16, 0, 0.005)
    assert not gate.verifies(offers, 9)


def test_a_drafter_models_rows_draft_again_at_a_probe_after_the_plain_cost_is_measured() -> None:
    costs = _costs(1, 0.1, {2: 0.05, 5: 0.06})
    gate = StepGate(costs, probe_steps=2)
    assert all(gate.verifies([COPYING], 9) for _ in range(63))
    assert not gate.verifies([COPYING], 9)  # the 64th: the plain cost is measured again
    for _ in range(3):
        costs.observe(1, 0, 0.1)
    assert gate.verifies([RESTING], 9) and gate.trial  # a two-step probe: its rows draft again
    assert gate.verifies([RESTING], 9) and gate.trial


@pytest.mark.parametrize(
    ("plain_after", "expected"),
    [
        (0.0019, 0.0026),  # the same plain steps: as measured
        (0.0036, 0.0043),  # plain steps 1.7 ms dearer (rows sampling at temperature 1): the verify too
        (0.0010, 0.0026),  # cheaper: never below what it was measured at (the plain cost may be stale)
    ],
)
def test_a_verify_is_priced_with_the_plain_steps_move_since_it_was_measured(
    plain_after: float, expected: float
) -> None:
    costs = _costs(4, 0.0019, {2: 0.0026})
    for _ in range(9):
        costs.observe(4, 0, plain_after)
    assert costs.plain(4) == pytest.approx(plain_after)
    assert costs.verify(4, 2) == pytest.approx(expected)


def test_rows_with_little_hope_run_plain_once_the_plain_step_got_dearer_than_the_verifies_were() -> None:
    """Greedy rows measured the verifies (plain 1.9 ms a step of 4 rows); rows sampling at
    temperature 1 followed (plain 3.9 ms) with a hope of 8 % of four drafts each: priced as
    measured, every verify came out below a plain step, was priced as one, and won."""
    costs = _costs(4, 0.00193, {2: 0.0026, 5: 0.00335})
    for _ in range(9):
        costs.observe(4, 0, 0.0039)
    offers = [RowDrafts(4, 1.0, 0.08)] * 4
    assert costs.verify(4, 5) == pytest.approx(0.00335 + 0.0039 - 0.00193)
    assert not StepGate(costs).verifies(offers, 9)


@pytest.mark.parametrize(
    ("offers", "plain_run", "expected"),
    [
        # Plain wins for these offers even once their rests are over: quiet until the probe
        # due after 16 plain steps (the one deciding was the first), at most QUIET_STEPS.
        ([NOTHING], 1, 14),
        ([NOTHING], 10, 5),
        ([NOTHING], 15, 0),
        ([COPYING], 1, 0),  # a copying row would win: weighed every step
    ],
)
def test_plain_steps_pass_quietly_until_a_probe_is_due_or_the_offers_would_win(
    offers: list[RowDrafts], plain_run: int, expected: int
) -> None:
    gate = StepGate(_costs(1, 0.1, {1: 0.105, 5: 0.108}))
    gate._plain_run[1] = plain_run
    assert gate.quiet(offers, 9) == expected


def _quiet_speculator(rows: int) -> tuple[Speculator, list[int]]:
    """A speculator whose gate finds plain steps winning for `rows` rows with nothing to copy
    (a verify costs about a plain step: the probes stay due every 16), and its asks' sizes."""
    speculator = Speculator(max_draft=8)
    assert speculator.gate is not None
    gate = speculator.gate
    for width in (0, 2, 5):
        for _ in range(3):
            gate.costs.observe(rows, width, {0: 0.1, 2: 0.105, 5: 0.108}[width])
    asked: list[int] = []
    decide = gate.verifies

    def counted(*args: object, **kwargs: bool) -> bool:
        asked.append(len(args[0]))  # type: ignore[arg-type]
        return decide(*args, **kwargs)  # type: ignore[arg-type]

    gate.verifies = counted  # type: ignore[method-assign]
    return speculator, asked


def _hopeless(speculator: Speculator, row: LookupRow, rate: float = 0.01) -> LookupRow:
    """The row, its rate learnt low and its shadow observed (it is not watched)."""
    state = speculator._state(row)
    state.length.rate, state.shadow.looks = rate, 2
    return row


def test_quiet_steps_skip_the_gate_while_the_rows_stay_and_keep_the_probes_on_time() -> None:
    # Lookup finds nothing for these rows: plain wins. The gate is asked again only when the
    # quiet steps are over or the batch changes bucket, and its probe comes on the same step as
    # when asked every step (16).
    speculator, asked = _quiet_speculator(2)
    rows = [_hopeless(speculator, LookupRow(0)), _hopeless(speculator, LookupRow(1000))]
    verified = [step for step in range(1, 17) if speculator.speculates(rows)]
    assert verified == [16] and len(asked) == 2  # the first step, then the probe
    assert speculator.counts.forwards == 15
    rows.append(LookupRow(2000))  # a third row: another bucket, weighed again at once
    speculator.speculates(rows)
    assert len(asked) == 3


def test_the_headroom_is_how_far_the_rows_hopes_may_rise_before_a_verify_wins() -> None:
    # One row, nothing to draft: plain 0.1 s (10.5 tokens a second with the 5 % margin); a
    # two-wide verify 0.15 s needs 1.575 tokens, 0.575 more than the row's one (wider ones need
    # more): a hope rising by less leaves every width losing, by more the two-wide one wins.
    costs = _costs(1, 0.1, {2: 0.15, 5: 0.2})
    gate = StepGate(costs)
    headroom = gate.headroom([RESTING], 9)
    assert headroom == pytest.approx(0.575)
    needed = (1 + gate.margin) / 0.1
    below, above = (
        verify_rate([RowDrafts(1, 0.95 * headroom)], costs, 9),
        verify_rate([RowDrafts(1, 1.05 * headroom)], costs, 9),
    )
    assert below is not None and above is not None and below < needed < above
    assert gate.headroom([COPYING], 9) == 0.0  # a verify wins already
    assert StepGate(_costs(1, None, {2: 0.15})).headroom([RESTING], 9) == 0.0  # no plain cost


@pytest.mark.parametrize(
    ("joining_rate", "constrained", "asked_again"),
    [
        (0.01, False, False),  # hopes nothing: the quiet steps go on
        (1.0, False, True),  # would copy all it drafts: past the headroom, weighed at once
        (0.01, True, True),  # a grammar's forced drafts verify whatever the costs
    ],
)
def test_quiet_steps_go_on_while_rows_leave_and_join_unless_a_joining_row_could_win(
    joining_rate: float, constrained: bool, asked_again: bool
) -> None:
    # Six rows (bucket 5-8): the gate is asked at the first step; a row leaves, another joins
    # in the same bucket. At 16 streams a row leaves or joins every few steps: quiet steps that
    # ended at every change were asked almost every other step (issue 37.1).
    speculator, asked = _quiet_speculator(6)
    rows = [_hopeless(speculator, LookupRow(1000 * i)) for i in range(6)]
    assert not speculator.speculates(rows) and asked == [6]
    rows.pop(2)
    speculator.forget(LookupRow(2000))  # not a row of the batch: nothing happens
    assert not speculator.speculates(rows)  # a row left: still quiet
    assert asked == [6]
    joining = _hopeless(speculator, LookupRow(9000, constrained=constrained), joining_rate)
    rows.append(joining)
    speculator.speculates(rows)
    assert asked == ([6, 6] if asked_again else [6])
    rows.append(_hopeless(speculator, LookupRow(10_000)))
    rows.append(_hopeless(speculator, LookupRow(11_000)))
    rows.append(_hopeless(speculator, LookupRow(12_000)))  # nine rows: another bucket
    speculator.speculates(rows)
    assert asked[-1] == 9


def test_quiet_steps_count_down_the_rows_rests() -> None:
    speculator = Speculator(max_draft=8)
    assert speculator.gate is not None
    for width in (0, 2, 5):
        for _ in range(3):
            speculator.gate.costs.observe(1, width, {0: 0.1, 2: 0.3, 5: 0.5}[width])
    row = LookupRow(0)
    length = speculator._state(row).length
    length.rate = 0.1
    length._cooldown = 8
    for _ in range(6):
        assert not speculator.speculates([row])
    other = LookupRow(1000)
    speculator.speculates([row, other])  # the rows changed: the quiet steps' rests count
    assert length._cooldown == 2

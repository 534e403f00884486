"""Whether a decode step speculates, from what steps measurably cost here. Pure (the verifier
feeds it the clock).

A verify step is not free even when nothing is drafted: it reads the tokens in flight before it
starts (the plain step's double buffering is lost), runs a wider forward, and with a drafter
model asks the target for hidden states and runs the drafter's forwards. How much that costs
depends on the backend, the model, the batch size and the drafter, so it is measured, not
assumed: `StepCosts` keeps the recent wall times from one step's start to the next's
(everything the step costs: forward, drafting, sampling, handing out tokens), per batch-size
bucket, for plain steps and for verify steps of each width, and prices a step at its own rows
within the bucket (`_Cost`: the median moved along a per-row slope); a verify never costs less
than a plain step, is charged what the plain steps next to it cost beyond one (the double
buffering it breaks: step_clock.py `StepClock`, which times the steps), and moves up with the
plain step's cost since it was measured (`StepCosts._drift`: the rows' sampling costs both
alike). A step that also ran a prompt's work or computed nothing is not counted
(`StepClock.disturbed`).

`StepGate` decides at each step's start, for the batch at hand, whether to verify: the expected
tokens per second of the best verify width (each row's hoped drafts and acceptance rate,
policy.py `expected_tokens`) against the plain step's rows per second, with a margin. A cost not
measured yet is measured first (a few steps of that kind: exploration; while rows hope for
drafts, verifies of one width wider than one position, uncut by the prior position cost, until
one is measured three times or eight steps tried); while plain wins, a probe verifies now and
then (every 16 plain steps, doubling while probes lose, up to 512, and no more often than keeps
their extra cost to 1 % of the plain steps between them) so a batch whose rows start copying is
noticed, except where the rows' rates are learnt on plain steps (lookup's shadow drafts:
shadow.py) and say their drafts would lose even at a verify `COST_DOUBT` cheaper than measured;
while verifies win, the plain step's cost is measured again every 64 verify steps
(`REFRESH_EVERY`), and while plain wins for the same rows the gate is not asked again until a
probe is due (`quiet`, at most 16 steps). Exploration and probes are trials (`trial`):
drafter.py verifies their drafts whatever the rows' rates (the rates are what a trial tests),
and a trial that paid buys up to two more (`reward`). Rows whose drafts are certain (a
grammar's) always verify: their tokens cost nothing to guess.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from vlmserve.engine.speculation.policy import RowDrafts, expected_totals

__all__ = ["StepCosts", "StepGate", "bucket"]

# How many recent measurements a cost is the median of: one step that also ran other work, was
# preempted or computed nothing (every row ended) does not move it.
_WINDOW = 9
# Measurements of a kind before the average is trusted.
_KNOWN_AFTER = 3
# How much better the verify step must be expected to do (tokens per second) than the plain one.
MARGIN = 0.05
_FIRST_PROBE = 16
_LAST_PROBE = 512
# What probes may cost beside the plain steps between them (their extra time as a share of
# those steps'), and the longest gap that keeps them to it.
PROBE_BUDGET = 0.01
_LAST_BUDGETED_PROBE = 4096
# Verify steps a bucket may spend measuring wide verifies while rows hope for drafts (lookup may
# find none for them: then the steps are one position wide and measure nothing wide).
_EXPLORE_STEPS = 8
# Trials a paying trial may add in a row (StepGate.reward).
_REWARDS = 2
# Verify steps won in a row before the plain step's cost is measured again (StepGate).
REFRESH_EVERY = 64
# The most steps StepGate.quiet lets pass without weighing the costs again.
QUIET_STEPS = 16
# Where the rows' rates are observed on plain steps (shadow.py), how much cheaper than measured a
# verify must be for their drafts to pay before a probe is worth its cost: the rates are known,
# a probe then only re-measures a verify's cost, which may be stale (measured under other load).
COST_DOUBT = 0.25


def bucket(rows: int) -> int:
    """Batch sizes that cost alike: 1, 2, 3, 4, then powers of two (5-8 -> 8, 9-16 -> 16)."""
    if rows <= 4:
        return max(1, rows)
    return 1 << (rows - 1).bit_length()


def _median(values: list[float]) -> float:
    """The lower middle: a step preempted (too slow) among two does not count."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


@dataclass(slots=True)
class _Cost:
    """One kind of step's cost in a bucket, from the last _WINDOW measurements and their rows: at
    `rows`, the median of the measurements each moved to `rows` along a per-row slope (the
    median of the slopes between the batch sizes measured, never below 0, so one preempted step
    moves neither). A bucket spans batch sizes (9-16 rows): priced at one median whatever the
    rows, a three-wide verify measured on a wave's tail (9 rows: 5.92 ms) priced the full
    batch's (16 rows: 8.14 ms) on the copying fixture at 16 streams (issue 37.1). Where all
    measurements have one batch size the slope is borrowed (`StepCosts._slope`) or 0: the
    median, as before.

    Before the median, an exponentially weighted average (weight 0.2, clipped above at 3x)
    moved with every odd step: a step that computed nothing (every row ended with its token in
    flight) pulled a plain step's cost at 16 rows from ~5 ms to 1.6 ms, and the gate ran greedy
    rows whose drafts were all accepted plain (10 verify steps of 406); a load spike pushed it
    up past the verifies' (issue 37.1)."""

    count: int = 0
    _recent: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=_WINDOW))
    # A verify's: the plain step's seconds at each measurement's rows when it was measured (None:
    # not known then), beside `_recent` (StepCosts._drift).
    _references: deque[float | None] = field(default_factory=lambda: deque(maxlen=_WINDOW))
    # What the gate asks again and again between measurements: the slope (None: not worked out
    # since the last measurement) and the seconds at (rows, slope).
    _slope: tuple[float | None] | None = None
    _at: dict[tuple[int, float], float] = field(default_factory=dict)

    def add(self, rows: int, seconds: float, reference: float | None = None) -> None:
        self.count += 1
        self._recent.append((rows, seconds))
        self._references.append(reference)
        self._slope = None
        self._at.clear()

    def references(self) -> list[tuple[int, float]]:
        """Each recent measurement's rows and the plain step's seconds at them then, where known."""
        return [
            (rows, then)
            for (rows, _), then in zip(self._recent, self._references, strict=True)
            if then is not None
        ]

    @property
    def known(self) -> bool:
        return self.count >= _KNOWN_AFTER

    def slope(self) -> float | None:
        """Seconds per row (None: fewer than two batch sizes measured twice each): the median of
        the slopes between the batch sizes' medians. Each batch size needs two measurements, or
        one step at another size (a preempted one; a wave's tail is often one step a size)
        would be the slope's only measure."""
        if self._slope is None:
            sizes: dict[int, list[float]] = {}
            for rows, seconds in self._recent:
                sizes.setdefault(rows, []).append(seconds)
            medians = sorted((rows, _median(times)) for rows, times in sizes.items() if len(times) >= 2)
            slopes = sorted(
                (s2 - s1) / (r2 - r1) for i, (r1, s1) in enumerate(medians) for r2, s2 in medians[i + 1 :]
            )
            # At most all of a step's cost is per row (a cost = a fixed part + rows x the slope,
            # the fixed part never below 0).
            most = min((seconds / rows for rows, seconds in medians), default=0.0)
            self._slope = (min(most, max(0.0, _median(slopes))) if slopes else None,)
        return self._slope[0]

    def at(self, rows: int, slope: float) -> float:
        """The seconds at `rows`, each measurement moved there along `slope`."""
        key = (rows, slope)
        seconds = self._at.get(key)
        if seconds is None:
            seconds = self._at[key] = _median([s + slope * (rows - r) for r, s in self._recent])
        return seconds


@dataclass
class StepCosts:
    """Measured seconds per step, per batch-size bucket and priced at the step's rows within it
    (`_Cost`): plain steps (width 0 here) and verify steps by width. `position_cost` (policy.py's
    prior: one more position per row, as a share of a step) extrapolates a verify width not
    measured from the nearest one that is."""

    position_cost: float = 0.065
    _steps: dict[tuple[int, int], _Cost] = field(default_factory=dict)
    # Per bucket: its verifies' median seconds per row and position (None: none has a slope),
    # worked out again after a measurement in the bucket (`_slope`).
    _per_position: dict[int, float | None] = field(default_factory=dict)
    _prices: dict[tuple[int, int], dict[int, float]] = field(default_factory=dict)
    # Per bucket: what `plain` (width 0) and `verify` answered at (rows, width) since its last
    # measurement (the gate, the width choice and the quiet steps ask ~15 times a step).
    _answers: dict[int, dict[tuple[int, int], float | None]] = field(default_factory=dict)

    def observe(self, rows: int, width: int, seconds: float) -> None:
        """A step of `rows` rows took `seconds`; width 0: a plain step, else a verify's."""
        if rows <= 0 or seconds <= 0:
            return
        size = bucket(rows)
        reference = self.plain(rows) if width > 0 else None
        self._steps.setdefault((size, width), _Cost()).add(rows, seconds, reference)
        self._changed(size)

    def _changed(self, size: int) -> None:
        """The bucket's costs moved: what was worked out from them is worked out again."""
        self._per_position.pop(size, None)
        self._answers.pop(size, None)
        for key in [key for key in self._prices if key[0] == size]:
            del self._prices[key]

    def plain(self, rows: int) -> float | None:
        """A plain step's measured seconds (None: not known yet)."""
        answers = self._answers.setdefault(bucket(rows), {})
        key = (rows, 0)
        if key not in answers:
            answers[key] = self._seconds(rows, 0)
        return answers[key]

    def _seconds(self, rows: int, width: int) -> float | None:
        """A known kind's seconds at `rows` (None: not known yet)."""
        size = bucket(rows)
        cost = self._steps.get((size, width))
        return cost.at(rows, self._slope(size, width)) if cost is not None and cost.known else None

    def _slope(self, size: int, width: int) -> float:
        """A kind's seconds per row: its own; else, for a verify, `width` times the median per
        row and position of the bucket's verifies that have one (a verify's per-row part grows
        with its width: forward positions and drafts to check; on this CPU 0.1-0.2 ms a row a
        position for the copying fixture at 9-16 rows, where a plain step's is ~0: priced at
        the plain step's slope, a three-wide verify measured at 16 rows, 10.1 ms, kept that
        price at 9); else the plain step's; else 0 (one batch size measured: the median)."""
        cost = self._steps.get((size, width))
        own = cost.slope() if cost is not None else None
        if own is not None:
            return own
        if width > 0:
            if size not in self._per_position:
                slopes = [
                    slope / w
                    for (b, w), other in self._steps.items()
                    if b == size and w > 0 and (slope := other.slope()) is not None
                ]
                self._per_position[size] = _median(slopes) if slopes else None
            per_position = self._per_position[size]
            if per_position is not None:
                return width * per_position
            plain = self._steps.get((size, 0))
            own = plain.slope() if plain is not None else None
            if own is not None:
                return own
        return 0.0

    def forget_plain(self, rows: int) -> None:
        """The plain step's cost for this batch size is to be measured again (StepGate)."""
        self._steps.pop((bucket(rows), 0), None)
        self._changed(bucket(rows))

    def explored(self, rows: int) -> bool:
        """Whether a verify wider than one position has a known cost for this batch size. Until
        then a verify step is not cut to the widths the prior position cost allows: at 16 rows
        its prior (0.065 x 16 per extra position) allows none, so no wide verify would ever be
        measured (issue 37.1)."""
        size = bucket(rows)
        return any(b == size and w > 1 and a.known for (b, w), a in self._steps.items())

    def _priced(self, rows: int) -> dict[int, float]:
        """Each known verify width's seconds at `rows`, narrowest first (kept until the bucket's
        next measurement: the gate and the width choice ask for them many times a step)."""
        size = bucket(rows)
        priced = self._prices.get((size, rows))
        if priced is None:
            known = sorted(
                ((w, cost) for (b, w), cost in self._steps.items() if b == size and w > 0 and cost.known),
                key=lambda item: item[0],
            )
            priced = {w: cost.at(rows, self._slope(size, w)) + self._drift(cost) for w, cost in known}
            self._prices[(size, rows)] = priced
        return priced

    def _drift(self, cost: _Cost) -> float:
        """How far the plain step's cost has moved since a verify kind was measured (the median,
        over its measurements that had a plain cost then, of the plain step's seconds at their
        rows now less then), added to its price: a step's sampling and handing out costs a plain
        step and a verify alike, and moves with the rows' requests, not with the width. Measured
        where greedy rows ran (a plain step of 4 rows 1.9 ms on the Qwen3.5 fixture), verifies kept
        those prices when rows sampling at temperature 1 followed (plain 3.6-3.9 ms): two- and
        three-wide verifies came out below a plain step, were priced as one, and rows with
        nothing to copy verified at a hope of 5 % of a token (lookup with nothing to copy at 2-8
        streams: 0.94-0.96x of `off` in a run with `greedy` cells between, 1.00-1.03x in one
        without; issue 37.1, docs/performance.md).
        Never below 0: the plain cost a verify was measured beside may be stale (while verifies
        win no plain step is measured, `StepGate._refresh`), and a verify priced below what it
        was measured at makes the gate verify on the stale figure, where one priced above it
        only makes it wait for a probe."""
        moved = [now - then for rows, then in cost.references() if (now := self.plain(rows)) is not None]
        return max(0.0, _median(moved)) if moved else 0.0

    def verify(self, rows: int, width: int) -> float | None:
        """A verify step of `width`'s seconds (`_verify`), never less than a plain step's: a
        verify does all a plain step does and more, so a cheaper measurement is noise or a
        batch of fewer rows in the same bucket (a nine-wide verify of 9 rows measured at 9.4 ms
        against 13.5 ms for plain steps of 16, and every verify then "won", drafts or none:
        issue 37.1)."""
        answers = self._answers.setdefault(bucket(rows), {})
        key = (rows, width)
        if key not in answers:
            seconds = self._verify(rows, width)
            plain = self.plain(rows)
            answers[key] = max(seconds, plain) if seconds is not None and plain is not None else seconds
        return answers[key]

    def _verify(self, rows: int, width: int) -> float | None:
        """A verify step of `width`'s seconds: measured; else interpolated between the measured
        widths around it, wider than all of them along the two widest (never falling), else
        along the line from the plain step (width 1 costs at least that) to the narrowest measured
        where only that one or wider ones are, else scaled from the nearest with the prior
        position cost (None: no verify width is known for this bucket)."""
        seconds = self._priced(rows)
        if not seconds:
            return None
        known = list(seconds)
        below = [w for w in known if w <= width]
        above = [w for w in known if w >= width]
        if below and above:
            low, high = below[-1], above[0]
            if low == high:
                return seconds[low]
            return seconds[low] + (seconds[high] - seconds[low]) * (width - low) / (high - low)
        if len(below) >= 2:  # wider than any measured: along the two widest
            low, high = below[-2:]
            slope = max(0.0, (seconds[high] - seconds[low]) / (high - low))
            return seconds[high] + slope * (width - high)
        plain = self.plain(rows)
        if plain is not None and known[0] > 1:
            # Width 1 costs at least a plain step, measured: a width below the narrowest measured
            # lies on the line from (1, plain) to it, a width wider than the only one measured
            # along that line. The prior scaled a five-wide verify's cost at 16 rows down to 0.4
            # of it for two positions, where this CPU measures 0.5-0.65: one copied token in six
            # looked worth a verify that cost 1.3-2 plain steps (issue 37.1).
            narrowest = known[0]
            slope = max(0.0, (seconds[narrowest] - plain) / (narrowest - 1))
            return seconds[narrowest] + slope * (width - narrowest)
        nearest = below[-1] if below else above[0]
        scale = self.position_cost * rows
        return seconds[nearest] * (1 + scale * (width - 1)) / (1 + scale * (nearest - 1))

    def relative(self, rows: int, max_width: int) -> list[float] | None:
        """Each verify width's cost (1..max_width) as a share of width 1's, for `verify_width`
        (None: not measured yet). Width 1 costs at least a plain step: where its measured cost
        came out below the plain step's (noise), the widths the step gate found paying against
        the plain step would be cut to one position here, a verify that drafts nothing."""
        base = self.verify(rows, 1)
        if base is None:
            return None
        base = max(base, self.plain(rows) or 0.0)
        return [(self.verify(rows, width) or base) / base for width in range(1, max_width + 1)]


def verify_rate(offers: Sequence[RowDrafts], costs: StepCosts, max_width: int) -> float | None:
    """The best verify width's expected tokens per second for these rows' offers (None: no verify
    cost known; 0: no row has drafts to offer). Only widths that verify a draft count: a verify
    step one position wide gives the tokens a plain step gives and never costs less (it reads
    the tokens in flight first, and with a drafter model also reads hidden states and runs the
    drafter's follow), so where its measured cost came out below the plain step's (noise, a
    preempted plain step) it must not win: on the MTP fixture with nothing to copy the gate
    chose 230 one-position verifies in 256 steps of one row (issue 37.1)."""
    rows = len(offers)
    best: float | None = None
    if costs.verify(rows, 2) is None:
        # Measured first even when no row offers drafts now: rows whose drafter model holds no
        # state offer none until a verify, so at 16 DFlash rows (their first step plain) no
        # verify was ever measured or taken (issue 37.1).
        return None
    widest = min(max_width, 1 + max((offer.available for offer in offers), default=0))
    if widest < 2:
        return 0.0
    totals = expected_totals(offers, widest - 1)
    for width in range(2, widest + 1):
        seconds = costs.verify(rows, width)
        if seconds is None:
            return None
        tokens = rows + totals[width - 1]
        rate = tokens / seconds
        best = rate if best is None or rate > best else best
    return best


@dataclass
class StepGate:
    """At each step's start: verify (True) or a plain step (False), per batch-size bucket."""

    costs: StepCosts = field(default_factory=StepCosts)
    margin: float = MARGIN
    # Verify steps a probe lasts (a drafter model's rows need one step to follow the target
    # before they draft again).
    probe_steps: int = 1
    # The width a trial verifies at (drafter.py: a new row's draft length + 1), for what a
    # probe costs.
    trial_width: int = 5
    # Per bucket: plain steps since the last verify, the gap before the next probe, and the
    # probe's verify steps still to run.
    _plain_run: dict[int, int] = field(default_factory=dict)
    _probe_every: dict[int, int] = field(default_factory=dict)
    _probing: dict[int, int] = field(default_factory=dict)
    _exploring: dict[int, int] = field(default_factory=dict)
    _rewards: dict[int, int] = field(default_factory=dict)
    # Per bucket: verify steps won in a row (REFRESH_EVERY), and whether the plain step's cost
    # is being measured again.
    _won_run: dict[int, int] = field(default_factory=dict)
    _refreshing: dict[int, bool] = field(default_factory=dict)
    # Whether the step just decided verifies as a trial (exploration or a probe) rather than a
    # win: its drafts are then verified at the exploration width, not cut by the widths' costs
    # and the rows' rates, which the trial is there to measure again (drafter.py). A probe cut
    # by a rate learnt on text with nothing to copy verified nothing, so the rate never moved.
    trial: bool = False

    def verifies(
        self, offers: Sequence[RowDrafts], max_width: int, *, certain: bool = False, observed: bool = False
    ) -> bool:
        """Whether this step verifies: `offers` are the rows' hoped drafts (how many each would
        draft, at what acceptance rate); `certain`: some row has drafts that cost no guess;
        `observed`: every row's rate is learnt on plain steps too (shadow.py), so a probe is
        needed only where the drafts would pay at a somewhat cheaper verify (`COST_DOUBT`)."""
        rows = len(offers)
        size = bucket(rows)
        self.trial = False
        if certain:
            return self._verified(size, won=True)
        probing = self._probing.get(size, 0)
        if probing > 0:
            self._probing[size] = probing - 1
            self.trial = True
            return True
        hoping = any(offer.available > 0 and offer.chance > 0 for offer in offers)
        explored = self._exploring.get(size, 0)
        if hoping and explored < _EXPLORE_STEPS and not self.costs.explored(rows):
            self._exploring[size] = explored + 1
            self.trial = True
            return self._verified(size, won=False)  # measure what a wide verify costs here
        self._rewards[size] = 0  # the measured costs decide this step
        plain = self.costs.plain(rows)
        verify = verify_rate(offers, self.costs, max_width)
        if verify is None:
            self.trial = True
            return self._verified(size, won=False)  # measure what a verify costs here
        if plain is None:
            return False  # measure what a plain step costs here
        if self._refreshing.pop(size, False) and self.probe_steps > 1:
            # The plain step's cost is measured again: a drafter model's rows, which the plain
            # steps left without state, draft again at a probe before the costs decide.
            self._probing[size] = self.probe_steps - 1
            self.trial = True
            return self._verified(size, won=False)
        needed = self._needed(rows, plain)
        if verify > needed:
            won = self._won_run.get(size, 0) + 1
            if won >= REFRESH_EVERY:
                return self._refresh(rows)
            self._won_run[size] = won
            return self._verified(size, won=True)
        self._won_run[size] = 0
        run = self._plain_run.get(size, 0) + 1
        every = self._probe_every.get(size, _FIRST_PROBE)
        if run >= max(every, self._budgeted_gap(rows, plain)):
            self._probe_every[size] = min(_LAST_PROBE, 2 * every)
            self._plain_run[size] = 0
            if observed and verify * (1 + COST_DOUBT) <= needed:
                # The probe would only tell what the shadow drafts have told: it is skipped, as
                # if it had lost (the gap still doubles, so the quiet steps stay long).
                return False
            self._probing[size] = self.probe_steps - 1
            self.trial = True
            return True
        self._plain_run[size] = run
        return False

    def quiet(self, offers: Sequence[RowDrafts], max_width: int) -> int:
        """After a plain step won: how many steps after it are plain whatever happens, for rows
        that will offer at most `offers` (what they hope once their rests are over) as long as
        the batch keeps its rows: none verifies before the next probe is due unless the offers
        or the costs change, and those offers lose now. The speculator skips its per-row work
        and this gate on those steps (`plain_step`): ~60 us a step at 8 rows, 2 % of the
        fixtures' ~3 ms steps (issue 37.1). At most QUIET_STEPS, so the costs are weighed
        again that often."""
        rows = len(offers)
        size = bucket(rows)
        plain = self.costs.plain(rows)
        if plain is None or self._probing.get(size, 0) > 0 or self._refreshing.get(size, False):
            return 0
        hoping = any(offer.available > 0 and offer.chance > 0 for offer in offers)
        if hoping and self._exploring.get(size, 0) < _EXPLORE_STEPS and not self.costs.explored(rows):
            return 0
        verify = verify_rate(offers, self.costs, max_width)
        if verify is None or verify > self._needed(rows, plain):
            return 0
        every = max(self._probe_every.get(size, _FIRST_PROBE), self._budgeted_gap(rows, plain))
        return max(0, min(QUIET_STEPS, every - self._plain_run.get(size, 0) - 1))

    def headroom(self, offers: Sequence[RowDrafts], max_width: int) -> float:
        """How far the rows' summed expected accepted drafts (each row's at all it would draft)
        may rise before a verify step of some width could win: the quiet steps last while they
        have not (quiet.py). At width w a verify wins once its tokens reach (1 + margin) x the
        plain step's rate x its cost; each row gives at most its whole hope at any width, so a
        rise below every width's shortfall leaves each width losing (0: no costs known)."""
        rows = len(offers)
        plain = self.costs.plain(rows)
        if plain is None:
            return 0.0
        needed = self._needed(rows, plain)
        totals = expected_totals(offers, max_width - 1)
        shortfall = math.inf
        for width in range(2, max_width + 1):
            seconds = self.costs.verify(rows, width)
            if seconds is None:
                return 0.0
            shortfall = min(shortfall, needed * seconds - rows - totals[width - 1])
        return max(0.0, shortfall) if shortfall != math.inf else 0.0

    def _needed(self, rows: int, plain: float) -> float:
        """The tokens a second a verify step must be expected to give to win: the plain step's
        (`plain` seconds for `rows` tokens), raised by the margin."""
        return (1 + self.margin) * rows / plain

    def plain_step(self, rows: int) -> None:
        """A step `quiet` said is plain ran (it counts toward the next probe)."""
        size = bucket(rows)
        self._plain_run[size] = self._plain_run.get(size, 0) + 1

    def _refresh(self, rows: int) -> bool:
        """After REFRESH_EVERY verify steps won in a row, a plain step (then three, until its
        cost is known again): while verifies win, plain steps are not measured, so a plain cost
        measured while the machine was busy (load on a shared CPU; a prompt chunk) stayed high
        while the verifies' came down with the load, and the gate kept verifying at 0.43x of
        `off` (MTP auto, nothing to copy, 16 rows: 260 verify steps to 127 plain in a cell)
        until the batch ended. Where verifies do pay, this costs a few plain steps in 64."""
        size = bucket(rows)
        self._won_run[size] = 0
        self._refreshing[size] = True
        self.costs.forget_plain(rows)
        return False

    def _budgeted_gap(self, rows: int, plain: float) -> int:
        """The fewest plain steps between probes that keep their extra cost (each of the
        probe's steps a verify at the trial width instead of a plain step) to PROBE_BUDGET of
        those steps' time. Where a verify costs little more than a plain step (a memory-bound
        decode) the doubling gap governs; where it costs several (this CPU on the fixtures: a
        five-wide MTP verify of one row ~8 plain steps), probes every 512 plain steps alone cost
        a 2 % of throughput that no draft paid for (issue 37.1)."""
        verify = self.costs.verify(rows, self.trial_width)
        if verify is None:
            return 0
        extra = self.probe_steps * max(0.0, verify - plain)
        return min(_LAST_BUDGETED_PROBE, int(extra / (PROBE_BUDGET * plain)))

    def reward(self, rows: int) -> None:
        """The last trial paid (one accepted draft per row or more): verify again next step (a
        trial too), at most `_REWARDS` times in a row, so rows that start copying get their
        rates up (a verify moves a rate 0.3 of the way: 0 -> 0.3 -> 0.51) before the measured
        costs decide; the probe gap is not reset (where verifying never pays, accepted drafts
        must not buy more trials)."""
        size = bucket(rows)
        rewards = self._rewards.get(size, 0)
        if rewards < _REWARDS:
            self._rewards[size] = rewards + 1
            self._probing[size] = max(self._probing.get(size, 0), 1)

    def losing(self, rows: int) -> bool:
        """Whether plain steps have been winning for this batch size (the last step was plain)."""
        return self._plain_run.get(bucket(rows), 0) > 0

    def _verified(self, size: int, *, won: bool) -> bool:
        self._plain_run[size] = 0
        if won:
            self._probe_every[size] = _FIRST_PROBE
        return True

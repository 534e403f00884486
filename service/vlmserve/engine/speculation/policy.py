"""How many draft tokens to verify: per row (adaptive, backing off) and per step (cost). Pure.

Per row (`DraftLength`): the draft length grows while drafts are accepted whole and shrinks to
what was accepted when one is rejected; repeated misses stop drafting for a while (a cooldown that
doubles each time, reset by a hit), so text with nothing to copy soon costs nothing. Steps where
lookup finds nothing at all rest the row too, briefly (`found_nothing`): while every row rests,
the batch runs plain steps, which stay double-buffered (a step that may draft must first read the
tokens in flight). It also keeps an average acceptance rate, which the step's choice reads.

Per step (`verify_width`): every row of a batched forward has the same width (1 + the drafts it
verifies; rows with fewer are padded), and a forward over more positions costs more. The cost
model is one number, `position_cost`: what one more position adds to a one-position step (on this
CPU about 0.065 for the 144M model: a 43-token forward ~260 ms against a 69 ms step; on Apple
silicon, where a decode step is memory-bound, a few hundredths or less). The width chosen
maximises expected tokens per unit of cost; width 1 is the plain step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["DraftLength", "RowDrafts", "expected_tokens", "expected_totals", "verify_width"]

# The acceptance rate a row starts with (before any verify) and how fast the average moves.
_PRIOR_RATE = 0.6
_RATE_WEIGHT = 0.3
_MISSES_BEFORE_COOLDOWN = 2
_MAX_COOLDOWN = 64
# Lookups that found nothing before a rest, and the longest rest: a copy that starts in such text
# is drafted at most this many tokens late.
_EMPTY_BEFORE_REST = 4
_MAX_REST = 8


class DraftLength:
    """One row's draft budget. Call `allowed()` once per step it could draft, `record()` after a
    verify of its drafts."""

    def __init__(self, max_tokens: int, *, initial: int | None = None, rate: float | None = None) -> None:
        self.max_tokens = max(0, max_tokens)
        self.length = min(self.max_tokens, initial if initial is not None else max(1, self.max_tokens // 2))
        # A new row starts from the rate it is given (the recent rows' average: drafter.py), else
        # the prior.
        self.rate = _PRIOR_RATE if rate is None else rate
        self._misses = 0
        self._cooldown = 0
        self._backoff = 1
        self._empty = 0
        self._rest = 1
        # How often the row had drafts when asked (the step gate's expected tokens: step_cost.py),
        # and how often lookup itself had (beside a drafter model, which drafts where it has none).
        self.hit = 1.0
        self.lookup_hit = 1.0

    @property
    def resting(self) -> bool:
        """Whether this step is one it may not draft in (`allowed()` would say 0)."""
        return self._cooldown > 0

    def rest(self, steps: int = 1) -> None:
        """Steps passed without asking `allowed()` (plain steps while it rests)."""
        self._cooldown = max(0, self._cooldown - steps)

    def found(self) -> None:
        """Lookup proposed drafts this step."""
        self._empty, self._rest = 0, 1
        self.hit += _RATE_WEIGHT * (1 - self.hit)
        self.lookup_hit += _RATE_WEIGHT * (1 - self.lookup_hit)

    def lookup_missed(self) -> None:
        """Lookup had nothing, and a drafter model drafts for the row instead (no rest)."""
        self.lookup_hit -= _RATE_WEIGHT * self.lookup_hit

    def found_nothing(self) -> None:
        """Lookup had nothing to propose: after a few such steps, rest (1, 2, 4... steps)."""
        self.hit -= _RATE_WEIGHT * self.hit
        self.lookup_hit -= _RATE_WEIGHT * self.lookup_hit
        self._empty += 1
        if self._empty >= _EMPTY_BEFORE_REST:
            self._cooldown, self._empty = max(self._cooldown, self._rest), 0
            self._rest = min(_MAX_REST, 2 * self._rest)

    def allowed(self) -> int:
        """Drafts this step may propose (0 while cooling down)."""
        if self._cooldown > 0:
            self._cooldown -= 1
            return 0
        return self.length

    def observed(self, drafted: int, accepted: int) -> None:
        """Drafts scored against the tokens the row took (a verify's, or a shadow draft's on a
        plain step: shadow.py): the rate and length move; only a verify's misses rest the row
        (resting saves lookups and verifies, and a shadow draft cost neither)."""
        if drafted <= 0:
            return
        self.rate += _RATE_WEIGHT * (accepted / drafted - self.rate)
        if accepted == drafted:
            self.length = min(self.max_tokens, self.length + 1)
        else:
            self.length = max(1, min(self.length, accepted + 1))

    def observed_lookup(self, *, found: bool) -> None:
        """Whether lookup had drafts for the row at a shadow look (shadow.py): its hit rates move
        as when asked at a verify, its rests do not."""
        target = 1.0 if found else 0.0
        self.hit += _RATE_WEIGHT * (target - self.hit)
        self.lookup_hit += _RATE_WEIGHT * (target - self.lookup_hit)

    def hoped(self, room: int, *, lookup_only: bool = False, rested: bool = False) -> RowDrafts:
        """What the row would offer a step now (without asking: no cooldown step is used);
        `lookup_only`: what lookup alone would (its drafter model cannot draft this step);
        `rested`: what it will offer once its rest is over (nothing else changes it between
        verifies)."""
        if (self._cooldown > 0 and not rested) or room <= 0:
            return RowDrafts(0, 0.0)
        return RowDrafts(min(self.length, room), self.rate, self.lookup_hit if lookup_only else self.hit)

    def record(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        self.observed(drafted, accepted)
        if accepted == 0:
            self._misses += 1
            if self._misses >= _MISSES_BEFORE_COOLDOWN:
                self._cooldown, self._misses = self._backoff, 0
                self._backoff = min(_MAX_COOLDOWN, 2 * self._backoff)
        else:
            self._misses, self._backoff = 0, 1


@dataclass(frozen=True, slots=True)
class RowDrafts:
    """What one row offers a step: how many drafts it has and how likely each is accepted (a
    forced draft, such as a grammar's, has rate 1); `chance`: how likely it has them at all (a
    hope, before lookup was asked)."""

    available: int
    rate: float
    chance: float = 1.0

    def expected(self, drafts: int) -> float:
        """Expected accepted drafts when it verifies at most `drafts` of them."""
        return self.chance * expected_tokens(self.rate, min(self.available, drafts))

    @property
    def hope(self) -> float:
        """Expected accepted drafts when it verifies all it has."""
        return self.expected(self.available)


def expected_tokens(rate: float, drafts: int) -> float:
    """Expected accepted drafts when each is accepted with `rate` until the first rejection."""
    if drafts <= 0 or rate <= 0:
        return 0.0
    if rate >= 1:
        return float(drafts)
    return rate * (1 - rate**drafts) / (1 - rate)


def expected_totals(rows: Sequence[RowDrafts], drafts: int) -> list[float]:
    """The rows' expected accepted drafts summed, when each verifies at most k of its drafts,
    for k = 0..`drafts`: `sum(row.expected(k) for row in rows)` for every k in one pass over
    the rows (the step gate and the width choice weigh every width each step: at 16 rows and
    nine widths, 144 calls a step)."""
    totals = [0.0] * (drafts + 1)
    for row in rows:
        if row.rate <= 0 or row.chance <= 0:
            continue
        rate = min(row.rate, 1.0)
        accepted, power = 0.0, row.chance  # chance x rate^k: the k-th draft accepted
        for k in range(1, drafts + 1):
            if k <= row.available:
                power *= rate
                accepted += power
            totals[k] += accepted
    return totals


def verify_width(
    rows: Sequence[RowDrafts],
    *,
    position_cost: float,
    max_width: int,
    costs: Sequence[float] | None = None,
) -> int:
    """The step's width (1 = no drafts) with the most expected tokens per unit of forward cost:
    `costs[w - 1]`, width w's measured cost as a share of width 1's (step_cost.py), where
    measured and long enough, else 1 + `position_cost` per position per row."""
    if not rows:
        return 1
    best_width, best_value = 1, float(len(rows))  # width 1: one token per row for cost 1
    widest = min(max_width, 1 + max(row.available for row in rows))
    totals = expected_totals(rows, widest - 1)
    for width in range(2, widest + 1):
        tokens = len(rows) + totals[width - 1]
        if costs is not None and width <= len(costs):
            cost = costs[width - 1]
        else:
            cost = 1 + position_cost * len(rows) * (width - 1)
        if tokens / cost > best_value * (1 + 1e-9):
            best_width, best_value = width, tokens / cost
    return best_width

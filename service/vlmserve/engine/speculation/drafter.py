"""Each decoding row's drafts for a step: grammar fast-forward first, then prompt lookup, then a
drafter model (`--draft-model`, model_drafter.py, dflash_drafter.py).

The batch's verifier (loop/verifier.py) asks `Speculator.drafts()` once per step for every row, with the
tokens the row has that are not accepted yet (`pending`: the previous step's, whose values the
batch knows). A constrained row drafts the tokens its grammar forces (field names, braces, a
forced call's opening: accepted unless the model writes the same text with other tokens); any
other row the continuation of its longest recent n-gram match (lookup.py), as many as its
`DraftLength` allows; with a drafter model, a row that lookup has nothing for (or every row,
`--speculative draft`) takes the drafter's. The step's width then comes from `verify_width`
(policy.py), and every row's drafts are cut to it. Rows that cannot verify drafts (logprobs,
custom logits processors) draft nothing and run as in a plain step. Where lookup is the only
drafter, the rows' rates are also learnt on plain steps, from what lookup would have drafted
(shadow.py), so the step gate needs no probe to see whether drafts would be accepted.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from vlmserve.engine.speculation.lookup import PromptLookup
from vlmserve.engine.speculation.model_drafter import AnyDrafter
from vlmserve.engine.speculation.policy import DraftLength, RowDrafts, verify_width
from vlmserve.engine.speculation.quiet import QuietSteps
from vlmserve.engine.speculation.shadow import Shadow
from vlmserve.engine.speculation.step_cost import StepCosts, StepGate, bucket

__all__ = ["DraftingRow", "SpeculationCounts", "Speculator"]


class DraftingRow(Protocol):
    @property
    def key(self) -> Hashable:
        """The row's key in its batch (its speculation state is kept under it)."""
        ...

    @property
    def can_draft(self) -> bool: ...

    @property
    def context_tokens(self) -> tuple[Sequence[int], Sequence[int]]: ...

    @property
    def tokens_left(self) -> int:
        """Tokens the row may still be given after the pending ones."""
        ...

    @property
    def constrained(self) -> bool:
        """Its tokens follow a grammar (which may force drafts at any step)."""
        ...

    @property
    def greedy(self) -> bool:
        """Its tokens are the target's argmax (temperature 0), not drawn at random."""
        ...

    def forced_tokens(self, pending: Sequence[int]) -> list[int]: ...

    def take_prompt_hidden(self) -> tuple[int, Any] | None: ...


# How fast the recent rows' acceptance rate moves with each verified row.
_RECENT_WEIGHT = 0.1

# Where a row's drafts came from (the metrics' `source` label).
SOURCES = ("grammar", "lookup", "draft")


@dataclass
class SpeculationCounts:
    """Totals since the last read (metrics): drafts verified and accepted and rows that had drafts
    verified (each takes its accepted drafts + 1 token), per source; verify forwards, all forwards."""

    drafted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCES, 0))
    accepted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCES, 0))
    drafting_rows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCES, 0))
    verifies: int = 0
    forwards: int = 0


@dataclass
class _RowState:
    lookup: PromptLookup
    length: DraftLength
    fed: int = 0
    # The source of the drafts proposed this step (SOURCES): forced ones do not train the length.
    source: str = "lookup"
    # Lookup's drafts scored on plain steps (shadow.py).
    shadow: Shadow = field(default_factory=Shadow)


@dataclass
class Speculator:
    max_draft: int = 8
    position_cost: float = 0.065
    lookup: bool = True
    # mlx-vlm's drafter for rows lookup has nothing for (None: no drafter model).
    model_drafter: AnyDrafter | None = None
    counts: SpeculationCounts = field(default_factory=SpeculationCounts)
    # Whether a step speculates at all, from measured step costs (step_cost.py; None: always,
    # as far as rows' rests allow).
    gate: StepGate | None = None
    _rows: dict[Hashable, _RowState] = field(default_factory=dict)
    # The acceptance rate of recent verifies, of greedy rows and of sampling rows apart (absent:
    # none yet): a new row's starting rate, so the step gate weighs its drafts by what drafts of
    # rows like it have been worth here.
    _recent_rates: dict[bool, float] = field(default_factory=dict)
    # The last step's drafts accepted, if it was the step gate's trial (StepGate.reward).
    _trial_accepted: int = 0
    # Steps the gate said are plain (StepGate.quiet, quiet.py), and the rows looked at on them
    # too (Shadow.watched).
    _quiet: QuietSteps = field(default_factory=QuietSteps)
    _watched: list[DraftingRow] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.gate is None:
            # A drafter model's rows follow one step before they draft again after plain steps.
            probe = 2 if self.model_drafter is not None else 1
            self.gate = StepGate(
                StepCosts(self.position_cost), probe_steps=probe, trial_width=self.trial_width
            )

    @property
    def trial_width(self) -> int:
        """The width a trial verifies at: a new row's draft length + 1."""
        return 1 + max(1, self.max_draft // 2)

    @property
    def costs(self) -> StepCosts | None:
        return self.gate.costs if self.gate is not None else None

    @property
    def reads_hidden_states(self) -> bool:
        """Whether every forward's last hidden states go to `follow` (a drafter model's rows)."""
        return self.model_drafter is not None

    @property
    def capture_layer_ids(self) -> tuple[int, ...]:
        """The target layers whose hidden states the drafter model reads (besides the last)."""
        return self.model_drafter.capture_layer_ids if self.model_drafter is not None else ()

    def keeps_prompt_hidden(self) -> bool:
        """Whether a row admitted now keeps its prompt's hidden states (loop/prompt_batch.py):
        only while its drafter would start over them, at its first decode step, which verifies
        unless plain steps win at its batch size (`speculates`); then its drafter starts later
        from the tokens since, and the hidden states (up to 4,096 positions of the captured
        layers: hundreds of MB a row for a DFlash drafter on a real model) were kept for nothing
        (issue 37.1). The row's batch size is guessed from the rows held now (it may join with
        others: if wrong, its drafter starts from the tokens since, losslessly)."""
        if self.model_drafter is None:
            return False
        return self.gate is None or not self.gate.losing(len(self._rows) + 1)

    def target_hidden(self, hidden_states: Any) -> Any:
        """What the drafter model reads of a forward's `hidden_states` (there is one)."""
        assert self.model_drafter is not None
        return self.model_drafter.target_hidden(hidden_states)

    def rests(self, rows: Sequence[DraftingRow]) -> bool:
        """Whether no row can draft this step, known without the tokens in flight: every row
        that could is resting (policy.py). Then the batch launches a plain step, double-buffered,
        and each resting row's rest counts down; else nothing changes and `drafts()` follows."""
        if self.model_drafter is not None:
            return False  # its rows follow every forward's tokens and hidden states
        resting: list[DraftLength] = []
        for row in rows:
            if not row.can_draft or row.tokens_left <= 1:
                continue
            state = self._rows.get(row.key)
            if row.constrained or state is None or not state.length.resting:
                return False
            resting.append(state.length)
        for length in resting:
            length.rest()
        self.counts.forwards += 1
        return True

    def speculates(self, rows: Sequence[DraftingRow]) -> bool:
        """Whether this step verifies (else the batch launches a plain step, double-buffered):
        not when every row that could draft rests (`rests`), nor when the step gate expects the
        rows' hoped drafts not to pay for a verify step of this batch (step_cost.py). A plain step
        costs a drafter model its rows' states (they cannot follow a forward without hidden
        states): they start over when the batch verifies again, from the tokens since (a row's
        first decode step verifies: its drafter starts over the prompt)."""
        if self.gate is None:
            return not self.rests(rows)
        if self._quiet.left > 0 and self._quiet_step(rows):
            return False
        if self._quiet.ran:
            self._end_quiet()
        if self.rests(rows):
            return False
        if self._trial_accepted:
            # A trial that paid one accepted draft per row or more (the batch's tokens per
            # forward at least doubled) is followed by another.
            if self._trial_accepted >= len(rows):
                self.gate.reward(len(rows))
            self._trial_accepted = 0
        offers: list[RowDrafts] = []
        certain = False
        observed, watched = self.shadows, []
        for row in rows:
            room = min(self.max_draft, row.tokens_left - 1)
            if room <= 0 or not row.can_draft:
                offers.append(RowDrafts(0, 0.0))
                continue
            if self.shadows and not row.constrained:
                shadow = self._state(row).shadow
                self._look(row)
                observed = observed and shadow.observed
                if shadow.watched:
                    watched.append(row)
            # A new row's drafter starts over its prompt only at its first step, which then
            # verifies, unless plain steps are winning at this batch size (drafting did not pay
            # lately: its start would cost a verify step for drafts that are unlikely to).
            starts = self._starts_drafter(row) and not self.gate.losing(len(rows))
            certain = certain or row.constrained or starts
            offers.append(self._offer(row, room))
        if self.gate.verifies(offers, self.max_draft + 1, certain=certain, observed=observed):
            return True
        for row in rows:
            state = self._rows.get(row.key)
            if state is not None and state.length.resting:
                state.length.rest()
            if self.model_drafter is not None and self.model_drafter.ready(row):
                self.model_drafter.forget(row)
        self.counts.forwards += 1
        if not certain and not self.gate.trial:
            rested = self._rested_offers(rows)
            steps = self.gate.quiet(rested, self.max_draft + 1)
            if steps > 0:
                hopes = {row.key: offer.hope for row, offer in zip(rows, rested, strict=True)}
                headroom = self.gate.headroom(rested, self.max_draft + 1)
                self._quiet.begin(steps, bucket(len(rows)), hopes, headroom)
                self._watched = watched
        return False

    def _quiet_step(self, rows: Sequence[DraftingRow]) -> bool:
        """Whether this step is one of the quiet steps (then it is plain, and counted so). Rows
        that joined are valued (and watched, where rows are); a constrained one, or any with a
        drafter model (its first step verifies), or a rise past the headroom: the gate is asked
        now instead."""
        assert self.gate is not None
        keys = tuple(row.key for row in rows)
        joined = self._quiet.joined(keys, bucket(len(rows)))
        if joined is None:
            return False
        if joined:
            new = set(joined)
            for row in rows:
                if row.key not in new:
                    continue
                if row.constrained or self.model_drafter is not None:
                    self._quiet.stop()
                    return False
                self._quiet.hope(row.key, self._hope(row))
                if self.shadows and row.can_draft:
                    self._watched.append(row)
            if self._quiet.left <= 0:
                return False
        self._quiet.runs()
        self.gate.plain_step(len(rows))
        self.counts.forwards += 1
        if self._watched:
            self._watch()
        return True

    @property
    def shadows(self) -> bool:
        """Whether rows' rates are learnt on plain steps too (shadow.py): where lookup is the only
        drafter. A drafter model's drafts cannot be scored without its forwards, so with one the
        gate still probes."""
        return self.lookup and self.model_drafter is None

    def _look(self, row: DraftingRow) -> tuple[int, int] | None:
        """Score the row's shadow draft and draft again when a look is due (every few tokens);
        the draft scored, if any."""
        state = self._state(row)
        shadow = state.shadow
        prompt, generated = row.context_tokens
        if not shadow.due(len(prompt) + len(generated)):
            return None
        self._feed(row, state, ())
        return shadow.look(state.lookup, state.length)

    def _watch(self) -> None:
        """The watched rows' looks on a quiet step (Shadow.watched: a look every few tokens
        costs a few microseconds a row, asking the gate tens): each look moves the row's hope."""
        for row in self._watched:
            state = self._rows.get(row.key)
            if state is not None and state.shadow.watched and self._look(row) is not None:
                self._quiet.hope(row.key, self._hope(row))

    def _hope(self, row: DraftingRow) -> float:
        """The row's expected accepted drafts once its rest is over, all it would draft."""
        return self._rested_offer(row).hope

    def _rested_offers(self, rows: Sequence[DraftingRow]) -> list[RowDrafts]:
        """What each row will offer once its rest is over (StepGate.quiet): between verifies
        nothing else changes what a row hopes (its rates move at verifies, its hit rates when
        lookup is asked, its drafter model's state only at a verify)."""
        return [self._rested_offer(row) for row in rows]

    def _rested_offer(self, row: DraftingRow) -> RowDrafts:
        room = min(self.max_draft, row.tokens_left - 1)
        if room <= 0 or not row.can_draft:
            return RowDrafts(0, 0.0)
        state = self._state(row)
        drafter = self.model_drafter
        if drafter is None or drafter.ready(row):
            return state.length.hoped(room, rested=True)
        if self.lookup:
            return state.length.hoped(room, lookup_only=True, rested=True)
        return RowDrafts(0, 0.0)

    def _end_quiet(self) -> None:
        """The quiet steps' rests count for the rows that were in them."""
        keys, ran = self._quiet.end()
        for key in keys:
            state = self._rows.get(key)
            if state is not None:
                state.length.rest(ran)

    def _offer(self, row: DraftingRow, room: int) -> RowDrafts:
        """What the row hopes to draft this step. A row whose drafter model holds no state for
        it (it has not followed a forward since a plain step) cannot have the drafter's drafts
        this step, only lookup's (auto): the verify would be one position wide for it, a step
        that costs more than a plain one and gives the same token while its drafter follows.
        Hoped for all the same, a won verify after a plain step was one position wide: on the
        DFlash fixture, one row, greedy, 89 of 125 won verifies (issue 37.1). It drafts again
        after a trial (a drafter model's probe lasts two steps) or a verify that lookup's
        drafts win."""
        length = self._state(row).length
        drafter = self.model_drafter
        if drafter is None or drafter.ready(row):
            return length.hoped(room)
        return length.hoped(room, lookup_only=True) if self.lookup else RowDrafts(0, 0.0)

    def _starts_drafter(self, row: DraftingRow) -> bool:
        """Whether this is the row's first decode step with a drafter model that has no state
        for it yet: its drafter starts over the prompt's hidden states only at this step, so
        the step verifies (a later start has only the tokens since)."""
        drafter = self.model_drafter
        return drafter is not None and len(row.context_tokens[1]) == 1 and not drafter.ready(row)

    def relative_costs(self, rows: int) -> list[float] | None:
        """Each verify width's measured cost as a share of width 1's for `rows` rows (None: not
        measured yet: the prior `position_cost`)."""
        return self.gate.costs.relative(rows, self.max_draft + 1) if self.gate is not None else None

    def drafts(self, rows: Sequence[DraftingRow], pending: Sequence[Sequence[int]]) -> list[list[int]]:
        """Each row's drafts for this step (all empty: a plain step)."""
        proposals: list[list[int]] = []
        offers: list[RowDrafts] = []
        costs = self.relative_costs(len(rows))
        # Until a wide verify is measured at this batch size its widths are not chosen by the
        # prior position cost (which at 16 rows allows none: they would never be measured) but
        # held to one width (a new row's draft length + 1), so three steps measure it; so is a
        # trial step's (a probe's), whose drafts are there to measure the rows' rates again
        # (weighed by a rate learnt where nothing was accepted, none would ever be verified).
        gate = self.gate
        trial = gate is not None and (gate.trial or not gate.costs.explored(len(rows)))
        trial_width = self.trial_width

        def width_for(offers: Sequence[RowDrafts]) -> int:
            if trial:
                return min(trial_width, 1 + max((offer.available for offer in offers), default=0))
            return verify_width(
                offers, position_cost=self.position_cost, max_width=self.max_draft + 1, costs=costs
            )

        wanting: list[int] = []  # rows asking the drafter model, and how many
        counts: list[int] = []
        for index, (row, waiting) in enumerate(zip(rows, pending, strict=True)):
            drafts, rate = self._row_drafts(row, waiting)
            if isinstance(drafts, int):
                wanting.append(index)
                counts.append(drafts)
                drafts = []
            proposals.append(drafts)
            offers.append(RowDrafts(len(drafts), rate))
        if wanting:
            assert self.model_drafter is not None
            rates = [self._rows[rows[i].key].length.rate for i in wanting]
            # The widest step the drafter's rows could make worth it, if it drafted all they ask:
            # when that is the plain step, the drafter is not run (its drafts would be cut).
            hoped = list(offers)
            for index, count, rate in zip(wanting, counts, rates, strict=True):
                hoped[index] = RowDrafts(count, rate)
            width = width_for(hoped)
            if width > 1:
                asked = [min(count, width - 1) for count in counts]
                drafted = self.model_drafter.propose([rows[i] for i in wanting], asked)
                for index, drafts, rate in zip(wanting, drafted, rates, strict=True):
                    proposals[index] = drafts
                    offers[index] = RowDrafts(len(drafts), rate)
        width = width_for(offers)
        return [drafts[: width - 1] for drafts in proposals]

    def follow(
        self,
        rows: Sequence[DraftingRow],
        drafts: Sequence[Sequence[int]],
        tokens: Sequence[Sequence[int]],
        hidden: object,
    ) -> None:
        """A forward's outcome for the drafter model: each row's drafts, the tokens it took and
        the target's last hidden states."""
        if self.model_drafter is None:
            return
        # Rows that never draft (logprobs, custom logits processors) need no drafter state.
        wanted = [i for i, row in enumerate(rows) if row.can_draft]
        self.model_drafter.follow(
            [(i, rows[i], drafts[i], tokens[i]) for i in wanted],
            hidden,
        )

    def _row_drafts(self, row: DraftingRow, pending: Sequence[int]) -> tuple[list[int] | int, float]:
        """The row's drafts and their expected acceptance rate; an int: that many drafts are
        the drafter model's to propose."""
        # Room: the token after the drafts counts too (the pending ones are counted already).
        room = min(self.max_draft, row.tokens_left - 1)
        if room <= 0 or not row.can_draft:
            return [], 0.0
        state = self._state(row)
        forced = row.forced_tokens(pending)[:room]
        state.source = "grammar" if forced else "lookup"
        if forced:
            return forced, 1.0
        allowed = min(state.length.allowed(), room)
        if allowed <= 0:
            return [], 0.0
        if self.lookup:
            self._feed(row, state, pending)
            proposal = state.lookup.propose(allowed)
            if proposal:
                state.length.found()
                return proposal, state.length.rate
            if self.model_drafter is None:
                state.length.found_nothing()
            else:
                state.length.lookup_missed()
        # A row's drafter model is ready once it has followed one forward (its first decode step).
        if self.model_drafter is not None and self.model_drafter.ready(row):
            state.source = "draft"
            return allowed, state.length.rate
        return [], 0.0

    @staticmethod
    def _feed(row: DraftingRow, state: _RowState, pending: Sequence[int]) -> None:
        """The lookup index takes the row's tokens it has not seen."""
        prompt, generated = row.context_tokens
        fed, before, after = state.fed, len(prompt), len(prompt) + len(generated)
        known = after + len(pending)
        if fed >= known:
            return
        if fed < before:
            state.lookup.extend([*prompt[fed:], *generated, *pending])
        elif fed <= after:
            state.lookup.extend([*generated[fed - before :], *pending])
        else:
            state.lookup.extend(pending[fed - after :])
        state.fed = known

    def start_rate(self, greedy: bool) -> float | None:
        """A new row's acceptance rate: the recent rows' that sample as it does, greedy or not
        (None: the prior, none verified yet). One rate for all rows carried a workload's rate into
        the next: greedy rows that copy, after rows sampling text with nothing to copy, started
        at those rows' ~0 and were not verified for thousands of steps (MTP `auto` at 16 streams:
        36 verify forwards in 3,090, where alone it verified 541 in 784 at 1.07x of `off`), and
        sampling rows after greedy ones started near 1 and bought verifies that lost (issue
        37.1)."""
        return self._recent_rates.get(greedy)

    def _state(self, row: DraftingRow) -> _RowState:
        state = self._rows.get(row.key)
        if state is None:
            state = _RowState(PromptLookup(), DraftLength(self.max_draft, rate=self.start_rate(row.greedy)))
            self._rows[row.key] = state
        return state

    def record(self, row: DraftingRow, drafted: int, accepted: int) -> None:
        """A row's verify: `drafted` drafts, `accepted` of them kept."""
        state = self._rows.get(row.key)
        source = state.source if state is not None else "lookup"
        self.counts.drafted[source] += drafted
        self.counts.accepted[source] += accepted
        self.counts.drafting_rows[source] += 1
        if state is not None and drafted and source != "grammar":
            state.length.record(drafted, accepted)
            if self.gate is not None and self.gate.trial:
                self._trial_accepted += accepted
            # Only verifies teach the recent rows' rate (a new row's start): shadow drafts are
            # scored over a row's first tokens too, where a copy has not begun (a random model's
            # greedy text before it loops), and new rows starting from those scores waited
            # tens of steps for their own (issue 37.1).
            rate = accepted / drafted
            recent = self._recent_rates.get(row.greedy)
            self._recent_rates[row.greedy] = (
                rate if recent is None else recent + _RECENT_WEIGHT * (rate - recent)
            )

    def forget(self, row: DraftingRow) -> None:
        self._rows.pop(row.key, None)
        self._watched = [watched for watched in self._watched if watched.key != row.key]
        if self.model_drafter is not None:
            self.model_drafter.forget(row)

    def take_counts(self) -> SpeculationCounts:
        counts, self.counts = self.counts, SpeculationCounts()
        return counts

"""Each decoding row's drafts for a step: grammar fast-forward first, then prompt lookup.

The batch (loop/batch.py) asks `Speculator.drafts()` once per step for every row, with the
tokens the row has that are not accepted yet (`pending`: the previous step's, whose values the
batch knows). A constrained row drafts the tokens its grammar forces (field names, braces, a
forced call's opening: accepted unless the model writes the same text with other tokens); any
other row the continuation of its longest recent n-gram match (lookup.py), as many as its
`DraftLength` allows. The step's width then comes from `verify_width` (policy.py), and every row's
drafts are cut to it. Rows that cannot verify drafts (logprobs, custom logits processors) draft
nothing and run as in a plain step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from vlmserve.engine.speculation.lookup import PromptLookup
from vlmserve.engine.speculation.policy import DraftLength, RowDrafts, verify_width

__all__ = ["DraftingRow", "SpeculationCounts", "Speculator"]


class DraftingRow(Protocol):
    @property
    def can_draft(self) -> bool: ...

    @property
    def context_tokens(self) -> tuple[Sequence[int], Sequence[int]]: ...

    @property
    def tokens_left(self) -> int: ...

    def forced_tokens(self, pending: Sequence[int]) -> list[int]: ...


@dataclass
class SpeculationCounts:
    """Totals since the last read (metrics): drafts verified and accepted, rows that had drafts
    verified (each takes its accepted drafts + 1 token), verify forwards, all forwards."""

    drafted: int = 0
    accepted: int = 0
    drafting_rows: int = 0
    verifies: int = 0
    forwards: int = 0


@dataclass
class _RowState:
    lookup: PromptLookup
    length: DraftLength
    fed: int = 0
    # The kind of the drafts proposed this step: forced ones do not train the length.
    forced: bool = False


@dataclass
class Speculator:
    max_draft: int = 8
    position_cost: float = 0.065
    lookup: bool = True
    counts: SpeculationCounts = field(default_factory=SpeculationCounts)
    _rows: dict[int, _RowState] = field(default_factory=dict)

    def drafts(self, rows: Sequence[DraftingRow], pending: Sequence[Sequence[int]]) -> list[list[int]]:
        """Each row's drafts for this step (all empty: a plain step)."""
        proposals: list[list[int]] = []
        offers: list[RowDrafts] = []
        for row, waiting in zip(rows, pending, strict=True):
            drafts, rate = self._row_drafts(row, waiting)
            proposals.append(drafts)
            offers.append(RowDrafts(len(drafts), rate))
        width = verify_width(offers, position_cost=self.position_cost, max_width=self.max_draft + 1)
        return [drafts[: width - 1] for drafts in proposals]

    def _row_drafts(self, row: DraftingRow, pending: Sequence[int]) -> tuple[list[int], float]:
        # Room: the pending tokens and the token after the drafts count too.
        room = min(self.max_draft, row.tokens_left - len(pending) - 1)
        if room <= 0 or not row.can_draft:
            return [], 0.0
        state = self._state(row)
        forced = row.forced_tokens(pending)[:room]
        state.forced = bool(forced)
        if forced:
            return forced, 1.0
        if not self.lookup:
            return [], 0.0
        prompt, generated = row.context_tokens
        known = len(prompt) + len(generated) + len(pending)
        if state.fed < known:
            history = [*prompt, *generated, *pending] if state.fed < len(prompt) else [*generated, *pending]
            skip = state.fed if state.fed < len(prompt) else state.fed - len(prompt)
            state.lookup.extend(history[skip:])
            state.fed = known
        allowed = state.length.allowed()
        if allowed <= 0:
            return [], 0.0
        return state.lookup.propose(min(allowed, room)), state.length.rate

    def _state(self, row: DraftingRow) -> _RowState:
        state = self._rows.get(id(row))
        if state is None:
            state = _RowState(PromptLookup(), DraftLength(self.max_draft))
            self._rows[id(row)] = state
        return state

    def record(self, row: DraftingRow, drafted: int, accepted: int) -> None:
        """A row's verify: `drafted` drafts, `accepted` of them kept."""
        self.counts.drafted += drafted
        self.counts.accepted += accepted
        self.counts.drafting_rows += 1
        state = self._rows.get(id(row))
        if state is not None and drafted and not state.forced:
            state.length.record(drafted, accepted)

    def forget(self, row: DraftingRow) -> None:
        self._rows.pop(id(row), None)

    def take_counts(self) -> SpeculationCounts:
        counts, self.counts = self.counts, SpeculationCounts()
        return counts

"""Shadow drafts: a row's prompt-lookup acceptance learnt on plain steps, without verifying. Pure.

While the step gate runs plain steps (step_cost.py) it cannot see whether lookup's drafts would
now be accepted, so it verified now and then to find out (probes: each a verify step, 2-10
plain steps' time on the fixtures' ~1 ms steps, up to 1 % of the steps with nothing to copy),
and a row that started copying after a long stretch of nothing was noticed only at the next
probe (up to 512-4,096 steps late). Instead, when the gate is asked at a plain step, lookup
drafts for the row from what the row has taken (the token in flight is not read, so the plain
step stays double-buffered), and once the row has taken the tokens those drafts stand for they
are scored as a verify would have scored them: accepted up to the first that differs from the
token the row took. For lookup's deterministic drafts that is the acceptance rule itself
(acceptance.py: a draft is accepted iff the token the row draws equals it, and a plain step
draws the token a verify would), so the shadow rate is the rate verifies would measure, for one
n-gram lookup and the index's feed per row every few tokens. Lossless: it moves the rows' rates
and draft lengths, which decide whether a step verifies, never which tokens a row takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vlmserve.engine.speculation.lookup import PromptLookup
from vlmserve.engine.speculation.policy import DraftLength

__all__ = ["SHADOW_EVERY", "Shadow", "ShadowDraft", "score_shadow"]

# The fewest tokens a row takes between two looks: the gate is asked every step while the rows
# change or explore, and a look feeds the index and scores, so it is spread out.
SHADOW_EVERY = 4
# Looks (drafts scored, or lookup finding nothing) before a row's rates count as observed: the
# step gate then skips probes whose drafts the rates say lose (StepGate.verifies).
OBSERVED_AFTER = 2


@dataclass(frozen=True, slots=True)
class ShadowDraft:
    """What lookup would have drafted: `tokens`, standing for history positions `start`...."""

    start: int
    tokens: tuple[int, ...]


def score_shadow(draft: ShadowDraft, taken: Sequence[int]) -> tuple[int, int] | None:
    """(drafted, accepted) as a verify would have counted them, given the tokens the row took
    from `draft.start` on (`taken`); None while the tokens that decide it are still to come."""
    for index, (drafted, token) in enumerate(zip(draft.tokens, taken, strict=False)):
        if drafted != token:
            return len(draft.tokens), index
    if len(taken) < len(draft.tokens):
        return None
    return len(draft.tokens), len(draft.tokens)


@dataclass(slots=True)
class Shadow:
    """One row's shadow: the draft waiting for its tokens, where the row's history stood at the
    last look, how many looks told something (a draft scored, or nothing to draft) and the last
    scored draft's (drafted, accepted)."""

    draft: ShadowDraft | None = None
    seen: int = 0
    looks: int = 0
    scored: tuple[int, int] = (0, 0)

    @property
    def observed(self) -> bool:
        return self.looks >= OBSERVED_AFTER

    @property
    def watched(self) -> bool:
        """Whether the row is to be looked at every few tokens, also between the gate's asks
        (every 16 steps while plain wins): until it is observed, and while its shadow drafts
        are accepted (it may be starting to copy: each look moves its rate 0.3 of the way, so
        at one look in 16 steps a copy was noticed only tens of steps late)."""
        return not self.observed or self.scored[1] > 0

    def due(self, known: int) -> bool:
        """Whether a look is due now that the row has taken tokens up to history length `known`."""
        return known - self.seen >= SHADOW_EVERY or (self.seen == 0 and known > 0)

    def look(self, lookup: PromptLookup, length: DraftLength) -> tuple[int, int] | None:
        """`lookup` holds the tokens the row has taken: score the draft waiting, if they decide
        it, and draft again (`length.length` tokens: what a verify would draft) when none waits.
        `length` learns both (its rate and length as at a verify, its hit rate). Returns the
        draft scored (drafted, accepted), if any."""
        known = len(lookup)
        self.seen = known
        scored = None
        if self.draft is not None:
            taken = lookup.window(self.draft.start, len(self.draft.tokens))
            scored = score_shadow(self.draft, taken)
            if scored is None:
                return None
            self.draft = None
            length.observed(*scored)
            self.looks += 1
            self.scored = scored
        proposal = lookup.propose(max(1, length.length))
        length.observed_lookup(found=bool(proposal))
        if proposal:
            self.draft = ShadowDraft(known, tuple(proposal))
        elif scored is None:
            self.looks += 1  # nothing to draft is something learnt too
        return scored

"""Shadow drafts (speculation/shadow.py): lookup's acceptance learnt on plain steps without
verifying, and the step gate's probes skipped where those rates say the drafts lose (issue 37.1).
Pure: the rows are scripted, the step costs fed as the verifier's clock would."""

from __future__ import annotations

import pytest

from tests.engine._drafting_row import ScriptedRow
from vlmserve.engine.speculation.drafter import Speculator
from vlmserve.engine.speculation.lookup import PromptLookup
from vlmserve.engine.speculation.policy import DraftLength, RowDrafts
from vlmserve.engine.speculation.shadow import Shadow, ShadowDraft, score_shadow
from vlmserve.engine.speculation.step_cost import StepCosts, StepGate


@pytest.mark.parametrize(
    ("drafted", "taken", "expected"),
    [
        ((5, 6, 7), [5, 6, 7], (3, 3)),  # all taken as drafted
        ((5, 6, 7), [5, 6, 7, 8], (3, 3)),  # later tokens do not matter
        ((5, 6, 7), [5, 9], (3, 1)),  # the second differs: one accepted, as a verify counts
        ((5, 6, 7), [9], (3, 0)),
        ((5, 6, 7), [5, 6], None),  # the third is still to come
        ((5, 6, 7), [], None),
        ((5,), [5], (1, 1)),
    ],
)
def test_a_shadow_draft_is_scored_as_a_verify_would_score_it(
    drafted: tuple[int, ...], taken: list[int], expected: tuple[int, int] | None
) -> None:
    assert score_shadow(ShadowDraft(10, drafted), taken) == expected


def test_a_look_scores_the_waiting_draft_once_its_tokens_are_taken_and_drafts_again() -> None:
    lookup = PromptLookup([1, 2, 3, 4, 5, 1, 2])  # "1 2" recurs: lookup drafts 3 4 5 1
    length = DraftLength(8, initial=4, rate=0.0)
    shadow = Shadow()
    assert shadow.due(len(lookup))
    assert shadow.look(lookup, length) is None  # drafted, nothing to score yet
    assert shadow.draft == ShadowDraft(7, (3, 4, 5, 1))
    assert length.hit == pytest.approx(1.0) and not shadow.observed
    lookup.extend([3, 4])
    assert not shadow.due(len(lookup))  # two tokens since: not yet
    assert shadow.look(lookup, length) is None  # asked anyway: undecided, still waiting
    lookup.extend([5, 1])
    assert shadow.look(lookup, length) == (4, 4)
    assert length.rate == pytest.approx(0.3) and length.length == 5  # as a verify moves them
    assert shadow.draft is not None and shadow.draft.start == 11  # drafted again at once
    lookup.extend([9, 9, 9, 9, 9])  # the copy ends: the draft's first token differs
    assert shadow.look(lookup, length) == (5, 0)
    assert length.rate == pytest.approx(0.21)
    assert length.length == 1 and not length.resting  # no rest: nothing was verified


def test_lookup_finding_nothing_is_a_look_that_lowers_the_hit_rate() -> None:
    lookup = PromptLookup(range(10))
    length = DraftLength(8)
    shadow = Shadow()
    for step in range(3):
        assert shadow.look(lookup, length) is None
        lookup.extend(range(100 + 10 * step, 110 + 10 * step))
    assert shadow.observed and shadow.draft is None
    assert length.hit == pytest.approx(0.343) and length.rate == pytest.approx(0.6)


def _costs(rows: int, plain: float, verify: dict[int, float]) -> StepCosts:
    costs = StepCosts()
    for _ in range(3):
        costs.observe(rows, 0, plain)
        for width, seconds in verify.items():
            costs.observe(rows, width, seconds)
    return costs


# Lookup found nothing lately (chance 0.1), and rows whose shadow drafts are never accepted.
NOTHING, REJECTED = RowDrafts(4, 0.6, 0.1), RowDrafts(4, 0.0)


@pytest.mark.parametrize(
    ("offer", "verify", "observed", "expected"),
    [
        # Not observed: probes every 16, 32, 64 plain steps as before.
        (NOTHING, {1: 0.105, 5: 0.108}, False, [16, 48, 112]),
        # Observed, and a verify costs a plain step: the drafts would pay at a verify 25 %
        # cheaper than measured, so the probes stay (they re-measure the cost).
        (NOTHING, {1: 0.105, 5: 0.108}, True, [16, 48, 112]),
        # Observed, a verify dear (the fixtures' CPU): no probe at all ...
        (NOTHING, {1: 0.12, 5: 0.2}, True, []),
        (REJECTED, {1: 0.12, 5: 0.2}, True, []),
        # (Drafts never accepted, but a verify about as cheap as a plain step: still probed,
        # each probe costs little more than a plain step.)
        (REJECTED, {1: 0.105, 5: 0.108}, True, [16, 48, 112]),
        # ... where unobserved rows are probed every 100 steps (1 % of their time).
        (NOTHING, {1: 0.12, 5: 0.2}, False, [100, 200, 300]),
    ],
)
def test_rows_observed_on_plain_steps_are_probed_only_where_their_drafts_could_pay(
    offer: RowDrafts, verify: dict[int, float], observed: bool, expected: list[int]
) -> None:
    gate = StepGate(_costs(1, 0.1, verify))
    verified = [step for step in range(1, 400) if gate.verifies([offer], 9, observed=observed)]
    assert verified[:3] == expected


def _decode(speculator: Speculator, row: ScriptedRow) -> list[tuple[int, int]]:
    """Decodes the row to its script's end; each verify step's (position, accepted drafts)."""
    verifies = []
    while row.tokens_left > 0:
        if not speculator.speculates([row]):
            row.generated.append(row.script[len(row.generated)])
            continue
        (drafts,) = speculator.drafts([row], [[]])
        at = len(row.generated)
        accepted = 0
        while accepted < len(drafts) and row.script[at + accepted] == drafts[accepted]:
            accepted += 1
        if drafts:
            speculator.record(row, len(drafts), accepted)
        verifies.append((at, accepted))
        row.generated.extend(row.script[at : at + accepted + 1])
    return verifies


def test_nothing_to_copy_runs_plain_without_probes_and_a_copy_after_it_is_noticed_within_tens_of_steps() -> (
    None
):
    # This CPU's fixtures: a verify dear (2-3 plain steps), so only copying pays for one.
    speculator = Speculator(max_draft=8, gate=StepGate(_costs(1, 0.1, {2: 0.2, 5: 0.25, 9: 0.3})))
    passage = list(range(5000, 5200))
    prompt = [*passage, 7, 8]
    # 1,500 tokens with nothing to copy, then the passage copied.
    script = [*range(10_000, 11_500), *passage]
    verifies = _decode(speculator, ScriptedRow(prompt, script))
    during_nothing = [at for at, _ in verifies if at < 1500]
    assert during_nothing == []  # unobserved, a probe every ~150 plain steps (1 % of their time)
    copied = [(at, accepted) for at, accepted in verifies if at >= 1500]
    assert copied and copied[0][0] < 1500 + 40  # noticed without a probe, from the shadow rate
    # Most of the copy came from accepted drafts (the rest: the steps before it was noticed and
    # the token each verify adds).
    assert sum(accepted for _, accepted in copied) >= 120


def test_watched_rows_are_looked_at_every_few_steps_without_asking_the_gate() -> None:
    speculator = Speculator(max_draft=8, gate=StepGate(_costs(1, 0.1, {2: 0.2, 5: 0.25, 9: 0.3})))
    assert speculator.gate is not None
    row = ScriptedRow(list(range(5000, 5020)), list(range(10_000, 10_200)))
    asked: list[int] = []
    decide = speculator.gate.verifies

    def counted(*args: object, **kwargs: bool) -> bool:
        asked.append(len(row.generated))
        return decide(*args, **kwargs)  # type: ignore[arg-type]

    speculator.gate.verifies = counted  # type: ignore[method-assign]
    looked: list[int] = []
    for _ in range(60):
        seen = speculator._rows[row].shadow.seen if row in speculator._rows else 0
        assert not speculator.speculates([row])  # nothing to copy: plain throughout
        if speculator._rows[row].shadow.seen != seen:
            looked.append(len(row.generated))
        row.generated.append(row.script[len(row.generated)])
    # Looked at every four tokens until observed (two looks), then only when the gate is asked
    # (16 quiet steps between).
    assert looked == [1, 5, 18, 35, 52]
    assert asked == [1, 18, 35, 52]

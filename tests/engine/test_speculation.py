"""Speculative decoding's pure parts: prompt lookup, draft lengths, the acceptance rule.

The acceptance rule is checked against the plain sampler on the random fixture's real logits:
greedy takes exactly the argmax path, and seeded sampling gives the same next-token
distributions (chi-square homogeneity over many seeds), whatever the drafts were.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any

import pytest

from tests.engine._drafting_row import LookupRow, ScriptedRow
from vlmserve.engine.sampling import SamplingSettings, TokenSampler
from vlmserve.engine.speculation.acceptance import accept_drafts
from vlmserve.engine.speculation.drafter import Speculator
from vlmserve.engine.speculation.lookup import PromptLookup
from vlmserve.engine.speculation.policy import (
    DraftLength,
    RowDrafts,
    expected_tokens,
    expected_totals,
    verify_width,
)

# -- prompt lookup -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("history", "count", "expected"),
    [
        ([], 4, []),
        ([1, 2, 3, 4], 4, []),  # nothing recurs
        ([1, 2, 3, 9, 1, 2], 3, [3, 9, 1]),  # "1 2" occurred before: what followed it
        ([5, 1, 2, 7, 1, 2, 8, 1, 2], 2, [8, 1]),  # the most recent occurrence wins
        ([3, 1, 2, 7, 4, 1, 2, 8, 3, 1, 2], 2, [7, 4]),  # the longest match wins ("3 1 2")
        ([1, 2, 1, 2], 5, [1, 2, 1, 2, 1]),  # a loop continues periodically
        ([1, 2, 3, 1, 2], 0, []),
        ([7, 7], 3, []),  # a 1-gram does not count (min_ngram 2)
        ([7, 7, 7], 3, [7, 7, 7]),
    ],
)
def test_lookup_proposes_what_followed_the_longest_recent_match(
    history: list[int], count: int, expected: list[int]
) -> None:
    assert PromptLookup(history).propose(count) == expected


def test_lookup_extends_incrementally_like_a_fresh_index() -> None:
    tokens = [4, 8, 15, 16, 23, 42, 4, 8, 15, 99, 16, 23, 4, 8]
    grown = PromptLookup(tokens[:3])
    for token in tokens[3:]:
        grown.extend([token])
        fresh = PromptLookup(tokens[: len(grown)])
        assert grown.propose(3) == fresh.propose(3)
    assert grown.propose(3) == [15, 99, 16]


def _longest_recent_match(
    history: list[int], count: int, min_ngram: int = 2, max_ngram: int = 6
) -> list[int]:
    """Prompt lookup's rule, spelled out: the most recent earlier occurrence (one with a token
    after it) of the longest suffix of `min_ngram`..`max_ngram` tokens, then what followed it,
    periodically past the history's end."""
    size = len(history)
    for n in range(min(max_ngram, size - 1), min_ngram - 1, -1):
        suffix = history[size - n :]
        for end in range(size - 1, n - 1, -1):
            if history[end - n : end] == suffix:
                follows = history[end:]
                return [follows[i % len(follows)] for i in range(count)]
    return []


# Token ids whose bytes (little-endian, four a token) recur inside other tokens' bytes: a search
# of the plain bytes would match across token boundaries.
_TRICKY_IDS = [0, 1, 2, 127, 128, 256, 2**8 + 1, 2**16, 2**16 + 1, 2**21, 2**21 + 1, 2**24, 2**27 + 5]


@pytest.mark.parametrize("seed", range(40))
def test_lookup_proposes_by_the_rule_however_the_history_is_fed(seed: int) -> None:
    """Random histories from a few ids (so n-grams recur) and ids whose bytes overlap, fed in
    random pieces (one token, a step's few, a prompt's many): each proposal is the rule's."""
    rng = random.Random(seed)
    ids = rng.sample(_TRICKY_IDS, 4) if seed % 2 else [rng.randrange(150_000) for _ in range(5)]
    history = [rng.choice(ids) for _ in range(rng.randrange(1, 120))]
    min_ngram = rng.choice([1, 2, 3])
    max_ngram = rng.choice([min_ngram, 4, 6])
    lookup = PromptLookup(min_ngram=min_ngram, max_ngram=max_ngram)
    fed = 0
    while fed < len(history):
        piece = rng.choice([1, 1, 2, 4, 40])
        lookup.extend(history[fed : fed + piece])
        fed = min(len(history), fed + piece)
        assert len(lookup) == fed
        for count in (1, 3, 9):
            expected = _longest_recent_match(history[:fed], count, min_ngram, max_ngram)
            assert lookup.propose(count) == expected


def test_lookup_never_matches_across_token_boundaries() -> None:
    """256 and 1 as plain four-byte ids (00 01 00 00, 01 00 00 00) hold 01 00 00 00 straddling
    a boundary; an id that the history never had before its suffix is never proposed from."""
    history = [256, 1, 256, 1, 7, 1, 0]  # "1 0" never occurred before: nothing to draft
    assert PromptLookup(history).propose(3) == []
    assert PromptLookup([2**21, 5, 2**21, 5], max_ngram=2).propose(2) == [2**21, 5]


@pytest.mark.parametrize("seed", range(6))
def test_a_rows_lookup_holds_its_prompt_its_tokens_and_those_in_flight(seed: int) -> None:
    """Steps take one token or a verify's several, with the previous step's token in flight or
    none: whatever the order, a row's lookup holds each token once, in order (the row copies a
    stretch of its prompt, so lookup always has drafts and the row never rests)."""
    rng = random.Random(seed)
    prompt = rng.sample(range(1000), rng.randrange(10, 40))
    truth = prompt[rng.randrange(5) :] * 20
    row = ScriptedRow(prompt, truth)  # its first token taken
    speculator = Speculator(max_draft=4)
    while len(row.generated) < 150:
        taken = len(row.generated)
        for pending in (truth[taken : taken + rng.choice([0, 1])], truth[taken : taken + 2])[
            : rng.choice([1, 2])
        ]:
            speculator.drafts([row], [pending])
            history = [*row.prompt, *row.generated, *pending]
            assert speculator._rows[row].lookup.window(0, len(history) + 1) == history
        # The tokens in flight are taken, and a verify's accepted drafts after them.
        row.generated.extend(truth[taken : taken + max(len(pending), rng.choice([1, 1, 3, 5]))])


def test_lookup_respects_the_ngram_bounds() -> None:
    assert PromptLookup([7, 7], min_ngram=1, max_ngram=3).propose(2) == [7, 7]
    with pytest.raises(ValueError):
        PromptLookup([], min_ngram=3, max_ngram=2)


# -- draft lengths -------------------------------------------------------------------------


def test_draft_length_grows_on_full_acceptance_and_shrinks_to_what_was_accepted() -> None:
    length = DraftLength(6, initial=2)
    assert length.allowed() == 2
    length.record(2, 2)
    assert length.allowed() == 3
    length.record(3, 3)
    length.record(4, 4)
    length.record(5, 5)
    length.record(6, 6)
    assert length.allowed() == 6  # capped
    length.record(6, 1)
    assert length.allowed() == 2


def test_draft_length_backs_off_after_misses_and_doubles_the_cooldown() -> None:
    length = DraftLength(4, initial=2)
    pauses = []
    for _ in range(3):
        length.record(1, 0)
        length.record(1, 0)
        paused = 0
        while length.allowed() == 0:
            paused += 1
        pauses.append(paused)
    assert pauses == [1, 2, 4]
    length.record(1, 1)  # a hit resets the backoff
    length.record(1, 0)
    length.record(1, 0)
    assert length.allowed() == 0
    assert length.allowed() == 1


def test_lookups_that_find_nothing_rest_the_row_for_doubling_spells_up_to_a_bound() -> None:
    length = DraftLength(4, initial=2)
    rests = []
    for _ in range(6):
        for _ in range(4):
            assert not length.resting
            length.found_nothing()
        spell = 0
        while length.resting:
            length.rest()
            spell += 1
        rests.append(spell)
    assert rests == [1, 2, 4, 8, 8, 8]
    for _ in range(3):
        length.found_nothing()
    length.found()  # a proposal resets the count and the spell
    for _ in range(4):
        length.found_nothing()
    assert length.resting and length.allowed() == 0 and length.allowed() == 2


@pytest.mark.parametrize(
    ("rows", "rests_at"),
    [
        # Rows whose lookups find nothing rest together: steps 5 (1 step), 10-11 (2) ...
        ([LookupRow(0), LookupRow(10_000)], [5, 10, 11, 16, 17, 18, 19]),
        # A constrained row may be forced drafts at any step: no plain step is chosen blind.
        ([LookupRow(0), LookupRow(10_000, constrained=True)], []),
        # A row that never drafts (logprobs) does not hold the others back.
        ([LookupRow(0), LookupRow(10_000, can_draft=False)], [5, 10, 11, 16, 17, 18, 19]),
        ([LookupRow(0, can_draft=False)], list(range(1, 21))),
    ],
)
def test_a_step_is_plain_when_every_row_that_could_draft_rests(
    rows: list[LookupRow], rests_at: list[int]
) -> None:
    speculator = Speculator(max_draft=4)
    plain = []
    for step in range(1, 21):
        if speculator.rests(rows):
            plain.append(step)
        else:
            speculator.drafts(rows, [[] for _ in rows])
        for row in rows:
            row.generated.append(row.generated[-1] + 1)
    assert plain == rests_at
    assert speculator.counts.forwards == len(rests_at)


@pytest.mark.parametrize(
    ("rate", "drafts", "expected"),
    [(0.0, 4, 0.0), (1.0, 4, 4.0), (0.5, 1, 0.5), (0.5, 2, 0.75), (0.9, 0, 0.0)],
)
def test_expected_tokens(rate: float, drafts: int, expected: float) -> None:
    assert expected_tokens(rate, drafts) == pytest.approx(expected)


@pytest.mark.parametrize(
    "rows",
    [
        [],
        [RowDrafts(3, 0.5)],
        [RowDrafts(3, 0.5), RowDrafts(8, 0.9, chance=0.4), RowDrafts(0, 0.7), RowDrafts(2, 1.0)],
        [RowDrafts(5, 0.0), RowDrafts(5, 0.3, chance=0.0), RowDrafts(9, 0.75)],
    ],
)
def test_expected_totals_sum_each_rows_expected_drafts_at_every_width(rows: list[RowDrafts]) -> None:
    totals = expected_totals(rows, 8)
    assert totals == pytest.approx([sum(row.expected(k) for row in rows) for k in range(9)])


@pytest.mark.parametrize(
    ("rows", "position_cost", "expected"),
    [
        ([], 0.05, 1),
        ([RowDrafts(0, 0.9)], 0.05, 1),  # nothing to verify
        ([RowDrafts(5, 1.0)], 0.05, 6),  # forced drafts: all of them
        ([RowDrafts(5, 0.9)], 0.05, 6),
        ([RowDrafts(5, 0.1)], 0.2, 1),  # a poor guess is not worth a dearer forward
        ([RowDrafts(5, 0.9)] + [RowDrafts(0, 0.6)] * 7, 0.065, 1),  # 8 rows pay for one's width
        ([RowDrafts(5, 0.9)] * 8, 0.065, 4),
        ([RowDrafts(5, 0.9)] * 8, 0.005, 6),  # memory-bound (Apple silicon): all of them
        ([RowDrafts(9, 1.0)], 0.0, 4),  # max_width caps
    ],
)
def test_verify_width_maximises_expected_tokens_per_cost(
    rows: list[RowDrafts], position_cost: float, expected: int
) -> None:
    max_width = 4 if position_cost == 0.0 else 8
    assert verify_width(rows, position_cost=position_cost, max_width=max_width) == expected


# -- the acceptance rule on the random fixture's logits ------------------------------------


@pytest.fixture(scope="module")
def fixture_logits() -> tuple[Any, Any, list[int]]:
    """(model config, logits [positions, vocab] after a prompt and two drafts, the drafts)."""
    import mlx.core as mx
    from mlx_vlm.utils import load

    from tests._fixture_models import RANDOM_MODEL_PATH

    model, _ = load(str(RANDOM_MODEL_PATH))
    prompt = [8176, 17, 230, 1000, 57, 4000, 91]

    def forward(ids: list[int]) -> Any:
        positions = mx.broadcast_to(mx.arange(len(ids))[None, None], (3, 1, len(ids)))
        return model.language_model(mx.array([ids]), position_ids=positions).logits[0]

    first = forward(prompt)[-1]
    top = mx.argsort(-first)[:2].tolist()
    # Draft the second most likely token (rejected often enough to exercise the residual),
    # then anything.
    drafts = [int(top[1]), 123]
    logits = forward(prompt + drafts)[-3:]
    mx.eval(logits)
    return model.config, logits, drafts


def _sampler(config: Any, seed: int, temperature: float = 1.0, top_k: int | None = 6) -> TokenSampler:
    settings = SamplingSettings(max_tokens=8, temperature=temperature, top_k=top_k, seed=seed)
    return TokenSampler(settings, config)


def test_greedy_accepts_exactly_the_argmax_path(fixture_logits: tuple[Any, Any, list[int]]) -> None:
    import mlx.core as mx

    config, logits, _ = fixture_logits
    argmax = [int(mx.argmax(logits[i]).item()) for i in range(3)]
    sampler = _sampler(config, 0, temperature=0.0)
    rows = lambda i: logits[i : i + 1]  # noqa: E731
    assert accept_drafts(rows, [argmax[0] + 1, 5], sampler) == [argmax[0]]
    assert accept_drafts(rows, [], sampler) == [argmax[0]]
    # position 1's logits come after the fixture's drafts, so argmax[1] follows drafts[0] only
    assert accept_drafts(rows, [argmax[0], argmax[1] + 1], sampler)[0] == argmax[0]


def _chi_square_homogeneity(a: Counter[int], b: Counter[int]) -> tuple[float, int]:
    """(statistic, degrees of freedom) for two samples' category counts (rare ones pooled)."""
    total_a, total_b = sum(a.values()), sum(b.values())
    categories = sorted(set(a) | set(b))
    common = [c for c in categories if a[c] + b[c] >= 10]
    pooled = (
        sum(a[c] for c in categories if c not in common),
        sum(b[c] for c in categories if c not in common),
    )
    cells = [(a[c], b[c]) for c in common] + ([pooled] if sum(pooled) else [])
    statistic = 0.0
    for count_a, count_b in cells:
        both = count_a + count_b
        for count, total in ((count_a, total_a), (count_b, total_b)):
            expected = both * total / (total_a + total_b)
            statistic += (count - expected) ** 2 / expected
    return statistic, len(cells) - 1


def _chi_square_critical(dof: int, z: float = 3.09) -> float:
    """Wilson-Hilferty: the chi-square quantile at the normal quantile z (3.09: p = 0.001)."""
    k = max(dof, 1)
    return k * (1 - 2 / (9 * k) + z * math.sqrt(2 / (9 * k))) ** 3


@pytest.mark.slow
@pytest.mark.parametrize(("temperature", "top_k"), [(1.0, 6), (0.7, None)])
def test_seeded_sampling_keeps_the_target_distribution(
    fixture_logits: tuple[Any, Any, list[int]], temperature: float, top_k: int | None
) -> None:
    """Over many seeds: the first token drawn with drafts has the plain sampler's distribution,
    and so has the second one when the first was the draft (accepted or drawn from the residual,
    the path a plain run takes too)."""
    config, logits, drafts = fixture_logits
    seeds = 1200
    first_plain: Counter[int] = Counter()
    second_plain: Counter[int] = Counter()
    first_speculative: Counter[int] = Counter()
    second_speculative: Counter[int] = Counter()
    for seed in range(seeds):
        plain = _sampler(config, seed, temperature, top_k)
        first_plain[int(plain.choose(logits[0:1]).item())] += 1
        second_plain[int(plain.choose(logits[1:2]).item())] += 1
        taken = accept_drafts(
            lambda i: logits[i : i + 1], drafts, _sampler(config, 10_000 + seed, temperature, top_k)
        )
        first_speculative[taken[0]] += 1
        if taken[0] == drafts[0] and len(taken) > 1:
            second_speculative[taken[1]] += 1
    assert 0 < first_speculative[drafts[0]] < seeds  # both branches of the rule ran
    for plain_counts, speculative_counts in (
        (first_plain, first_speculative),
        (second_plain, second_speculative),
    ):
        statistic, dof = _chi_square_homogeneity(plain_counts, speculative_counts)
        assert dof >= 1
        assert statistic < _chi_square_critical(dof), (statistic, dof, plain_counts, speculative_counts)


@pytest.mark.slow
def test_a_sampling_drafter_uses_the_ratio_rule(fixture_logits: tuple[Any, Any, list[int]]) -> None:
    """With a drafter distribution q, acceptance is min(1, p/q) and rejections draw from
    norm(max(p - q, 0)): the first token still follows p."""
    import mlx.core as mx

    config, logits, drafts = fixture_logits
    vocab = logits.shape[-1]
    q = mx.full((vocab,), 0.0).at[drafts[0]].add(0.5).at[drafts[1]].add(0.5)
    seeds = 1200
    plain: Counter[int] = Counter()
    speculative: Counter[int] = Counter()
    for seed in range(seeds):
        plain[int(_sampler(config, seed).choose(logits[0:1]).item())] += 1
        draft = random.Random(seed).choice(drafts)  # drawn from q, as a sampling drafter does
        taken = accept_drafts(
            lambda i: logits[i : i + 1],
            [draft],
            _sampler(config, 20_000 + seed),
            draft_probabilities=lambda i: q,
        )
        speculative[taken[0]] += 1
    statistic, dof = _chi_square_homogeneity(plain, speculative)
    assert statistic < _chi_square_critical(dof), (statistic, dof, plain, speculative)


def test_a_seeded_row_draws_the_tokens_it_draws_without_drafts(
    fixture_logits: tuple[Any, Any, list[int]],
) -> None:
    """The same seed gives the same first token with or without drafts (the target's token is
    drawn with the row's own key either way; drafts only decide how many positions it covers)."""
    config, logits, drafts = fixture_logits
    for seed in range(40):
        plain = int(_sampler(config, seed).choose(logits[0:1]).item())
        taken = accept_drafts(lambda i: logits[i : i + 1], drafts, _sampler(config, seed))
        assert taken[0] == plain


@pytest.mark.parametrize(
    ("verified", "new_row_greedy", "start"),
    [
        ([], True, None),  # nothing verified yet: the prior
        ([(True, 4, 4)], True, 1.0),  # greedy rows that copied: a new greedy row starts there
        ([(True, 4, 4)], False, None),  # ... not a sampling row (its kind has no rate yet)
        ([(False, 4, 0)], True, None),  # sampling rows with nothing to copy leave greedy rows be
        ([(False, 4, 0)], False, 0.0),
        ([(True, 4, 4), (False, 4, 0)], True, 1.0),  # each kind keeps its own
        ([(True, 4, 4), (False, 4, 0), (False, 4, 4)], False, 0.1),  # moves 0.1 of the way
    ],
)
def test_a_new_row_starts_at_the_recent_rate_of_rows_that_sample_as_it_does(
    verified: list[tuple[bool, int, int]], new_row_greedy: bool, start: float | None
) -> None:
    """One rate for all rows carried a workload's rate into the next (greedy rows that copy
    after sampling rows with nothing to copy started near 0, and the other way near 1)."""
    speculator = Speculator(max_draft=4)
    for index, (greedy, drafted, accepted) in enumerate(verified):
        row = LookupRow(index, greedy=greedy)
        speculator.drafts([row], [[]])  # the row's speculation state, as a step makes it
        speculator.record(row, drafted, accepted)
    rate = speculator.start_rate(new_row_greedy)
    assert rate == (None if start is None else pytest.approx(start))

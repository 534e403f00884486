"""A step's tokens chosen for all its rows at once (token_choice.py): each row's draw follows
mlx-vlm's sampler's distribution (top_p, then top_k, then the temperature) and depends only on
its own seed, never on the rows beside it."""

from __future__ import annotations

import math
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from tests.engine.test_speculation import _chi_square_critical
from vlmserve.engine.sampling import SamplingSettings, TokenSampler
from vlmserve.engine.token_choice import choose_tokens

VOCAB = 48
# The model's generation defaults: none (mlx-vlm's library defaults apply where a field is unset).
NO_DEFAULTS = SimpleNamespace()


def _sampler(seed: int, temperature: float, top_p: float | None, top_k: int | None) -> TokenSampler:
    settings = SamplingSettings(max_tokens=1, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    return TokenSampler(settings, NO_DEFAULTS)


def _logits(seed: int, rows: int = 1) -> Any:
    import mlx.core as mx

    return mx.random.normal((rows, VOCAB), key=mx.random.key(seed)) * 2.5


def _expected(logits: Any, temperature: float, top_p: float | None, top_k: int | None) -> list[float]:
    """mlx-vlm's sampler's distribution over the vocabulary for one row of logits [1, vocab]."""
    import mlx.core as mx
    from mlx_vlm.sample_utils import apply_top_k, apply_top_p

    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    if top_p is not None and 0 < top_p < 1:
        logprobs = apply_top_p(logprobs, top_p)
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        logprobs = apply_top_k(logprobs, top_k)
    probabilities: list[float] = mx.softmax(logprobs * (1 / temperature), axis=-1).reshape(-1).tolist()
    return probabilities


def _goodness_of_fit(counts: Counter[int], expected: list[float], draws: int) -> tuple[float, int]:
    """(chi-square statistic, degrees of freedom): categories expected fewer than 5 times pooled."""
    common = [token for token, p in enumerate(expected) if p * draws >= 5]
    cells = [(counts[token], expected[token] * draws) for token in common]
    rest_expected = draws - sum(e for _, e in cells)
    rest_seen = draws - sum(seen for seen, _ in cells)
    if rest_expected > 1e-9:
        cells.append((rest_seen, rest_expected))
    statistic = sum((seen - e) ** 2 / e for seen, e in cells)
    return statistic, len(cells) - 1


# (temperature, top_p, top_k): top_k rows are chosen among candidates, the others over the
# whole vocabulary; top_k at or above the vocabulary is no top_k.
SETTINGS = [
    (1.0, None, 5),
    (0.7, 0.8, 20),
    (1.5, 0.5, 10),
    (0.7, 0.95, 3),
    (3.0, 0.6, VOCAB - 1),
    (1.0, 0.85, None),
    (2.0, None, None),
    (1.0, 0.9, VOCAB),
]


@pytest.mark.parametrize(("temperature", "top_p", "top_k"), SETTINGS)
def test_draws_follow_mlx_vlms_sampler(temperature: float, top_p: float | None, top_k: int | None) -> None:
    """Many seeded rows of the same logits in one step: their tokens are a sample of mlx-vlm's
    distribution (chi-square at p = 0.001), and never a token it gives no probability."""
    import mlx.core as mx

    logits = _logits(7)
    draws = 3000
    expected = _expected(logits, temperature, top_p, top_k)
    samplers = [_sampler(seed, temperature, top_p, top_k) for seed in range(draws)]
    tokens: list[int] = choose_tokens(mx.repeat(logits, draws, axis=0), samplers).tolist()
    counts = Counter(tokens)
    assert all(expected[token] > 0 for token in counts), sorted(counts)
    statistic, dof = _goodness_of_fit(counts, expected, draws)
    assert dof >= 1
    assert statistic < _chi_square_critical(dof), (statistic, dof)


def test_ties_at_the_nucleus_edge_stay_as_mlx_vlm_keeps_them() -> None:
    """Probabilities 0.5, 0.25, 0.25 (then nothing) with top_p 0.6: the second token reaches the
    nucleus and the third, tied with it, stays too (`apply_top_p` keeps every token at the
    threshold); the rest never come."""
    import mlx.core as mx

    logits = mx.log(mx.array([[0.5, 0.25, 0.25] + [1e-6] * (VOCAB - 3)]))
    expected = _expected(logits, 1.0, 0.6, 10)
    assert [round(p, 3) for p in expected[:3]] == [0.5, 0.25, 0.25]
    samplers = [_sampler(seed, 1.0, 0.6, 10) for seed in range(600)]
    counts = Counter(choose_tokens(mx.repeat(logits, 600, axis=0), samplers).tolist())
    assert set(counts) == {0, 1, 2}
    assert 220 < counts[0] < 380


def test_masked_tokens_are_never_drawn_even_when_fewer_than_top_k_remain() -> None:
    """A grammar leaves three tokens (the rest -inf) and top_k is 20: only those three come."""
    import mlx.core as mx

    allowed = [4, 17, 30]
    mask = mx.zeros((1, VOCAB), dtype=mx.bool_).at[0, mx.array(allowed)].add(True)
    logits = mx.where(mask, _logits(5), -math.inf)
    samplers = [_sampler(seed, 2.0, 0.99, 20) for seed in range(300)]
    tokens = choose_tokens(mx.repeat(logits, 300, axis=0), samplers).tolist()
    assert set(tokens) <= set(allowed)
    assert len(set(tokens)) >= 2


def test_a_row_draws_the_same_tokens_alone_and_in_any_batch() -> None:
    """Rows of every kind (greedy, top_k, top_p with top_k, whole vocabulary) chosen together for
    several steps get exactly the tokens each gets chosen alone with the same seed, whatever the
    rows beside it."""

    kinds = [(0.0, None, None), *SETTINGS]
    together = [_sampler(100 + index, *kind) for index, kind in enumerate(kinds)]
    alone = [_sampler(100 + index, *kind) for index, kind in enumerate(kinds)]
    reversed_batch = [_sampler(100 + index, *kind) for index, kind in enumerate(kinds)][::-1]
    for step in range(6):
        logits = _logits(1000 + step, rows=len(kinds))
        batched: list[int] = choose_tokens(logits, together).tolist()
        one_by_one = [int(choose_tokens(logits[i : i + 1], [alone[i]]).item()) for i in range(len(kinds))]
        backwards: list[int] = choose_tokens(logits[::-1], reversed_batch).tolist()
        assert batched == one_by_one == backwards[::-1], step


def test_greedy_rows_take_the_argmax_beside_sampled_rows() -> None:
    import mlx.core as mx

    logits = _logits(3, rows=4)
    samplers = [
        _sampler(1, 0.0, None, None),
        _sampler(2, 1.0, 0.9, 5),
        _sampler(3, 0.0, 0.5, 3),
        _sampler(4, 1.0, None, None),
    ]
    tokens = choose_tokens(logits, samplers).tolist()
    argmax = mx.argmax(logits, axis=-1).tolist()
    assert (tokens[0], tokens[2]) == (argmax[0], argmax[2])


@pytest.mark.parametrize(
    ("vocab", "best"),
    [
        (3001, [0, 1, 2, 3, 4]),  # all in the first block
        (3001, [2999, 3000, 2900, 5, 1500]),  # two in the last, partial block
        (152064, [7, 70_000, 70_001, 152_063, 99_999]),  # a real vocabulary's size
    ],
)
def test_a_large_vocabulary_finds_the_same_best_tokens(vocab: int, best: list[int]) -> None:
    """Past a size the best candidates are searched block by block: wherever the top_k tokens
    sit (one block, the partial last one), every one of them is drawn and nothing else, with
    mlx-vlm's distribution."""
    import mlx.core as mx

    base = mx.random.uniform(-4.0, 0.0, (1, vocab), key=mx.random.key(vocab))
    logits = base.at[0, mx.array(best)].add(mx.array([6.0, 5.8, 5.6, 5.4, 5.2]))
    draws = 2000
    samplers = [_sampler(seed, 2.0, None, 5) for seed in range(draws)]
    counts = Counter(choose_tokens(mx.repeat(logits, draws, axis=0), samplers).tolist())
    assert set(counts) == set(best)
    expected = _expected(logits, 2.0, None, 5)
    statistic, dof = _goodness_of_fit(counts, expected, draws)
    assert statistic < _chi_square_critical(dof), (statistic, dof)

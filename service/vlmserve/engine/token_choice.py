"""The next token of many rows at once, each with its own settings (generation thread only).

A decode step used to choose each row's token with its own graph: argmax, or log-softmax over
the vocabulary, a full sort for top_p, a partition for top_k, and a draw of one Gumbel number per
vocabulary entry. On the CPU a 152k vocabulary made that ~23 ms a sampled row a step (the sort
alone ~15 ms), 180 ms for eight rows, longer than the model's forward; on any backend it is a
graph per row. Here the step chooses for all its rows in a few batched ops:

- greedy rows: one argmax over their logits;
- rows with a top_k: the k best candidates by one partition over the vocabulary, sorted among
  themselves, top_p applied on them with the probabilities normalised over the whole vocabulary
  (the nucleus of a top_k row lies in its first k tokens or is cut to them), then one draw among
  the kept candidates by the inverse of their cumulative weights at a uniform number of the
  row's own (`RowChoice.uniform`): 8 rows of a 152k vocabulary in ~34 ms on the CPU;
- rows without a top_k: mlx-vlm's `apply_top_p` over the whole vocabulary (a row whose nucleus
  could be anywhere needs the sort), then a Gumbel draw with the row's own key, row by row
  (`RowChoice.scaled_logprobs`, `RowChoice.draw`): the cumulative weights of a whole vocabulary
  would lose precision in float32, and one key for many rows would make a seeded row's tokens
  depend on its neighbours.

The distribution is mlx-vlm's sampler's (`make_sampler`: top_p, then top_k, then the
temperature), up to float rounding at the nucleus' edge; ties at the edge are kept, as
`apply_top_p` keeps them. A row's tokens depend only on its own seed, never on the batch it is
in: a step of one row and a step of sixteen choose the same tokens for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

__all__ = ["RowChoice", "choose_tokens"]

# Vocabulary entries per block when the best candidates are found by blocks (`_best`).
_BLOCK = 128


class RowChoice(Protocol):
    """What choosing a row's token reads of its sampler."""

    @property
    def greedy(self) -> bool: ...

    @property
    def temperature(self) -> float: ...

    @property
    def top_p(self) -> float: ...

    @property
    def top_k(self) -> int: ...

    def uniform(self) -> float:
        """The row's next uniform number in [0, 1) (its own seeded stream)."""
        ...

    def scaled_logprobs(self, logits: Any) -> Any:
        """The row's log-distribution [1, vocab] a token is drawn from (top_p, top_k,
        temperature applied), from its logits [1, vocab]."""
        ...

    def draw(self, scaled_logprobs: Any) -> Any:
        """A token [1] from the row's scaled logprobs [1, vocab] (its own key)."""
        ...


def choose_tokens(logits: Any, rows: Sequence[RowChoice]) -> Any:
    """Each row's next token (lazy uint32 [len(rows)]) from its logits [len(rows), vocab]."""
    import mlx.core as mx

    vocab = int(logits.shape[-1])
    greedy = [index for index, row in enumerate(rows) if row.greedy]
    if len(greedy) == len(rows):
        return mx.argmax(logits, axis=-1)
    ranked = [index for index, row in enumerate(rows) if not row.greedy and 0 < row.top_k < vocab]
    whole = [index for index, row in enumerate(rows) if not row.greedy and not 0 < row.top_k < vocab]
    groups: list[tuple[list[int], Any]] = []
    if greedy:
        groups.append((greedy, mx.argmax(_rows(logits, greedy, len(rows)), axis=-1)))
    if ranked:
        chosen = _among_top_k(_rows(logits, ranked, len(rows)), [rows[index] for index in ranked])
        groups.append((ranked, chosen))
    if whole:
        chosen = _over_the_vocabulary(_rows(logits, whole, len(rows)), [rows[index] for index in whole])
        groups.append((whole, chosen))
    if len(groups) == 1:
        return groups[0][1]
    order = [index for indices, _ in groups for index in indices]
    back = [0] * len(order)
    for position, index in enumerate(order):
        back[index] = position
    tokens = mx.concatenate([chosen for _, chosen in groups])  # each group's uint32 ids
    return tokens[mx.array(back, dtype=mx.int32)]


def _rows(logits: Any, indices: list[int], count: int) -> Any:
    import mlx.core as mx

    if len(indices) == count:
        return logits
    return logits[mx.array(indices, dtype=mx.int32)]


def _column(values: Sequence[float], dtype: Any) -> Any:
    import mlx.core as mx

    return mx.array(list(values), dtype=dtype)[:, None]


def _among_top_k(logits: Any, rows: Sequence[RowChoice]) -> Any:
    """Tokens [rows] drawn among each row's top_k candidates (top_p over the whole vocabulary)."""
    import mlx.core as mx

    width = max(row.top_k for row in rows)
    candidates, values = _best(logits, width)
    values = values.astype(mx.float32)
    keep = mx.arange(width)[None, :] < _column([row.top_k for row in rows], mx.int32)
    if any(0 < row.top_p < 1 for row in rows):
        # apply_top_p's rule on the sorted candidates: a token stays while the probability above
        # it is below top_p (the first always does); ties with the last one kept stay too.
        top_p = _column([row.top_p if 0 < row.top_p < 1 else 2.0 for row in rows], mx.float32)
        logprobs = values - mx.logsumexp(logits, axis=-1, keepdims=True).astype(mx.float32)
        probabilities = mx.exp(logprobs)
        above = mx.cumsum(probabilities, axis=-1, inclusive=False)
        kept = (above < top_p).sum(axis=-1, keepdims=True)
        threshold = mx.take_along_axis(values, kept - 1, axis=-1)
        keep = keep & (values >= threshold)
    temperature = _column([row.temperature for row in rows], mx.float32)
    weights = mx.where(keep, mx.exp((values - values[:, :1]) / temperature), 0.0)
    cumulative = mx.cumsum(weights, axis=-1)
    target = _column([row.uniform() for row in rows], mx.float32) * cumulative[:, -1:]
    chosen = mx.minimum((cumulative <= target).sum(axis=-1, keepdims=True), width - 1)
    return mx.take_along_axis(candidates, chosen, axis=-1).reshape(-1).astype(mx.uint32)


def _best(logits: Any, width: int) -> tuple[Any, Any]:
    """Each row's `width` best tokens (ids, logits), best first. A large vocabulary is cut in
    blocks first: the best tokens lie in the `width` blocks with the best maxima (a token outside
    them has `width` block maxima above it), so the partition runs on those blocks only (on the
    CPU a partition of 152k entries is ~1.5 ms a row; the blocks' maxima and theirs ~0.2 ms)."""
    import mlx.core as mx

    rows, vocab = int(logits.shape[0]), int(logits.shape[-1])
    ids = None
    if vocab >= 4 * _BLOCK * width:
        padding = -vocab % _BLOCK
        if padding:
            logits = mx.concatenate(
                [logits, mx.full((rows, padding), -math.inf, dtype=logits.dtype)], axis=-1
            )
        blocks = logits.reshape(rows, -1, _BLOCK)
        best_blocks = mx.argpartition(-mx.max(blocks, axis=-1), kth=width - 1, axis=-1)[:, :width]
        logits = mx.take_along_axis(blocks, best_blocks[:, :, None], axis=1).reshape(rows, -1)
        ids = (best_blocks[:, :, None] * _BLOCK + mx.arange(_BLOCK)[None, None, :]).reshape(rows, -1)
    chosen = mx.argpartition(-logits, kth=width - 1, axis=-1)[:, :width]
    values = mx.take_along_axis(logits, chosen, axis=-1)
    order = mx.argsort(-values, axis=-1)
    chosen = mx.take_along_axis(chosen, order, axis=-1)
    if ids is not None:
        chosen = mx.take_along_axis(ids, chosen, axis=-1)
    return chosen, mx.take_along_axis(values, order, axis=-1)


def _over_the_vocabulary(logits: Any, rows: Sequence[RowChoice]) -> Any:
    """Tokens [rows] drawn over the whole vocabulary, row by row: each row's own scaled
    log-distribution (`RowChoice.scaled_logprobs`, the rule the acceptance rule reads too) and
    its own key."""
    import mlx.core as mx

    drawn = [
        row.draw(row.scaled_logprobs(logits[index : index + 1])).reshape(-1) for index, row in enumerate(rows)
    ]
    return mx.concatenate(drawn).astype(mx.uint32) if len(drawn) > 1 else drawn[0].astype(mx.uint32)

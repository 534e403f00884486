"""The speculative acceptance rule: which of a row's draft tokens the target model keeps.

A verify forward gives the target's logits after the row's last token and after each draft.
Position i is judged with the logits the row would have sampled from had it generated
drafts[:i] itself (`logits_at(i)`: the grammar and repetition penalty applied as of then), so
the rule never sees a rejected draft's influence:

- greedy: accept while the argmax equals the draft; the token after is the argmax there;
- sampling (the standard rule, Leviathan et al. 2023 / Chen et al. 2023): accept draft d with
  probability min(1, p(d) / q(d)); for a deterministic drafter (prompt lookup, forced tokens) q
  is one-hot, so with probability p(d); on a rejection draw from the residual
  norm(max(p - q, 0)), which for a one-hot q is p without d. If every draft is accepted, the
  bonus token is drawn from p at the last position. The output has the target's distribution.

Each row draws with its own sampler (its own seeded key), so this is per row, position by
position; a row reads one number per position it judges (the rule needs the decision before it
can judge the next position).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

__all__ = ["DraftSampler", "accept_drafts"]


class DraftSampler(Protocol):
    @property
    def greedy(self) -> bool: ...

    def scaled_logprobs(self, logits: Any) -> Any: ...

    def draw(self, scaled_logprobs: Any) -> Any: ...

    def uniform(self) -> Any: ...


def accept_drafts(
    logits_at: Callable[[int], Any],
    drafts: Sequence[int],
    sampler: DraftSampler,
    *,
    draft_probabilities: Callable[[int], Any] | None = None,
) -> list[int]:
    """The tokens the row takes: the accepted prefix of `drafts`, then one token of the target's.

    `logits_at(i)` gives the processed logits [1, vocab] at position i (called for i = 0, 1, ...
    in order, only while the drafts before i were accepted). `draft_probabilities(i)`, for a
    drafter that samples, is its distribution q [vocab] at position i; None means the drafts
    are deterministic (q one-hot)."""
    import mlx.core as mx

    taken: list[int] = []
    for position, draft in enumerate(drafts):
        logits = logits_at(position)
        if sampler.greedy:
            target = _item(mx.argmax(logits, axis=-1))
            if target != draft:
                return [*taken, target]
            taken.append(draft)
            continue
        scaled = sampler.scaled_logprobs(logits).reshape(-1)
        probabilities = mx.softmax(scaled, axis=-1)
        p = probabilities[draft]
        if draft_probabilities is None:
            threshold = p
        else:
            q = draft_probabilities(position)
            threshold = mx.minimum(1.0, p / mx.maximum(q[draft], 1e-20))
        if bool((sampler.uniform() < threshold).item()):
            taken.append(draft)
            continue
        if draft_probabilities is None:
            residual = mx.where(mx.arange(scaled.shape[-1]) == draft, -mx.inf, scaled)
        else:
            residual = mx.log(mx.maximum(probabilities - draft_probabilities(position), 0.0))
        return [*taken, int(sampler.draw(residual[None]).item())]
    logits = logits_at(len(drafts))
    if sampler.greedy:
        return [*taken, _item(mx.argmax(logits, axis=-1))]
    return [*taken, int(sampler.draw(sampler.scaled_logprobs(logits)).item())]


def _item(array: Any) -> int:
    """A one-element array's value (reads it: waits for it)."""
    return int(array.item())

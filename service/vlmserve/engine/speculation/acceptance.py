"""The speculative acceptance rule: which of a row's draft tokens the target model keeps.

A verify forward gives the target's logits after the row's last token and after each draft.
Position i is judged with the logits the row would have sampled from had it generated
drafts[:i] itself (`logits_at(i)`: the grammar and repetition penalty applied as of then), so
the rule never sees a rejected draft's influence:

- greedy: accept while the argmax equals the draft; the token after is the argmax there;
- sampling (the standard rule, Leviathan et al. 2023 / Chen et al. 2023): accept draft d with
  probability min(1, p(d) / q(d)); on a rejection draw from the residual norm(max(p - q, 0)).
  For a deterministic drafter (prompt lookup, forced tokens) q is one-hot: accept with
  probability p(d), residual = p without d. That case is realised by drawing the target's token
  x ~ p exactly as a plain step would (the row's sampler, one draw from its streams per token)
  and accepting d iff x == d: P(accept) = p(d), and a rejection yields x ~ p given x != d, the
  residual. So a seeded request samples the very tokens it samples without speculation, not just
  the same distribution. If every draft is accepted, the next token is drawn from p at the last position.

Each row draws with its own sampler (its own seeded streams), so this is per row, position by
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

    def choose(self, logits: Any) -> Any: ...

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
        if draft_probabilities is None:
            # One-hot q: draw the target's own token (as a plain step would, with the same key)
            # and accept the draft when they agree — probability p(draft); otherwise the token
            # drawn is p conditioned on not being the draft, which is the residual.
            token = _item(sampler.choose(logits))
            if token != draft:
                return [*taken, token]
            taken.append(draft)
            continue
        scaled = sampler.scaled_logprobs(logits).reshape(-1)
        probabilities = mx.softmax(scaled, axis=-1)
        q = draft_probabilities(position)
        threshold = mx.minimum(1.0, probabilities[draft] / mx.maximum(q[draft], 1e-20))
        if bool((sampler.uniform() < threshold).item()):
            taken.append(draft)
            continue
        residual = mx.log(mx.maximum(probabilities - q, 0.0))
        return [*taken, _item(sampler.draw(residual[None]))]
    return [*taken, _item(sampler.choose(logits_at(len(drafts))))]


def _item(array: Any) -> int:
    """A one-element array's value (reads it: waits for it)."""
    return int(array.item())

"""What the decode batch keeps for a row beside its KV row (`BatchRow`): data the row hands over
when it joins (runner.py), read and updated by the batch (batch.py) and its verifier
(verifier.py), never a call back into the row.

A row is known to the batch by its key (`K`, the runner's row object): the batch lists its rows
by key and the verifier keys every row's speculation state by it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from vlmserve.engine.loop.draw import TokenDraw

__all__ = ["BatchRow"]

K = TypeVar("K", bound=Hashable)


@dataclass(eq=False, slots=True)
class BatchRow(Generic[K]):
    """A row's key, how its tokens are drawn, its latest token, how many it may still be given
    after those drawn, its M-RoPE deltas, and the prompt's hidden states until a drafter model
    takes them. The speculator reads rows through it (speculation/drafter.py `DraftingRow`)."""

    key: K
    draw: TokenDraw
    tokens_left: int
    last_token: int = 0
    rope_deltas: Any = None
    prompt_hidden: tuple[int, Any] | None = None

    @property
    def can_draft(self) -> bool:
        return self.draw.can_draft

    @property
    def constrained(self) -> bool:
        return self.draw.grammar is not None

    @property
    def greedy(self) -> bool:
        return self.draw.sampler.greedy

    @property
    def context_tokens(self) -> tuple[Sequence[int], Sequence[int]]:
        """(prompt token ids, the tokens drawn): the history drafts are looked up in."""
        return self.draw.prompt_ids, self.draw.generated

    def forced_tokens(self, pending: Sequence[int]) -> list[int]:
        return self.draw.forced_tokens(pending)

    def take_prompt_hidden(self) -> tuple[int, Any] | None:
        hidden, self.prompt_hidden = self.prompt_hidden, None
        return hidden

    def drew(self, tokens: Sequence[int]) -> None:
        """The step decided these tokens for the row."""
        self.draw.took(tokens)
        self.last_token = tokens[-1]

"""Prompt lookup (suffix matching): draft tokens for a row without a drafter model. Pure.

Agents copy a lot (edited code and JSON, quoted tool output, re-sent history), so the row's own
prompt and output are a good predictor of what comes next: find the most recent earlier place
where the last n tokens occurred (the longest n from `max_ngram` down to `min_ngram`) and propose
what followed it. The index is built incrementally (one dict per n-gram length, the most recent
end position of each n-gram), so a proposal costs a few dict lookups whatever the history length.
A match that runs into the history's end continues periodically (a loop proposes its next turn).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["PromptLookup"]


class PromptLookup:
    """The history of one row (prompt + accepted output) and its n-gram index."""

    def __init__(self, tokens: Iterable[int] = (), *, min_ngram: int = 2, max_ngram: int = 6) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self._min, self._max = min_ngram, max_ngram
        self._tokens: list[int] = []
        # n -> n-gram -> the most recent end (exclusive) of an occurrence that is not the
        # history's current suffix, so something always follows it.
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_ngram, max_ngram + 1)}
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        history = self._tokens
        start = len(history)
        history.extend(int(token) for token in tokens)
        # Ends start..len-1 become indexable: each has a token after it now.
        for end in range(start, len(history)):
            for n, index in self._index.items():
                if end >= n:
                    index[tuple(history[end - n : end])] = end

    def window(self, start: int, count: int) -> list[int]:
        """The history's tokens at positions start..start + count - 1 (fewer at its end)."""
        return self._tokens[start : start + count]

    def propose(self, count: int) -> list[int]:
        """Up to `count` tokens that followed the longest recent match of the history's suffix
        (none when no n-gram of at least `min_ngram` tokens recurs)."""
        history = self._tokens
        if count <= 0:
            return []
        for n in range(min(self._max, len(history) - 1), self._min - 1, -1):
            end = self._index[n].get(tuple(history[len(history) - n :]))
            if end is None:
                continue
            proposal: list[int] = []
            position = end
            while len(proposal) < count:
                proposal.append(
                    history[position] if position < len(history) else proposal[position - len(history)]
                )
                position += 1
            return proposal
        return []

"""Prompt lookup (suffix matching): draft tokens for a row without a drafter model. Pure.

Agents copy a lot (edited code and JSON, quoted tool output, re-sent history), so the row's own
prompt and output are a good predictor of what comes next: find the most recent earlier place
where the last n tokens occurred (the longest n from `max_ngram` down to `min_ngram`) and propose
what followed it. A match that runs into the history's end continues periodically (a loop
proposes its next turn).

The history is kept twice: as token ids (what is proposed) and as bytes, four a token, searched
from the end with `bytearray.rfind` (C). One byte of every token, at the same place in each, and
no other byte has its high bit set, so a match of whole tokens can only start where a token
starts. Feeding a row is then an append (a 1,000-token prompt ~60 us, a generated token ~0.6 us),
where the n-gram index this module kept before (a dict per n-gram length) cost ~1.2 us a token
(that prompt ~0.7 ms, 32,000 tokens 33 ms, on the generation thread: at 16 copying rows the
speculator's largest cost a step, issue 37.1). A proposal costs a search per n-gram length
(the shortest first: where it does not recur, no longer one does), ~1 us on a 1,000-token
history and ~10 us on 32,000 tokens.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

__all__ = ["PromptLookup"]

# Bytes a token takes in the searched history: 7 bits of its id in each (ids up to 2**28; a
# larger id shares its bytes with another, which costs a wrong draft, never a wrong token).
_WIDTH = 4
# Tokens fed at once from which numpy encodes them (a prompt) rather than Python (a step's few).
_VECTORISED = 32


def _marked(token: int) -> int:
    """A token's _WIDTH bytes as one unsigned int: 7 bits of its id each, the top byte marked."""
    return (
        0x80000000
        | (token << 3) & 0x7F000000
        | (token << 2) & 0x7F0000
        | (token << 1) & 0x7F00
        | token & 0x7F
    )


def _encoded(tokens: list[int]) -> bytes:
    """The tokens' bytes in the searched history. Whatever the machine's byte order, the marked
    byte has the same place in every token and no other byte has its high bit set."""
    if len(tokens) < _VECTORISED:
        return b"".join([_marked(token).to_bytes(_WIDTH, "little") for token in tokens])
    ids = np.asarray(tokens, dtype=np.uint32)
    marked = (
        np.uint32(0x80000000)
        | (ids << 3) & np.uint32(0x7F000000)
        | (ids << 2) & np.uint32(0x7F0000)
        | (ids << 1) & np.uint32(0x7F00)
        | ids & np.uint32(0x7F)
    )
    return marked.astype("<u4", copy=False).tobytes()


class PromptLookup:
    """The history of one row (prompt + accepted output), searchable by its n-grams."""

    def __init__(self, tokens: Iterable[int] = (), *, min_ngram: int = 2, max_ngram: int = 6) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self._min, self._max = min_ngram, max_ngram
        self._tokens: list[int] = []
        self._bytes = bytearray()
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        added = [int(token) for token in tokens]
        self._tokens.extend(added)
        self._bytes += _encoded(added)

    def window(self, start: int, count: int) -> list[int]:
        """The history's tokens at positions start..start + count - 1 (fewer at its end)."""
        return self._tokens[start : start + count]

    def _end_of(self, n: int) -> int | None:
        """Where the most recent earlier occurrence of the history's last `n` tokens ends (None:
        none). The suffix itself is not one: an occurrence must have a token after it."""
        data = self._bytes
        size = len(self._tokens)
        found = data.rfind(data[(size - n) * _WIDTH :], 0, (size - 1) * _WIDTH)
        return None if found < 0 else found // _WIDTH + n

    def propose(self, count: int) -> list[int]:
        """Up to `count` tokens that followed the longest recent match of the history's suffix
        (none when no n-gram of at least `min_ngram` tokens recurs)."""
        history = self._tokens
        longest = min(self._max, len(history) - 1)
        if count <= 0 or longest < self._min:
            return []
        # The shortest n-gram first: where it does not recur, no longer one does.
        end = self._end_of(self._min)
        if end is None:
            return []
        for n in range(longest, self._min, -1):
            longer = self._end_of(n)
            if longer is not None:
                end = longer
                break
        # What followed, repeated while the match runs into the history's end (a loop).
        follows = history[end : end + count]
        if len(follows) < count:
            follows *= -(-count // len(follows))
        return follows[:count]

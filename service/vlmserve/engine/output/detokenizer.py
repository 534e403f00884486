"""Incremental detokenization: each new token yields the text it completes, right away.

mlx-vlm's BPE streaming detokenizer holds text until a token starting with a space arrives, so
output without spaces (code, CJK, a repeating random model) would only stream at the end. This
decodes a small window instead: the text of the tokens since the last emitted boundary, minus
what that window already produced. A window ending inside a multi-byte character (U+FFFD at
the end) waits for the next token. Work per token is bounded by the window, not the output.

Special tokens are skipped, except those in `keep` (token id -> text): the markup a parser must
see even where the tokenizer calls it special (Mistral's `[TOOL_CALLS]`, harmony's `<|call|>`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["IncrementalDetokenizer"]

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, keep: Mapping[int, str] | None = None) -> None:
        self._tokenizer = tokenizer
        self._keep = dict(keep or {})
        self._tokens: list[int] = []
        # tokens[prefix:read] were already emitted; decoding from `prefix` keeps the context a
        # SentencePiece decoder needs for leading spaces.
        self._prefix = 0
        self._read = 0

    def _decode(self, tokens: list[int]) -> str:
        return self._decoder(tokens)

    @functools.cached_property
    def _decoder(self) -> Callable[[list[int]], str]:
        """The tokenizer's decode with special tokens skipped; straight through a fast
        tokenizer's Rust backend where that is the same thing (no clean-up pass after decoding):
        `add` decodes twice a token on the generation thread, and the Python wrapper costs ~5x
        the decode (`bench/step_phases.py` measures it per step)."""
        tokenizer = self._tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True):
            return lambda tokens: str(tokenizer.decode(tokens, skip_special_tokens=True))
        return lambda tokens: str(backend.decode(tokens, skip_special_tokens=True))

    def add(self, token: int) -> str:
        """Add a generated token; return the new text it completes ("" if not yet decidable)."""
        kept = self._keep.get(token)
        if kept is not None:  # a boundary: what was pending, then the token's own text
            pending = self.flush()
            self._tokens.append(token)
            self._prefix = self._read = len(self._tokens)
            return pending + kept
        self._tokens.append(token)
        before = self._decode(self._tokens[self._prefix : self._read])
        after = self._decode(self._tokens[self._prefix :])
        if len(after) > len(before) and not after.endswith(_REPLACEMENT):
            self._prefix, self._read = self._read, len(self._tokens)
            return after[len(before) :]
        return ""

    def preview(self, tokens: Sequence[int]) -> list[str]:
        """The text each of `tokens` would add if it came next (alternatives, for logprobs):
        decoded after the pending tokens, like `add`, but kept even if it ends inside a character."""
        before = self._decode(self._tokens[self._prefix : self._read])
        pending = self._tokens[self._prefix :]
        plain = [t for t in tokens if t not in self._keep and t not in self._special_ids]
        decoded = dict(zip(plain, self._decode_many([[*pending, t] for t in plain]), strict=True))
        texts = []
        for token in tokens:
            kept = self._keep.get(token)
            if kept is not None:
                after = self._decode(pending) + kept
            elif token in self._special_ids:  # decoding skips it: named (`<|im_end|>`), not ""
                after = self._decode(pending) + self._spelling(token)
            else:
                after = decoded[token]
            texts.append(after[len(before) :] if after.startswith(before) else after)
        return texts

    def _decode_many(self, sequences: list[list[int]]) -> list[str]:
        """`_decode` of each (20 alternatives a token add up; the tokenizer's `decode_batch` is
        slower still: a thread pool)."""
        return [self._decoder(sequence) for sequence in sequences]

    @functools.cached_property
    def _special_ids(self) -> frozenset[int]:
        return frozenset(getattr(self._tokenizer, "all_special_ids", None) or ())

    def _spelling(self, token: int) -> str:
        spelled = self._tokenizer.convert_ids_to_tokens([token])
        return str(spelled[0]) if spelled else ""

    def flush(self) -> str:
        """Generation ended: whatever the pending tokens decode to, even if incomplete."""
        before = self._decode(self._tokens[self._prefix : self._read])
        after = self._decode(self._tokens[self._prefix :])
        self._prefix = self._read = len(self._tokens)
        return after[len(before) :] if len(after) > len(before) else ""

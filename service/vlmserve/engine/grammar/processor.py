"""A request's grammar as a logits processor: tokens the grammar forbids get -inf. Generation thread.

The mlx-lm / mlx-vlm convention: `processor(tokens, logits) -> logits`, called once per step
before sampling, `tokens` the ids so far (prompt and generated, 1-D or (1, n)), logits (1, vocab).
The first call only records where generation starts; later calls feed the new ids to the matcher.

Why not `mlx_vlm.structured.LLGuidanceLogitsProcessor`: its mask is applied by a Metal kernel,
so it cannot run on the CPU backend. Here llguidance fills its packed bitmask into numpy, numpy
unpacks it and one MLX `where` applies it, so one path serves every backend. Two more things:

- It finishes within the token budget. A grammar only says what may come next, so a model that
  keeps writing digits or string characters would be cut off by max_tokens with half a JSON
  document. When the shortest way to close the output (forced tokens, then the first closing
  token the grammar allows: a quote, a bracket, `0`, ...) no longer fits comfortably in the
  tokens left, the processor takes that way, then EOS. The output stays valid; only its length
  was limited.
- It fails closed: a matcher error (a token the grammar refused, which sampling from the mask
  cannot produce, or one of llguidance's runtime limits, its lexer fuel or Earley items per
  step) leaves only EOS, and `failure` says why: the request then fails with that reason
  (decode.py), never ends as a silent, empty success (a required tool call with no call).

It waits for thinking to end when given the thinking end token (constraints bind the answer).
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["GrammarLogitsProcessor"]

log = logging.getLogger(__name__)

# Tokens that close or shorten JSON (and call markup), in the order the closing path tries them.
# A comma comes before value starts: after a value it is only allowed where more must follow.
_CLOSERS = ('"', "}", "]", '"}', '"]', "}}", ",", "0", "false", "null", "[]", "{}", '""', "\n")
# Check the closing path at least this often, and every step once the budget is within reach.
_CHECK_EVERY = 16
_CHECK_MARGIN = 8
# Tokens kept in hand beyond the closing path's length (grows with the jumps observed).
_MIN_RESERVE = 4


class GrammarLogitsProcessor:
    """Masks one request's logits to its grammar. Not thread-safe; one per request."""

    def __init__(
        self,
        grammar: str,
        llg_tokenizer: Any,
        *,
        eos_token_ids: frozenset[int],
        max_new_tokens: int,
        thinking_end_token_id: int | None = None,
        limits: Any = None,
    ) -> None:
        import llguidance
        import llguidance.numpy

        # `limits`: an llguidance.LLParserLimits (None: llguidance's defaults).
        self._matcher = llguidance.LLMatcher(llg_tokenizer, grammar, limits=limits)
        if self._matcher.is_error():
            raise ValueError(f"grammar does not compile: {self._matcher.get_error()}")
        self._vocab = int(llg_tokenizer.vocab_size)
        self._bitmask = llguidance.numpy.allocate_token_bitmask(1, self._vocab)
        self._eos = sorted(eos_token_ids)
        self._closers = _single_tokens(llg_tokenizer, _CLOSERS)
        self._max_new = max_new_tokens
        # None until the first call: the length of `tokens` already accounted for.
        self._seen: int | None = None
        self._generated = 0
        self._active = thinking_end_token_id is None
        self._thinking_end = thinking_end_token_id
        # The closing path being followed (ends with EOS), once the budget demanded it.
        self._closing: list[int] = []
        self._last_check: tuple[int, int] | None = None  # (generated, path length) at the last check
        self._reserve = _MIN_RESERVE
        self._answer_tokens: int | None = None
        # The output has been inside a structure (a call, a JSON value) at some point.
        self._structured = False
        # Why the grammar could not be followed to its end (the matcher's error), once it could not.
        self.failure: str | None = None

    def __call__(self, tokens: Any, logits: Any) -> Any:
        new = self._new_tokens(tokens)
        self._generated += len(new)
        if not self._active:
            if self._thinking_end is None or self._thinking_end not in new:
                # Still thinking; end it while the answer still fits in what is left.
                left = self._max_new - self._generated
                if self._thinking_end is not None and left <= self._answer_reserve():
                    return self._only([self._thinking_end], logits)
                return logits
            self._active = True
            new = new[new.index(self._thinking_end) + 1 :]
        for token in new:
            if not self._matcher.consume_token(token):
                log.warning("constrained output left its grammar: %s", self._matcher.get_error()[:300])
                break
        if self._matcher.is_error():
            self.failure = self.failure or str(self._matcher.get_error())[:300]
            return self._only(self._eos, logits)
        if not self._matcher.is_accepting():
            self._structured = True
        forced = self._closing_token()
        if forced is not None:
            return self._only([forced], logits)
        return self._masked(logits)

    def forced_after(self, tokens: Any) -> list[int]:
        """The tokens the grammar forces once `tokens` (all ids so far, as `__call__` takes
        them) are consumed, without consuming them: speculative decoding's grammar fast-forward
        drafts these. None while thinking, on the closing path or after an error."""
        if not self._active or self._closing or self._seen is None or self._matcher.is_error():
            return []
        new = [int(t) for t in list(tokens)[self._seen :]]
        matcher = self._matcher.deep_copy()
        for token in new:
            if not matcher.consume_token(token):
                return []
        if matcher.is_error() or matcher.is_stopped():
            return []
        return [int(t) for t in matcher.compute_ff_tokens()]

    # -- the budget -------------------------------------------------------------------------

    def _answer_reserve(self) -> int:
        """Tokens the shortest complete answer needs, with margins (computed once)."""
        if self._answer_tokens is None:
            path = self._closing_path(limit=self._max_new)
            self._answer_tokens = len(path) if path is not None else 0
        return 2 * self._answer_tokens + self._reserve + _CHECK_MARGIN

    def _closing_token(self) -> int | None:
        """The next token of the closing path, when the budget says to take it now."""
        if self._closing:
            return self._closing.pop(0)
        left = self._max_new - self._generated  # tokens still allowed, this one included
        if self._last_check is not None:
            checked_at, length = self._last_check
            far = left > length + self._reserve + _CHECK_MARGIN
            if far and self._generated - checked_at < _CHECK_EVERY:
                return None
        path = self._closing_path(limit=left)
        length = len(path) if path is not None else left
        if self._last_check is not None:
            # Writing can lengthen the way out by several tokens at once (a new key, a nested
            # object): keep a reserve of twice the largest growth seen between two checks.
            self._reserve = max(self._reserve, 2 * (length - self._last_check[1]))
        self._last_check = (self._generated, length)
        if path is None:
            return None  # it cannot fit at all: the output is cut, as without a grammar
        if len(path) == 1:
            # Complete already. Free text may run to the end of the budget; after a call or a
            # JSON value, stop while another call could still be closed in what is left.
            if not self._structured or left > self._reserve + 4 * _CHECK_MARGIN:
                return None
        elif len(path) + self._reserve < left:
            return None  # it still fits later
        self._closing = path
        return self._closing.pop(0)

    def _closing_path(self, *, limit: int) -> list[int] | None:
        """Shortest-looking way from here to a complete output, ending with EOS; None if > limit."""
        import llguidance.numpy

        matcher = self._matcher.deep_copy()
        path: list[int] = []
        mask = llguidance.numpy.allocate_token_bitmask(1, self._vocab)
        while len(path) < limit:
            if matcher.is_accepting() or matcher.is_stopped():
                eos = self._eos[0] if self._eos else None
                return [*path, eos] if eos is not None else path
            forced = matcher.compute_ff_tokens()
            if forced:
                choice: int | None = forced[0]
            else:
                llguidance.numpy.fill_next_token_bitmask(matcher, mask, 0)
                choice = _first_allowed(mask[0], self._closers)
            if choice is None:
                return None
            if not matcher.consume_token(choice):
                return None
            path.append(choice)
        return None

    # -- masks ------------------------------------------------------------------------------

    def _new_tokens(self, tokens: Any) -> list[int]:
        import numpy as np

        count = int(tokens.size)
        if self._seen is None:
            self._seen = count
            return []
        start, self._seen = self._seen, count
        if count <= start:
            return []
        # Read through numpy, not an MLX slice: the ids are an evaluated array, and an MLX op
        # would queue behind the forward in flight (batch.py), so the mask would wait for it.
        flat = np.asarray(tokens).reshape(-1)
        return [int(t) for t in flat[start:].tolist()]

    def _only(self, token_ids: list[int], logits: Any) -> Any:
        import mlx.core as mx

        vocab = int(logits.shape[-1])
        allowed = mx.zeros((vocab,), dtype=mx.bool_)
        allowed[mx.array([t for t in token_ids if t < vocab])] = True
        return mx.where(allowed, logits, -mx.inf)

    def _masked(self, logits: Any) -> Any:
        import llguidance.numpy
        import mlx.core as mx
        import numpy as np

        vocab = int(logits.shape[-1])
        llguidance.numpy.fill_next_token_bitmask(self._matcher, self._bitmask, 0)
        if self._matcher.is_error():  # a runtime limit, hit while computing this mask
            self.failure = self.failure or str(self._matcher.get_error())[:300]
            return self._only(self._eos, logits)
        # Unpacking 1 bit per token is cheapest in numpy; the mask is applied with MLX ops.
        bits = np.unpackbits(self._bitmask[0].view(np.uint8), bitorder="little")[: min(vocab, self._vocab)]
        if vocab > bits.shape[0]:  # the model's padded vocabulary: those rows are never text
            bits = np.concatenate([bits, np.zeros(vocab - bits.shape[0], dtype=np.uint8)])
        return mx.where(mx.array(bits.view(np.bool_)), logits, -mx.inf)


def _single_tokens(llg_tokenizer: Any, texts: tuple[str, ...]) -> list[int]:
    ids: list[int] = []
    for text in texts:
        tokens = llg_tokenizer.tokenize_str(text)
        if len(tokens) == 1 and tokens[0] not in ids:
            ids.append(int(tokens[0]))
    return ids


def _is_set(words: Any, token: int) -> bool:
    return bool((int(words[token >> 5]) >> (token & 31)) & 1)


def _first_allowed(words: Any, preferred: list[int]) -> int | None:
    """The first preferred token the mask allows, else the lowest allowed id, else None."""
    for token in preferred:
        if _is_set(words, token):
            return token
    import numpy as np

    nonzero = np.flatnonzero(words.view(np.uint32))
    if nonzero.size == 0:
        return None
    word = int(nonzero[0])
    value = int(words.view(np.uint32)[word])
    return word * 32 + ((value & -value).bit_length() - 1)

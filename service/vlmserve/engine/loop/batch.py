"""The decoding requests, advanced together: one batched forward per step (generation thread only).

Built on mlx-vlm's batch KV caches: a prefilled request's per-layer cache joins through the
cache class's own `merge` (to a one-row batch cache, e.g. `BatchKVCache`) and `extend`; a
leaving row goes with `filter`, and `extract` gives back its row for the prefix cache. Rows
are left-padded to a common length; the batch cache masks the padding and keeps each row's own
offset, so the model computes every row's positions (M-RoPE: offset + the row's rope_deltas)
as if it ran alone.

Why not mlx-vlm's `BatchGenerator` / `GenerationBatch` as a whole: one sampler serves the whole
batch (our requests each have their own temperature, top_p and seeded random key), prompts are
prefilled together as one left-padded batch that admits nobody else until it is done (a short
request would wait behind an 8k-token prefill), and stop sequences are text, not tokens.
Sampling is per row here (each row's draw.py `TokenDraw`, handed over when it joins); the
forward pass, caches and masks are mlx-vlm's.

The batch decides every row's tokens and returns them (`RowTokens`: one per plain step, several
after a speculative verify); the runner hands each row its tokens. Rows are opaque keys here
(`K`): the batch never calls a row, it reads what the row handed over (batch_row.py `BatchRow`).

Speculative decoding is its verifier's (verifier.py; None: off): the batch asks it at `launch`
whether the step is a verify and lets it plan and run that forward, and at `sample` has it settle
the verify's tokens; it tells it when a row leaves. The batch knows nothing of drafts.

Quantized KV (`--kv-bits`) uses mlx-vlm's `BatchQuantizedKVCache` the same way; kv/merge.py
has the one-row → batch merge mlx-vlm lacks for it.

A model with a cache layer mlx-vlm cannot batch (no `merge`, e.g. Llama 4's chunked attention
cache) still works: its rows keep their own caches and run one forward each.

Double-buffered, as mlx-vlm's own generators are: a step is `launch()` (build the forward on
every row's latest token, the previous step's sampled tokens still lazy, and start evaluating
it), `take()` (the previous step's tokens, now computed, for the caller to hand to its rows) and
`sample()` (each remaining row's next token from the launched forward, started too). So the
caller's Python work on step n's tokens (detokenizing, stop sequences, events) runs while the
device computes step n+1. Sampling waits for the accept, so a logits processor (a grammar) sees
every token before it masks the next, and a row that finished at step n is dropped before its
step n+1 token is sampled; it only wasted its row of that one forward. On a backend that
evaluates synchronously this is the plain step, in a different order.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from vlmserve.engine.kv.merge import merge_rows, mergeable
from vlmserve.engine.kv.views import row_views
from vlmserve.engine.loop.batch_row import BatchRow
from vlmserve.engine.loop.draw import Score, sample_rows, score_chosen
from vlmserve.engine.loop.verifier import Verifier

__all__ = ["BatchRow", "DecodeBatch", "RowTokens"]

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class RowTokens(Generic[K]):
    """The tokens a step decided for one row, in order (the row may end after any of them), and
    the logprob score of the first (a row that asked for logprobs takes one token a step)."""

    row: K
    tokens: tuple[int, ...]
    score: Score | None = None


class DecodeBatch(Generic[K]):
    def __init__(self, language_model: Any, verifier: Verifier[K] | None = None) -> None:
        self._language_model = language_model
        # Speculative decoding (None: off): verifier.py.
        self.verifier = verifier
        # What the batch keeps for each row (its key first), in batch order.
        self._entries: list[BatchRow[K]] = []
        self._caches: list[Any] = []
        self._rope_deltas: Any = None
        # Per-row caches, for models whose cache layers cannot be batched.
        self._row_caches: list[list[Any]] = []
        # The last sample()'s tokens (lazy, int32 [n]) for rows[:n], not yet taken; rows that
        # joined since are fed their own (first) token. After a verify step, its tokens per row
        # (host ints) instead.
        self._pending: Any = None
        self._pending_rows = 0
        self._pending_lists: list[list[int]] | None = None
        # The launched plain forward's last logits [rows, vocab] (lazy), until sample().
        self._logits: Any = None

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def rows(self) -> list[K]:
        """The rows' keys, in batch order."""
        return [entry.key for entry in self._entries]

    @property
    def has_unbatchable_rows(self) -> bool:
        return bool(self._row_caches)

    def add(self, entry: BatchRow[K], cache: list[Any]) -> None:
        """A row whose prompt is prefilled (and first token taken) joins with its KV cache."""
        import mlx.core as mx

        if not all(mergeable(layer) for layer in cache):
            self._row_caches.append(cache)
            self._entries.append(entry)
            return
        merged = [merge_rows([layer]) for layer in cache]
        deltas = entry.rope_deltas
        if not self._entries:
            self._caches, self._rope_deltas = merged, deltas
        else:
            for mine, theirs in zip(self._caches, merged, strict=True):
                mine.extend(theirs)
            if (self._rope_deltas is None) != (deltas is None):
                raise RuntimeError("a batch cannot mix M-RoPE and plain RoPE rows")
            if deltas is not None:
                self._rope_deltas = mx.concatenate([self._rope_deltas, deltas.reshape(1, -1)], axis=0)
        if self._rope_deltas is not None:
            self._rope_deltas = self._rope_deltas.reshape(len(self._entries) + 1, -1)
        self._entries.append(entry)

    def extend(self, entries: Sequence[BatchRow[K]], caches: list[Any], rope_deltas: Any) -> None:
        """Rows whose prompts ran together (prompt_batch.py, first tokens drawn) join with their
        batch cache (one per layer, a row each) and M-RoPE deltas [rows, 1] (None: plain RoPE)."""
        import mlx.core as mx

        if not self._entries:
            self._caches, self._rope_deltas = caches, rope_deltas
        else:
            for mine, theirs in zip(self._caches, caches, strict=True):
                mine.extend(theirs)
            if rope_deltas is not None:
                self._rope_deltas = mx.concatenate([self._rope_deltas, rope_deltas], axis=0)
        self._entries.extend(entries)

    def remove(self, row: K, *, extract: bool) -> list[Any] | None:
        """Drop a request's row (its untaken token too); with `extract`, return its cache (one row
        per layer) first: None in place of a layer a verify in flight holds (see below)."""
        import mlx.core as mx

        index = self.rows.index(row)
        entry = self._entries.pop(index)
        if self._row_caches:
            own = self._row_caches.pop(index)
            return own if extract else None
        # Layers a verify in flight holds until it settles (mid-verify, a recurrent layer's row
        # holds the state after every position of the forward: no prefix to offer from it, None
        # in its place). The plain layers' rows still hold the prompt, whose boundary state the
        # prefix cache keeps (a row that left mid-verify left nothing behind, so an agent's next
        # turn under speculation re-ran its whole prompt).
        held = self.verifier.row_left(entry, last=not self._entries) if self.verifier is not None else []
        held_ids = {id(layer) for layer in held}
        extracted = (
            [None if id(layer) in held_ids else layer.extract(index) for layer in self._caches]
            if extract
            else None
        )
        keep = [i for i in range(len(self._entries) + 1) if i != index]
        if index < self._pending_rows:
            self._pending_rows -= 1
            if self._pending_lists is not None:
                del self._pending_lists[index]
            else:
                self._pending = self._pending[mx.array(keep[: self._pending_rows], dtype=mx.int32)]
        if not keep:
            self._caches, self._rope_deltas, self._logits = [], None, None
            self._pending, self._pending_rows, self._pending_lists = None, 0, None
            return extracted
        kept = mx.array(keep, dtype=mx.int32)
        for layer in self._caches:
            if id(layer) not in held_ids:
                layer.filter(kept)
        if self._rope_deltas is not None:
            self._rope_deltas = self._rope_deltas[kept]
        if self._logits is not None:
            self._logits = self._logits[kept]
        return extracted

    def row_prefix(self, row: K, tokens: int) -> list[tuple[Any, Any]] | None:
        """The first `tokens` positions of a row's cache, per layer (keys, values), as lazy views
        (another request starts from them); None for rows that keep their own caches."""
        import numpy as np

        if self._row_caches or not self._caches:
            return None
        index = self.rows.index(row)
        # The same padding in every layer; read evaluated, through numpy (an MLX op here would
        # queue behind the forward in flight).
        pad = int(np.asarray(self._caches[0].left_padding)[index])
        return row_views(self._caches, index, pad, tokens)

    def launch(self) -> None:
        """Build one forward for every row on its latest token (or let the verifier build its
        own) and start evaluating it."""
        import mlx.core as mx

        if self._row_caches or not self._entries:
            return  # unbatchable rows run synchronously in take()
        verifier = self.verifier
        if verifier is not None and verifier.verifies(self._entries, self._caches):
            # Its step follows the tokens in flight: read them now (take() still hands them out).
            waiting = self._pending_rows_tokens()
            self._pending, self._pending_lists = None, waiting
            self._logits = verifier.launch(self._entries, waiting, self._caches, self._forward)
            return
        fresh = [entry.last_token for entry in self._entries[self._pending_rows :]]
        if not fresh and all(entry.tokens_left <= 0 for entry in self._entries):
            self.disturbed()  # a step that computes nothing is not what a step costs
            return  # every row ends with its token in flight: nothing to compute for
        pending = self._pending
        if pending is None and self._pending_lists is not None:
            # After a verify step its tokens are known here already; take() still hands them out.
            pending = mx.array([tokens[-1] for tokens in self._pending_lists], dtype=mx.int32)
        if pending is None:
            inputs = mx.array(fresh, dtype=mx.int32)
        elif fresh:
            inputs = mx.concatenate([pending, mx.array(fresh, dtype=mx.int32)])
        else:
            inputs = pending
        output = self._forward(inputs.reshape(-1, 1))
        self._logits = output.logits[:, -1, :]
        mx.async_eval(self._logits)  # type: ignore[no-untyped-call]

    def disturbed(self) -> None:
        """The step under way is not what a step costs (it computes nothing, or the runner ran a
        prompt's preparation or chunk after it): the verifier does not count its time."""
        if self.verifier is not None:
            self.verifier.disturbed()

    def _forward(self, inputs: Any, **extra: Any) -> Any:
        """The language model on every row's `inputs` [rows, width], on the batch's caches."""
        kwargs = {"rope_deltas": self._rope_deltas} if self._rope_deltas is not None else {}
        return self._language_model(inputs, cache=self._caches, **kwargs, **extra)

    def take(self) -> list[RowTokens[K]]:
        """The tokens of the last sample() (waits for them), each row's in order, for the caller
        to hand to its rows (after a verify step a row may have several: the caller stops at its
        end).

        Unbatchable rows: their forward and sampling run here, synchronously (no launch)."""
        lists = [[token] for token in self._step_rows_alone()] if self._row_caches else None
        if lists is None:
            lists = self._pending_rows_tokens()
            self._pending, self._pending_rows, self._pending_lists = None, 0, None
        taken = []
        for entry, tokens in zip(self._entries, lists, strict=False):
            entry.drew(tokens)
            taken.append(RowTokens(entry.key, tuple(tokens), entry.draw.take_score()))
        return taken

    def sample(self) -> None:
        """Each remaining row's next token from the launched forward (started, taken next step);
        after a verify forward, the verifier's tokens for each row (read now)."""
        import mlx.core as mx

        if not self._entries:
            self._logits = None
            return
        if self.verifier is not None and self.verifier.in_flight:
            self._pending_lists = self.verifier.settle(self._entries, self._caches)
            self._pending_rows = len(self._entries)
            return
        logits, self._logits = self._logits, None
        if logits is None:
            return
        entries = self._entries
        chosen = sample_rows([entry.draw for entry in entries], logits)
        # For rows that want logprobs (lazy, read when the row takes its token).
        score_chosen([entry.draw for entry in entries], chosen)
        for entry in entries:
            entry.tokens_left -= 1
        self._pending, self._pending_rows = chosen.astype(mx.int32), len(self._entries)
        mx.async_eval(self._pending)  # type: ignore[no-untyped-call]

    def _pending_rows_tokens(self) -> list[list[int]]:
        """The tokens not yet taken, per row of rows[:_pending_rows] (waits for them)."""
        if self._pending_lists is not None:
            return self._pending_lists
        if self._pending is None:
            return []
        values: list[int] = self._pending.tolist()
        return [[value] for value in values]

    def _step_rows_alone(self) -> list[int]:
        import mlx.core as mx

        tokens = []
        for entry, cache in zip(self._entries, self._row_caches, strict=True):
            deltas = entry.rope_deltas
            kwargs = {"rope_deltas": deltas} if deltas is not None else {}
            inputs = mx.array([[entry.last_token]], dtype=mx.int32)
            output = self._language_model(inputs, cache=cache, **kwargs)
            tokens.append(entry.draw.sample(output.logits[:, -1, :]).reshape(-1))
            entry.tokens_left -= 1
        chosen = mx.concatenate(tokens)
        score_chosen([entry.draw for entry in self._entries], chosen)
        values: list[int] = chosen.tolist()  # type: ignore[assignment]
        return values

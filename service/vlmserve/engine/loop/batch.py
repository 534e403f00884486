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
(`K`): the batch never calls a row, it reads what the row handed over (`BatchRow`).

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

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from vlmserve.engine.kv.merge import merge_rows, mergeable
from vlmserve.engine.kv.rollback import verify_forward
from vlmserve.engine.kv.views import row_views
from vlmserve.engine.loop.draw import Score, TokenDraw, score_chosen
from vlmserve.engine.loop.prefill import prefill_group
from vlmserve.engine.speculation.acceptance import accept_drafts
from vlmserve.engine.speculation.drafter import Speculator
from vlmserve.engine.speculation.rollback import (
    RecurrentVerify,
    begin_verify,
    can_roll_back,
    roll_back_rows,
    verify_forward_kwargs,
)

__all__ = ["BatchRow", "DecodeBatch", "RowTokens"]

K = TypeVar("K")


@dataclass(eq=False, slots=True)
class BatchRow:
    """What the batch keeps for a row beside its KV row: how its tokens are drawn, its latest
    token, how many it may still be given after those drawn, its M-RoPE deltas, and the prompt's
    hidden states until a drafter model takes them. The speculator reads rows through it
    (speculation/drafter.py `DraftingRow`)."""

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


@dataclass(frozen=True, slots=True)
class RowTokens(Generic[K]):
    """The tokens a step decided for one row, in order (the row may end after any of them), and
    the logprob score of the first (a row that asked for logprobs takes one token a step)."""

    row: K
    tokens: tuple[int, ...]
    score: Score | None = None


class DecodeBatch(Generic[K]):
    def __init__(self, language_model: Any, speculator: Speculator | None = None) -> None:
        self._language_model = language_model
        # Speculative decoding (None: off): see verify steps below.
        self.speculator = speculator
        # A launched verify forward's drafts per row (None: the launched forward is plain), and
        # the last verify's tokens per row for rows[:_pending_rows] (host ints), not yet taken.
        self._drafts: list[list[int]] | None = None
        self._pending_lists: list[list[int]] | None = None
        # The launched verify's recurrent-state transaction (rollback.py) and last hidden states
        # [rows, width, hidden] (for a drafter model), until its tokens are sampled.
        self._transaction: RecurrentVerify | None = None
        self._hidden: Any = None
        # The rows (keys, in batch order) and what the batch keeps for each.
        self.rows: list[K] = []
        self._entries: list[BatchRow] = []
        self._caches: list[Any] = []
        self._rope_deltas: Any = None
        # Per-row caches, for models whose cache layers cannot be batched.
        self._row_caches: list[list[Any]] = []
        # The last sample()'s tokens (lazy, int32 [n]) for rows[:n], not yet taken; rows that
        # joined since are fed their own (first) token.
        self._pending: Any = None
        self._pending_rows = 0
        # The launched forward's last logits [rows, vocab] (lazy), until sample().
        self._logits: Any = None

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def has_unbatchable_rows(self) -> bool:
        return bool(self._row_caches)

    def add(self, row: K, entry: BatchRow, cache: list[Any]) -> None:
        """A row whose prompt is prefilled (and first token taken) joins with its KV cache."""
        import mlx.core as mx

        if not all(mergeable(layer) for layer in cache):
            self._row_caches.append(cache)
            self.rows.append(row)
            self._entries.append(entry)
            return
        merged = [merge_rows([layer]) for layer in cache]
        deltas = entry.rope_deltas
        if not self.rows:
            self._caches, self._rope_deltas = merged, deltas
        else:
            for mine, theirs in zip(self._caches, merged, strict=True):
                mine.extend(theirs)
            if (self._rope_deltas is None) != (deltas is None):
                raise RuntimeError("a batch cannot mix M-RoPE and plain RoPE rows")
            if deltas is not None:
                self._rope_deltas = mx.concatenate([self._rope_deltas, deltas.reshape(1, -1)], axis=0)
        if self._rope_deltas is not None:
            self._rope_deltas = self._rope_deltas.reshape(len(self.rows) + 1, -1)
        self.rows.append(row)
        self._entries.append(entry)

    def add_prefilled_together(
        self,
        rows: Sequence[K],
        entries: Sequence[BatchRow],
        prompts: Sequence[tuple[Any, Any, Any]],
        caches: Sequence[list[Any]],
    ) -> list[RowTokens[K]]:
        """Prefill the rest of several prompts (prefill.py `prompt_rest` each, after its cache)
        in one forward (prefill.py `prefill_group`), straight into batch rows, and draw each
        row's first token; returns them, for the caller to hand to the rows."""
        import mlx.core as mx

        group = prefill_group(
            self._language_model, list(prompts), list(caches), [entry.rope_deltas for entry in entries]
        )
        if not self.rows:
            self._caches, self._rope_deltas = group.caches, group.rope_deltas
        else:
            for mine, theirs in zip(self._caches, group.caches, strict=True):
                mine.extend(theirs)
            if group.rope_deltas is not None:
                self._rope_deltas = mx.concatenate([self._rope_deltas, group.rope_deltas], axis=0)
        self.rows.extend(rows)
        self._entries.extend(entries)
        logits = group.last_logits
        drawn = [entry.draw.sample(logits[i : i + 1]).reshape(-1) for i, entry in enumerate(entries)]
        chosen = mx.concatenate(drawn) if len(drawn) > 1 else drawn[0]
        score_chosen([entry.draw for entry in entries], chosen)
        values: list[int] = chosen.tolist()  # type: ignore[assignment]
        for entry, value in zip(entries, values, strict=True):
            entry.drew([value])
            entry.tokens_left -= 1
        return [
            RowTokens(row, (value,), entry.draw.take_score())
            for row, entry, value in zip(rows, entries, values, strict=True)
        ]

    def remove(self, row: K, *, extract: bool) -> list[Any] | None:
        """Drop a request's row (its untaken token too); with `extract`, return its cache (one row
        per layer) first."""
        import mlx.core as mx

        index = self.rows.index(row)
        entry = self._entries.pop(index)
        if self._row_caches:
            del self.rows[index]
            own = self._row_caches.pop(index)
            return own if extract else None
        # Mid-verify, a recurrent layer's row holds the state after every position of the forward:
        # no prefix to offer; the transaction drops the row at its commit (rollback.py).
        transaction = self._transaction
        extract = extract and transaction is None
        extracted = [layer.extract(index) for layer in self._caches] if extract else None
        keep = [i for i in range(len(self.rows)) if i != index]
        del self.rows[index]
        if self.speculator is not None:
            self.speculator.forget(entry)
        if self._drafts is not None:
            del self._drafts[index]
        if index < self._pending_rows:
            self._pending_rows -= 1
            if self._pending_lists is not None:
                del self._pending_lists[index]
            else:
                self._pending = self._pending[mx.array(keep[: self._pending_rows], dtype=mx.int32)]
        if not keep:
            if transaction is not None:
                transaction.abort()
            self._caches, self._rope_deltas, self._logits = [], None, None
            self._pending, self._pending_rows, self._pending_lists, self._drafts = None, 0, None, None
            self._transaction = self._hidden = None
            return extracted
        kept = mx.array(keep, dtype=mx.int32)
        for layer in self._caches:
            if transaction is None or not transaction.holds(layer):
                layer.filter(kept)
        if self._rope_deltas is not None:
            self._rope_deltas = self._rope_deltas[kept]
        if self._logits is not None:
            self._logits = self._logits[kept]
        if self._hidden is not None:
            self._hidden = self._hidden[kept]
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
        """Build one forward for every row on its latest token (and its drafts, in a verify
        step) and start evaluating it."""
        import mlx.core as mx

        if self._row_caches or not self.rows:
            return  # unbatchable rows run synchronously in take()
        speculator = self.speculator
        if speculator is not None and can_roll_back(self._caches) and not speculator.rests(self._entries):
            self._launch_verify()
            return
        fresh = [entry.last_token for entry in self._entries[self._pending_rows :]]
        if not fresh and all(entry.tokens_left <= 0 for entry in self._entries):
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
        kwargs = {"rope_deltas": self._rope_deltas} if self._rope_deltas is not None else {}
        output = self._language_model(inputs.reshape(-1, 1), cache=self._caches, **kwargs)
        self._logits = output.logits[:, -1, :]
        mx.async_eval(self._logits)  # type: ignore[no-untyped-call]

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
        for row, entry, tokens in zip(self.rows, self._entries, lists, strict=False):
            entry.drew(tokens)
            taken.append(RowTokens(row, tuple(tokens), entry.draw.take_score()))
        return taken

    def sample(self) -> None:
        """Each remaining row's next token from the launched forward (started, taken next step);
        after a verify forward, each row's accepted drafts and its next token (read now)."""
        import mlx.core as mx

        logits, self._logits = self._logits, None
        if logits is None or not self.rows:
            return
        if self._drafts is not None:
            self._sample_verified(logits)
            return
        entries = self._entries
        tokens = [entry.draw.sample(logits[i : i + 1]).reshape(-1) for i, entry in enumerate(entries)]
        chosen = mx.concatenate(tokens) if len(tokens) > 1 else tokens[0]
        # For rows that want logprobs (lazy, read when the row takes its token).
        score_chosen([entry.draw for entry in entries], chosen)
        for entry in entries:
            entry.tokens_left -= 1
        self._pending, self._pending_rows = chosen.astype(mx.int32), len(self.rows)
        mx.async_eval(self._pending)  # type: ignore[no-untyped-call]

    # -- verify steps (speculative decoding) ----------------------------------------------------
    #
    # With a speculator, each step first reads the tokens in flight (drafts are looked up after
    # them), then asks every row for drafts. None: the plain step. Otherwise one forward runs
    # every row on [its latest token, its drafts, padding] (width 1 + the longest drafts); each
    # row judges its drafts with its own sampler (speculation/acceptance.py) and takes the
    # accepted ones plus one token; the positions it does not keep are rolled back
    # (speculation/rollback.py). Rows without drafts take their one token as in a plain step.

    def _pending_rows_tokens(self) -> list[list[int]]:
        """The tokens not yet taken, per row of rows[:_pending_rows] (waits for them)."""
        if self._pending_lists is not None:
            return self._pending_lists
        if self._pending is None:
            return []
        values: list[int] = self._pending.tolist()
        return [[value] for value in values]

    def _launch_verify(self) -> None:
        import mlx.core as mx

        assert self.speculator is not None
        pending = self._pending_rows_tokens()
        self._pending, self._pending_lists = None, pending
        entries = self._entries
        waiting = [*pending, *([] for _ in entries[len(pending) :])]
        if all(entry.tokens_left <= 0 for entry in entries):
            return  # every row ends with the tokens it has: nothing to compute for
        drafts = self.speculator.drafts(entries, waiting)
        width = 1 + max(len(d) for d in drafts)
        inputs = [
            [tokens[-1] if tokens else entry.last_token, *row_drafts, *([0] * (width - 1 - len(row_drafts)))]
            for entry, tokens, row_drafts in zip(entries, waiting, drafts, strict=True)
        ]
        kwargs = {"rope_deltas": self._rope_deltas} if self._rope_deltas is not None else {}
        kwargs.update(verify_forward_kwargs(self._language_model, self.speculator.capture_layer_ids))
        self._transaction = begin_verify(self._caches, width, entries)
        with verify_forward(self._caches):
            output = self._language_model(mx.array(inputs, dtype=mx.int32), cache=self._caches, **kwargs)
        self.speculator.counts.forwards += 1
        if width == 1 and not self.speculator.reads_hidden_states:
            self._logits = output.logits[:, -1, :]
        else:
            # A drafter model follows every row's tokens with the target's hidden states, so
            # its rows read their tokens now even in a step without drafts.
            self._logits, self._drafts = output.logits, drafts
            self._hidden = (
                self.speculator.target_hidden(output.hidden_states)
                if self.speculator.reads_hidden_states
                else None
            )
        mx.async_eval(self._logits)  # type: ignore[no-untyped-call]

    def _sample_verified(self, logits: Any) -> None:
        import mlx.core as mx

        assert self.speculator is not None and self._drafts is not None
        drafts, self._drafts = self._drafts, None
        entries = self._entries
        width = int(logits.shape[1])
        taken: list[list[int] | None] = []
        plain: list[Any] = []
        for index, (entry, row_drafts) in enumerate(zip(entries, drafts, strict=True)):
            draw = entry.draw
            if not row_drafts:
                taken.append(None)
                plain.append(draw.sample(logits[index : index + 1, 0]).reshape(-1))
                continue
            at_position = functools.partial(_verified_logits, draw, logits[index : index + 1], row_drafts)
            tokens = accept_drafts(at_position, row_drafts, draw.sampler)
            self.speculator.record(entry, len(row_drafts), len(tokens) - 1)
            taken.append(tokens)
            plain.append(mx.array(tokens[:1], dtype=mx.int32))
        chosen = mx.concatenate(plain) if len(plain) > 1 else plain[0]
        score_chosen([entry.draw for entry in entries], chosen)
        values: list[int] = chosen.astype(mx.int32).tolist()  # type: ignore[assignment]
        # Each row's accepted drafts and the target's token after them (`full`); it takes at
        # most what it may still be given.
        full = [
            tokens if tokens is not None else [value] for tokens, value in zip(taken, values, strict=True)
        ]
        lists = [tokens[: max(1, entry.tokens_left)] for tokens, entry in zip(full, entries, strict=True)]
        for entry, tokens in zip(entries, lists, strict=True):
            entry.tokens_left -= len(tokens)
        # Kept positions per row: its latest token and its accepted drafts.
        rejected = [width - len(tokens) for tokens in lists]
        roll_back_rows(self._caches, rejected)
        transaction, self._transaction = self._transaction, None
        if transaction is not None:
            transaction.commit(entries, [width - count for count in rejected])
        hidden, self._hidden = self._hidden, None
        if hidden is not None:
            self.speculator.follow(entries, drafts, full, hidden)
        if width > 1:
            self.speculator.counts.verifies += 1
        self._pending_lists, self._pending_rows = lists, len(self.rows)

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


def _verified_logits(draw: TokenDraw, logits: Any, drafts: Sequence[int], position: int) -> Any:
    """A row's processed logits at one position of its verify forward (logits [1, width, vocab]),
    as if it had drawn the drafts before that position itself."""
    return draw.processed_logits(logits[:, position], drafts[:position])

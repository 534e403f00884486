"""Speculative decoding's seam with the decode batch: one `Verifier` per batch (generation thread
only). The batch (batch.py) knows nothing of drafts; it calls the verifier where a step starts
and where its tokens are drawn, and tells it when a row leaves:

- `launch` (a step starts, `DecodeBatch.launch`): unless the batch's cache layers cannot roll
  back or every row that could draft rests (`verifies`), the verifier plans every row's drafts
  (speculation/drafter.py `Speculator.drafts`: the grammar's, prompt lookup's, a drafter
  model's) after the tokens in flight, which the batch reads for it, and runs one forward of
  every row on [its latest token, its drafts, padding] (width 1 + the longest drafts), the
  recurrent layers recording every position's state (speculation/rollback.py `RecurrentVerify`);
- `settle` (the step's tokens are drawn, `DecodeBatch.sample`): each row judges its drafts with
  its own sampler (speculation/acceptance.py) and takes the accepted ones plus the target's
  next token (those it may still be given); the positions it does not keep are rolled back, the
  transaction commits, and a drafter model follows the forward's hidden states. Rows without
  drafts take their one token as in a plain step;
- `row_left`: a row leaving mid-verify leaves the attention layers at once but the recurrent
  ones only at the commit (the recorded states are per row of the forward), so the batch leaves
  the layers the verify holds alone; the last row leaving abandons the verify.

It owns the verify in flight (its drafts, logits, hidden states and transaction) and, through
the speculator and its drafter model, every row's speculation state, keyed by the batch's row key
(`BatchRow.key`). A verify forward whose width is 1 and that no drafter model follows is a plain
step after all: its logits go back to the batch, which samples them as any (double-buffered).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from vlmserve.engine.kv.rollback import verify_forward
from vlmserve.engine.loop.batch_row import BatchRow
from vlmserve.engine.loop.draw import TokenDraw, sample_rows, score_chosen
from vlmserve.engine.loop.prefill import HiddenReader
from vlmserve.engine.speculation.acceptance import accept_drafts
from vlmserve.engine.speculation.drafter import SpeculationCounts, Speculator
from vlmserve.engine.speculation.model_drafter import AnyDrafter
from vlmserve.engine.speculation.rollback import (
    RecurrentVerify,
    begin_verify,
    can_roll_back,
    roll_back_rows,
    verify_forward_kwargs,
)
from vlmserve.engine.speculation.step_clock import StepClock

__all__ = ["Forward", "Verifier"]

K = TypeVar("K", bound=Hashable)

# The batch's forward on its caches: (input ids [rows, width], extra model arguments) -> output.
Forward = Callable[..., Any]


@dataclass(slots=True)
class _Launched(Generic[K]):
    """A verify forward in flight: its rows (keys, in forward order), their drafts, its logits
    [rows, width, vocab] and a drafter model's input from its hidden states (lazy), and the
    recurrent layers' transaction."""

    keys: list[K]
    drafts: list[list[int]]
    logits: Any
    hidden: Any
    transaction: RecurrentVerify | None


class Verifier(Generic[K]):
    def __init__(self, language_model: Any, speculator: Speculator) -> None:
        self._language_model = language_model
        self.speculator = speculator
        self._launched: _Launched[K] | None = None
        # Times every step for the step gate's measured costs (speculation/step_cost.py).
        costs = speculator.costs
        self._clock = StepClock(costs) if costs is not None else None

    @property
    def model_drafter(self) -> AnyDrafter | None:
        return self.speculator.model_drafter

    @property
    def hidden_reader(self) -> HiddenReader | None:
        """What a row keeps of its prompt's hidden states for a drafter model (None: nothing)."""
        return self.speculator if self.speculator.reads_hidden_states else None

    @property
    def in_flight(self) -> bool:
        """Whether a verify forward's tokens are still to be settled."""
        return self._launched is not None

    def take_counts(self) -> SpeculationCounts:
        return self.speculator.take_counts()

    # -- a step starts ------------------------------------------------------------------------

    def verifies(self, rows: Sequence[BatchRow[K]], caches: Sequence[Any]) -> bool:
        """Whether this step is the verifier's (the batch then reads the tokens in flight and
        calls `launch`); else the batch launches a plain step, double-buffered. Every step starts
        here, so the time since the last one started is what that one cost."""
        now = time.perf_counter()
        verifies = can_roll_back(caches) and self.speculator.speculates(rows)
        if self._clock is not None:
            self._clock.start(now, len(rows), verifies=verifies)
        return verifies

    def launch(
        self,
        rows: Sequence[BatchRow[K]],
        pending: Sequence[Sequence[int]],
        caches: Sequence[Any],
        forward: Forward,
    ) -> Any:
        """Plan every row's drafts after its `pending` tokens (rows[:len(pending)]'s, read) and
        start the verify forward. Returns its last logits [rows, vocab] when it is a plain step
        after all, for the batch to sample; None when the verifier settles it (or nothing is to
        be computed: every row ends with the tokens it has)."""
        import mlx.core as mx

        speculator = self.speculator
        if self._clock is not None:  # the tokens in flight are read: the verify step drafts now
            self._clock.launch(time.perf_counter())
        waiting = [*pending, *([] for _ in rows[len(pending) :])]
        if all(row.tokens_left <= 0 for row in rows):
            self.disturbed()  # nothing computed: not what a step costs
            return None
        drafts = speculator.drafts(rows, waiting)
        width = 1 + max(len(d) for d in drafts)
        inputs = [
            [tokens[-1] if tokens else row.last_token, *row_drafts, *([0] * (width - 1 - len(row_drafts)))]
            for row, tokens, row_drafts in zip(rows, waiting, drafts, strict=True)
        ]
        extra = verify_forward_kwargs(self._language_model, speculator.capture_layer_ids)
        keys = [row.key for row in rows]
        if self._clock is not None:
            self._clock.width(width)
        transaction = begin_verify(caches, width, keys)
        with verify_forward(caches):
            output = forward(mx.array(inputs, dtype=mx.int32), **extra)
        speculator.counts.forwards += 1
        if width == 1 and not speculator.reads_hidden_states:
            logits = output.logits[:, -1, :]
            mx.async_eval(logits)  # type: ignore[no-untyped-call]
            return logits
        # A drafter model follows every row's tokens with the target's hidden states, so its
        # rows read their tokens now even in a step without drafts.
        hidden = speculator.target_hidden(output.hidden_states) if speculator.reads_hidden_states else None
        self._launched = _Launched(keys, drafts, output.logits, hidden, transaction)
        mx.async_eval(output.logits)  # type: ignore[no-untyped-call]
        return None

    # -- its tokens are drawn -----------------------------------------------------------------

    def settle(self, rows: Sequence[BatchRow[K]], caches: Sequence[Any]) -> list[list[int]]:
        """Each remaining row's tokens from the verify forward in flight (read now): its
        accepted drafts and the target's token after them, at most what it may still be given."""
        import mlx.core as mx

        launched, self._launched = self._launched, None
        assert launched is not None
        speculator = self.speculator
        # Rows that left since the launch (they ended on an earlier token) are not judged.
        position = {key: index for index, key in enumerate(launched.keys)}
        at = [position[row.key] for row in rows]
        logits, hidden = launched.logits, launched.hidden
        if len(at) < len(launched.keys):
            kept = mx.array(at, dtype=mx.int32)
            logits = logits[kept]
            hidden = hidden[kept] if hidden is not None else None
        drafts = [launched.drafts[index] for index in at]
        width = int(logits.shape[1])
        # Rows without drafts take one token, chosen together as in a plain step (scored when
        # asked: only they can be, a row with logprobs never drafts).
        plain = [index for index, row_drafts in enumerate(drafts) if not row_drafts]
        plain_tokens = None
        if plain:
            plain_logits = logits[:, 0] if len(plain) == len(rows) else logits[mx.array(plain), 0]
            plain_draws = [rows[index].draw for index in plain]
            plain_tokens = sample_rows(plain_draws, plain_logits)
            score_chosen(plain_draws, plain_tokens)
        full: list[list[int]] = [[] for _ in rows]
        for index, (row, row_drafts) in enumerate(zip(rows, drafts, strict=True)):
            if not row_drafts:
                continue
            draw = row.draw
            at_position = functools.partial(_verified_logits, draw, logits[index : index + 1], row_drafts)
            tokens = accept_drafts(at_position, row_drafts, draw.sampler)
            speculator.record(row, len(row_drafts), len(tokens) - 1)
            full[index] = tokens
        if plain_tokens is not None:
            values: list[int] = plain_tokens.astype(mx.int32).tolist()
            for index, value in zip(plain, values, strict=True):
                full[index] = [value]
        # Each row's accepted drafts and the target's token after them (`full`); it takes at
        # most what it may still be given.
        lists = [tokens[: max(1, row.tokens_left)] for tokens, row in zip(full, rows, strict=True)]
        for row, tokens in zip(rows, lists, strict=True):
            row.tokens_left -= len(tokens)
        # Kept positions per row: its latest token and its accepted drafts.
        rejected = [width - len(tokens) for tokens in lists]
        roll_back_rows(caches, rejected)
        if launched.transaction is not None:
            launched.transaction.commit([row.key for row in rows], [width - count for count in rejected])
        if hidden is not None:
            speculator.follow(rows, drafts, full, hidden)
        if width > 1:
            speculator.counts.verifies += 1
        return lists

    def disturbed(self) -> None:
        """The step under way computes nothing or also ran a prompt's work: its time is not
        what a step costs."""
        if self._clock is not None:
            self._clock.disturbed()

    # -- a row leaves -------------------------------------------------------------------------

    def row_left(self, row: BatchRow[K], *, last: bool) -> list[Any]:
        """`row` left the batch (`last`: no row is left): its speculation state goes. Returns
        the cache layers the verify in flight holds until it settles (the recurrent layers of its
        transaction: the batch neither filters them nor extracts the row's prefix from them);
        the last row leaving abandons the verify."""
        self.speculator.forget(row)
        launched = self._launched
        transaction = launched.transaction if launched is not None else None
        if last:
            if transaction is not None:
                transaction.abort()
            self._launched = None
            if self._clock is not None:
                self._clock.stop()
        return transaction.layers if transaction is not None else []


def _verified_logits(draw: TokenDraw, logits: Any, drafts: Sequence[int], position: int) -> Any:
    """A row's processed logits at one position of its verify forward (logits [1, width, vocab]),
    as if it had drawn the drafts before that position itself."""
    return draw.processed_logits(logits[:, position], drafts[:position])

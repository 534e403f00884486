"""One engine step, for serving and warm-up alike: `StepRunner.run_step` (generation thread only).

A step, given the jobs that joined (the intake, intake.py):

1. new jobs become rows; starting rows whose caller cancelled leave;
2. every decoding row advances in one batched forward (batch.py, double-buffered): the batch
   draws every row's tokens and returns them (`RowTokens`: one for a plain decode step; a
   speculative verify or a grammar fast-forward may decide several in one forward), and the
   runner hands each row its own (`RowAdvance.tokens`: those it accepted before it ended). The
   batch never calls a row: a row hands it its KV cache and its token draw when it joins;
3. new rows are prepared and prompt chunks run within the step's token budget, in the stages
   scheduler.py decides; a row whose last chunk ran has its first token and joins the batch.

Any failure of one row becomes that row's error; a failed batched forward fails its rows. Rows
that are done leave at once (their KV row offered to the prefix cache) and are listed in the
step's result, for the caller to retire (reports, metrics, spans).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from vlmserve.engine.jobs import Job
from vlmserve.engine.loop.batch import BatchRow, DecodeBatch, RowTokens
from vlmserve.engine.loop.decode import ActiveGeneration, Phase
from vlmserve.engine.loop.prefix_cache import PrefixCache
from vlmserve.engine.loop.scheduler import Budget, PrefillRow, chunks, prefill_group, preparations
from vlmserve.engine.loop.verifier import Verifier
from vlmserve.engine.loop.vision_cache import VisionFeatureCache
from vlmserve.engine.model import LoadedModel
from vlmserve.engine.request_errors import RequestError, internal_error
from vlmserve.engine.speculation.drafter import SpeculationCounts
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = ["RowAdvance", "StepResult", "StepRunner"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RowAdvance:
    """The tokens one decoding row accepted in a step, in order (it may have finished after
    any of them: the rest were not fed to it)."""

    row: ActiveGeneration
    tokens: tuple[int, ...]


@dataclass(slots=True)
class StepResult:
    # Decoding rows and the tokens each accepted (prefilled rows' first tokens are not listed).
    advanced: list[RowAdvance] = field(default_factory=list)
    # Rows that finished, failed or were cancelled and left this step.
    left: list[ActiveGeneration] = field(default_factory=list)
    # Rows that joined the batch this step (their prompt is in).
    joined: int = 0


def release_buffers() -> None:
    """Return MLX's cached buffers (a finished prefill's activations, a leaving row's cache) to
    the system, as mlx-vlm's batch generator does after each prompt batch: otherwise the
    allocator keeps every size it has seen and the process's memory only grows."""
    import mlx.core as mx

    mx.clear_cache()


class StepRunner:
    def __init__(
        self,
        loaded: LoadedModel,
        *,
        step_tokens: int,
        prefill_chunk_tokens: int,
        shared_prefix_min_tokens: int,
        group_prefill: bool,
        prefix_cache: PrefixCache | None,
        vision_cache: VisionFeatureCache | None,
        new_verifier: Callable[[Any], Verifier[ActiveGeneration] | None] = lambda language_model: None,
    ) -> None:
        self._loaded = loaded
        # A fresh verifier for each decode batch, on its language model (None: speculation off;
        # verifier.py).
        self._new_verifier = new_verifier
        self._step_tokens = step_tokens
        self._chunk = prefill_chunk_tokens
        self._shared_minimum = shared_prefix_min_tokens
        self._group_prefill = group_prefill
        self._share_prefixes = group_prefill and shared_prefix_min_tokens > 0
        self._prefix_cache = prefix_cache
        self._vision_cache = vision_cache
        self.batch: DecodeBatch[ActiveGeneration] = self._new_batch()
        # Admitted, preparing or prefilling, in arrival order.
        self.starting: list[ActiveGeneration] = []
        # Requests whose prompts were prefilled in a shared forward (tests, metrics).
        self.prefilled_together = 0
        self._result = StepResult()

    def __len__(self) -> int:
        """Rows in flight: starting or decoding."""
        return len(self.starting) + len(self.batch)

    @property
    def rows(self) -> list[ActiveGeneration]:
        return [*self.batch.rows, *self.starting]

    def renew_batch(self, before: Callable[[], object] = lambda: None) -> None:
        """A batch on the model's current weights (nothing in flight): the old batch, which holds
        the old language model, goes first, then `before` runs (it may free or swap the weights)."""
        assert not self.batch, "weights swapped under rows in flight"
        del self.batch
        before()
        self.batch = self._new_batch()

    def take_speculation_counts(self) -> SpeculationCounts | None:
        """Speculative decoding's counts since the last call (metrics; None: it is off)."""
        verifier = self.batch.verifier
        return verifier.take_counts() if verifier is not None else None

    def _new_batch(self) -> DecodeBatch[ActiveGeneration]:
        language_model = self._loaded.model.language_model
        return DecodeBatch(language_model, self._new_verifier(language_model))

    def new_row(self, job: Job) -> ActiveGeneration:
        return ActiveGeneration(
            job,
            self._loaded,
            prefill_chunk_tokens=self._chunk,
            prefix_cache=self._prefix_cache,
            vision_cache=self._vision_cache,
            keep_prompt_hidden=self.batch.verifier.hidden_reader if self.batch.verifier is not None else None,
        )

    def run_step(self, joined: Iterable[Job] = ()) -> StepResult:
        self._result = result = StepResult()
        self.starting.extend(self.new_row(job) for job in joined)
        # (Cancelled decoding rows leave in the decode step, once its token in flight is taken.)
        for generation in list(self.starting):
            if generation.job.cancelled:
                generation.finish(pb.FINISH_REASON_CANCELLED)
                self._leave(generation)
        if self.batch:
            self._decode()
        self._start(Budget(self._step_tokens - len(self.batch)))
        return result

    def end_all(
        self, reason: pb.FinishReason.ValueType = pb.FINISH_REASON_CANCELLED
    ) -> list[ActiveGeneration]:
        """Stopping: every row in flight ends (`reason`); returns them (the runner is not used again)."""
        rows = self.rows
        for generation in rows:
            generation.finish(reason)
        return rows

    # -- decode ----------------------------------------------------------------------------

    def _decode(self) -> None:
        """Launch this step's forward, hand the rows the previous step's tokens while it runs,
        then draw this step's (see batch.py: double-buffered). A row that finished, failed or was
        cancelled leaves before drawing; a cancelled row gets at most the token in flight."""
        batch = self.batch
        try:
            batch.launch()
            taken = batch.take()
        except Exception:  # the batch's forward failed: every row fails, the thread lives
            self._fail_batch()
            return
        for decided in taken:
            self._result.advanced.append(self._hand(decided))
        for generation in list(batch.rows):
            if not generation.done and generation.job.cancelled:
                generation.finish(pb.FINISH_REASON_CANCELLED)
            if generation.done:
                self._leave(generation)
        try:
            batch.sample()
        except Exception:
            self._fail_batch()

    def _hand(self, decided: RowTokens[ActiveGeneration]) -> RowAdvance:
        """A row takes the tokens the step decided for it, until it ends."""
        generation, accepted = decided.row, []
        for index, token in enumerate(decided.tokens):
            score = decided.score if index == 0 else None
            self._guarded(generation, functools.partial(generation.accept, token, score))
            accepted.append(token)
            if generation.done:
                break
        return RowAdvance(generation, tuple(accepted))

    def _fail_batch(self) -> None:
        log.exception("batched decode step failed")
        for generation in list(self.batch.rows):
            generation.fail(internal_error())
            self._leave(generation)

    # -- preparation and prefill -----------------------------------------------------------

    def _start(self, budget: Budget) -> None:
        """Prepare new arrivals, then prefill chunks: leaders of a shared prefix first, then
        prompts that fit one shared forward, then the rest, shortest remaining prompt first."""
        waiting = [g for g in self.starting if g.phase is Phase.PREPARE]
        image_tokens = [sum(image.token_count for image in g.job.request.images) for g in waiting]
        for generation in waiting[: preparations(image_tokens, budget)]:
            self._guarded(generation, generation.prepare)
            if generation.done:
                self._leave(generation)
        if self._share_prefixes:
            self._follow_leaders()
        leaders = [g for g in self.starting if g.followers]
        self._run_chunks(leaders, chunks(self._prefill_rows(leaders), budget))
        if self._group_prefill and not self.batch.has_unbatchable_rows:
            candidates = [g for g in self.starting if g.phase is Phase.PREFILL]
            self._prefill_together(candidates, prefill_group(self._prefill_rows(candidates), budget))
        rest = sorted(
            (g for g in self.starting if g.phase is Phase.PREFILL and g.leader is None),
            key=lambda g: g.prefill_remaining,
        )
        self._run_chunks(rest, chunks(self._prefill_rows(rest), budget))

    @staticmethod
    def _prefill_rows(generations: list[ActiveGeneration]) -> list[PrefillRow]:
        return [
            PrefillRow(
                key=index,
                remaining=g.prefill_remaining,
                next_chunk=g.next_chunk_tokens if g.phase is Phase.PREFILL else 0,
                groupable=g.can_prefill_together,
            )
            for index, g in enumerate(generations)
        ]

    def _run_chunks(self, generations: list[ActiveGeneration], chosen: list[int]) -> None:
        """Each chosen request's next prompt chunk; after its last one a request joins the batch."""
        for index in chosen:
            generation = generations[index]
            self._guarded(generation, generation.prefill)
            if generation.phase is Phase.DECODE:
                self.starting.remove(generation)
                self.batch.add(self._joining(generation), generation.hand_over_cache())
                self._result.joined += 1
                release_buffers()
            elif generation.done:
                self._leave(generation)

    def _follow_leaders(self) -> None:
        """A prepared request that shares at least `shared_prefix_min_tokens` first prompt tokens
        with another request in flight (same partition) starts from that request's KV for them.
        From a decoding request's batch row at once; from an earlier one still prefilling once
        its chunks get there (it follows it: waits, and its leader's chunks run first). Leaders
        are earlier in arrival order and never followers themselves, so nobody waits in a circle."""
        starting = self.starting
        for index, generation in enumerate(starting):
            if not generation.can_follow:
                continue
            best, shared = None, 0
            for other in [*self.batch.rows, *(g for g in starting[:index] if g.can_lead)]:
                length = generation.shared_prefix_with(other)
                if length > shared:
                    best, shared = other, length
            if best is None or shared < self._shared_minimum:
                continue
            if best.phase is Phase.DECODE:
                layers = self.batch.row_prefix(best, shared)
                if layers is not None:
                    generation.start_from(layers, shared)
            else:
                generation.follow(best, shared)

    def _prefill_together(self, candidates: list[ActiveGeneration], chosen: list[int]) -> None:
        """The chosen prompts' rests in one shared prefill forward, straight into batch rows."""
        if not chosen:
            return
        group = [candidates[index] for index in chosen]
        for generation in group:
            self.starting.remove(generation)
        try:
            firsts = self.batch.add_prefilled_together(
                [self._joining(g) for g in group],
                [g.remaining_prompt_arrays for g in group],
                [g.hand_over_cache() for g in group],
            )
        except Exception:
            log.exception("shared prefill failed")
            for generation in group:
                generation.fail(internal_error())  # the text and traceback are in the log
                self._leave(generation)
            return
        self.prefilled_together += len(group)
        self._result.joined += len(group)
        for first in firsts:
            generation = first.row
            self._guarded(
                generation, functools.partial(generation.prefilled_elsewhere, first.tokens[0], first.score)
            )
            if generation.done:
                self._leave(generation)
        release_buffers()

    @staticmethod
    def _joining(generation: ActiveGeneration) -> BatchRow[ActiveGeneration]:
        """What a row hands the batch when it joins (with its KV cache): itself as its key, its
        token draw, its latest token, how many it may still be given and, for a drafter model,
        the prompt's hidden states."""
        assert generation.draw is not None
        return BatchRow(
            generation,
            generation.draw,
            tokens_left=generation.tokens_left,
            last_token=generation.last_token,
            rope_deltas=generation.rope_deltas,
            prompt_hidden=generation.take_prompt_hidden(),
        )

    # -- rows leaving ----------------------------------------------------------------------

    def _guarded(self, generation: ActiveGeneration, work: Callable[[], object]) -> None:
        """Run one piece of a request's work; its failure is its own error."""
        try:
            work()
        except RequestError as error:
            generation.fail(error)
        except Exception:
            log.exception(
                "request %s failed",
                generation.job.request_id,
                extra={"request_id": generation.job.request_id},
            )
            generation.fail(internal_error())  # its text and traceback are in the log, not the status

    def _leave(self, generation: ActiveGeneration) -> None:
        """A done request leaves at once (its KV row goes to the prefix cache)."""
        if generation in self.starting:
            self.starting.remove(generation)
        elif generation in self.batch.rows:
            keep = self._prefix_cache is not None and self._prefix_cache.enabled
            # A failed request (no finish reason) leaves nothing behind.
            row = self.batch.remove(
                generation, extract=keep and generation.finish_reason != pb.FINISH_REASON_UNSPECIFIED
            )
            if row is not None:
                generation.keep_prefix(row)
            release_buffers()
        self._result.left.append(generation)

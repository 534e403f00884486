"""One engine step, for serving and warm-up alike: `StepRunner.run_step` (generation thread only).

Two batches act on the rows (mlx-lm's prompt batch and generation batch): the prompt batch
(prompt_batch.py) prepares new rows and runs their prompts; the decode batch (batch.py) advances
every decoding row in one batched forward. The runner moves rows between them. A step, given the
jobs that joined (the intake, intake.py):

1. new jobs become rows in the prompt batch; rows there whose caller cancelled leave;
2. every decoding row advances in one batched forward (batch.py, double-buffered): the batch
   draws every row's tokens and returns them (`RowTokens`: one for a plain decode step; a
   speculative verify or a grammar fast-forward may decide several in one forward), and the
   runner hands each row its own (`RowAdvance.tokens`: those it accepted before it ended). The
   batch never calls a row: a row hands it its KV cache and its token draw when it joins;
3. the prompt batch prepares rows and runs prompt chunks within the step's token budget, in the
   stages scheduler.py decides; a row whose prompt is in has its first token and the runner
   moves it to the decode batch (a group run together joins with its batch cache).

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
from vlmserve.engine.kv.snapshots import boundary_state
from vlmserve.engine.kv.views import own_copy
from vlmserve.engine.loop.batch import DecodeBatch, RowTokens
from vlmserve.engine.loop.decode import ActiveGeneration, Phase, guarded
from vlmserve.engine.loop.prefix_cache import PrefixCache
from vlmserve.engine.loop.prompt_batch import PromptBatch, PromptGroup
from vlmserve.engine.loop.scheduler import Budget
from vlmserve.engine.loop.verifier import Verifier
from vlmserve.engine.loop.vision_cache import VisionFeatureCache
from vlmserve.engine.model import LoadedModel
from vlmserve.engine.request_errors import internal_error
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
        self._shared_minimum = shared_prefix_min_tokens
        self._group_prefill = group_prefill
        self._share_prefixes = group_prefill and shared_prefix_min_tokens > 0
        self._prefix_cache = prefix_cache
        self.prompts = PromptBatch(
            loaded,
            prefill_chunk_tokens=prefill_chunk_tokens,
            prefix_cache=prefix_cache,
            vision_cache=vision_cache,
        )
        self.batch: DecodeBatch[ActiveGeneration] = self._new_batch()
        # Requests whose prompts were prefilled in a shared forward (tests, metrics).
        self.prefilled_together = 0
        self._result = StepResult()

    def __len__(self) -> int:
        """Rows in flight: starting or decoding."""
        return len(self.prompts) + len(self.batch)

    @property
    def rows(self) -> list[ActiveGeneration]:
        return [*self.batch.rows, *self.prompts.rows]

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
        batch = DecodeBatch(language_model, self._new_verifier(language_model))
        self.prompts.hidden_reader = batch.verifier.hidden_reader if batch.verifier is not None else None
        return batch

    def new_row(self, job: Job) -> ActiveGeneration:
        return ActiveGeneration(job, self._loaded)

    def run_step(self, joined: Iterable[Job] = ()) -> StepResult:
        self._result = result = StepResult()
        for job in joined:
            self.prompts.add(self.new_row(job))
        # (Cancelled decoding rows leave in the decode step, once its token in flight is taken.)
        for generation in list(self.prompts.rows):
            if generation.job.cancelled:
                generation.finish(pb.FINISH_REASON_CANCELLED)
                self._leave(generation)
        decoded = bool(self.batch)
        if decoded:
            self._decode()
        budget = Budget(self._step_tokens - len(self.batch))
        self._start(budget)
        if decoded and budget.ran:
            self.batch.disturbed()  # the decode step's time also holds this prompt work
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
            guarded(generation, functools.partial(generation.accept, token, score))
            accepted.append(token)
            if generation.done:
                break
        return RowAdvance(generation, tuple(accepted))

    def _fail_batch(self) -> None:
        log.exception("batched decode step failed")
        for generation in list(self.batch.rows):
            generation.fail(internal_error())
            self._leave(generation)

    # -- prompts, and rows moving to the decode batch ----------------------------------------

    def _start(self, budget: Budget) -> None:
        """The prompt batch's stages: prepare new arrivals, then prefill chunks: leaders of a
        shared prefix first, then prompts that fit one shared forward, then the rest, shortest
        remaining prompt first. Rows whose prompt is in move to the decode batch."""
        prompts = self.prompts
        for generation in prompts.prepare(budget):
            self._leave(generation)
        if self._share_prefixes:
            prompts.follow_leaders(self.batch, self._shared_minimum)
        for generation in prompts.run_chunks(prompts.leaders(), budget):
            self._ran_chunk(generation)
        if self._group_prefill and not self.batch.has_unbatchable_rows:
            group = prompts.prefill_together(budget)
            if group is not None:
                self._join_group(group)
        for generation in prompts.run_chunks(prompts.rest(), budget):
            self._ran_chunk(generation)

    def _ran_chunk(self, generation: ActiveGeneration) -> None:
        """After its last chunk a row joins the decode batch with its KV cache."""
        if generation.phase is Phase.DECODE:
            self.prompts.remove(generation)
            self.batch.add(self.prompts.joining(generation), generation.hand_over_cache())
            self._result.joined += 1
            release_buffers()
        elif generation.done:
            self._leave(generation)

    def _join_group(self, group: PromptGroup) -> None:
        """Prompts run together join the decode batch with their batch cache, then take their
        first tokens."""
        if not group.entries:  # the shared forward failed: its rows failed
            for generation in group.rows:
                self._leave(generation)
            return
        self.batch.extend(group.entries, group.caches, group.rope_deltas)
        self.prefilled_together += len(group.rows)
        self._result.joined += len(group.rows)
        for generation, (token, score) in zip(group.rows, group.firsts, strict=True):
            guarded(generation, functools.partial(generation.prompt_ran, token, score))
            if generation.done:
                self._leave(generation)
        release_buffers()

    # -- rows leaving ----------------------------------------------------------------------

    def _leave(self, generation: ActiveGeneration) -> None:
        """A done request leaves at once (its KV row goes to the prefix cache)."""
        if generation in self.prompts.rows:
            self.prompts.remove(generation)
            # Done on its first token (max_tokens 1, an immediate EOS: a prewarm): its whole
            # prompt is in its prefill cache, which the next turn should find like any other's.
            cache = generation.hand_over_cache()
            if (
                cache
                and self._prefix_cache is not None
                and self._prefix_cache.enabled
                and generation.finish_reason != pb.FINISH_REASON_UNSPECIFIED
            ):
                self._keep_prefix(generation, cache)
        elif generation in self.batch.rows:
            keep = self._prefix_cache is not None and self._prefix_cache.enabled
            # A failed request (no finish reason) leaves nothing behind.
            row = self.batch.remove(
                generation, extract=keep and generation.finish_reason != pb.FINISH_REASON_UNSPECIFIED
            )
            if row is not None:
                self._keep_prefix(generation, row)
            release_buffers()
        self._result.left.append(generation)

    def _keep_prefix(self, generation: ActiveGeneration, cache: list[Any]) -> None:
        """Offer a finished request's KV cache (one row) to the prefix cache."""
        inputs = generation.inputs
        if self._prefix_cache is None or inputs is None or not generation.generated or not cache:
            return
        # The cache holds the prompt and the generated tokens fed back so far: all of them when
        # the row left after its last token went into a (double-buffered) forward, all but the
        # last when it left before.
        # After a verify step it may also hold accepted drafts past the token the row stopped at
        # (EOS, a stop sequence): those positions are cut, and the offsets say so.
        offsets = [layer.offset for layer in cache if isinstance(getattr(layer, "offset", None), int)]
        covered = [*inputs.token_ids, *generation.generated][: offsets[0] if offsets else 0]
        # Layers no prefix can be cut from (recurrent, sliding-window, chunked): their state at the
        # prompt's boundary (decode.py `snapshot_at`), and at the end of the turn when it is
        # exactly `covered` (not past it, as after accepted drafts) and the template renders the
        # generation prompt again (else the next turn parts before the prompt's end anyway).
        checkpoints = dict([generation.prompt_state]) if generation.prompt_state is not None else {}
        if any(layer is None for layer in cache):
            # Left mid-verify (batch.py `remove`): its held layers' state is past its tokens, so
            # only the prompt's boundary is kept, those layers from that boundary's state.
            if generation.prompt_state is None:
                return
            cache = [
                saved if layer is None else layer
                for layer, saved in zip(cache, generation.prompt_state[1], strict=True)
            ]
        elif (
            generation.snapshot_at >= generation.prompt_tokens
            and all(offset == len(covered) for offset in offsets)
            and (end := boundary_state(cache)) is not None
        ):
            checkpoints[len(covered)] = end
        generation.prompt_state = None
        own_copy(cache, len(covered))
        for layer in cache:
            if isinstance(getattr(layer, "offset", None), int) and layer.offset > len(covered):
                layer.offset = len(covered)
        self._prefix_cache.store(
            generation.partition_key, covered, inputs.image_spans, cache, checkpoints=checkpoints
        )

"""One request on the generation thread, a row: its sequence state and its output.

The row is data: its phase, its prompt's state while it runs (model inputs, positions computed,
the KV cache until the decode batch takes it, prefix sharing with other requests in flight), the
tokens it took, and its output side (sampler's draw, detokenizer, assembler, logprob trace,
events: row_output.py, draw.py) with its clocks. The batches act on it: the prompt batch
(prompt_batch.py) prepares its inputs and runs its prompt, chunk by chunk or with others in one
forward, and draws its first token; the decode batch (batch.py) draws every later token from the
token draw and KV cache the row handed it. The runner (runner.py) moves rows between them and
hands each row its tokens: `accept()` grows the sequence and has the output side turn each token
into events.

Per-request position state (Qwen2-VL's M-RoPE `rope_deltas`) travels with the request (and then
with its batch row) and is passed explicitly on every call, instead of relying on the state
mlx-vlm keeps on the model, which belongs to whichever request ran last.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np

from vlmserve.engine.jobs import Job, JobKind, JobReport
from vlmserve.engine.loop.draw import Score, TokenDraw
from vlmserve.engine.loop.model_inputs import ModelInputs
from vlmserve.engine.loop.prefix_cache import PromptImages, prompt_images
from vlmserve.engine.loop.row_output import RowClock, RowOutput
from vlmserve.engine.model import LoadedModel
from vlmserve.engine.request_errors import RequestError, internal_error
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = ["ActiveGeneration", "Phase", "guarded"]

log = logging.getLogger(__name__)


class Phase(enum.Enum):
    PREPARE = 1
    PREFILL = 2
    DECODE = 3
    DONE = 4


class ActiveGeneration:
    """One job on the generation thread: its sequence state here; the request's output side in
    `output` and its clocks in `clock` (row_output.py). Not thread-safe: the generation thread
    only."""

    def __init__(self, job: Job, loaded: LoadedModel) -> None:
        self.job = job
        self._loaded = loaded
        self.phase = Phase.PREPARE
        self.output = RowOutput(job, loaded)
        # How its tokens are drawn (made when it is prepared; the decode batch's once it joins).
        self.draw: TokenDraw | None = None
        self.clock = RowClock()
        # Whether preparation reached the prefix-cache lookup (metrics: its hit rate).
        self.prefix_looked_up = False
        self.prompt_tokens = 0
        # Prompt tokens not prefilled: from the prefix cache, or (`shared_in_flight`) taken from
        # another request in flight.
        self.cached_tokens = 0
        self.shared_in_flight = False
        self.max_tokens = job.request.settings.max_tokens
        self._generated: list[int] = []
        # The prompt while it runs (prompt_batch.py): its model inputs, the positions computed
        # (cached or run), its KV cache until the decode batch takes it, and what a drafter
        # model reads of its hidden states, per chunk (None: not kept).
        self.inputs: ModelInputs | None = None
        self.prefilled = 0
        self.cache: list[Any] = []
        self.prompt_hidden: list[Any] | None = None
        # The state of the layers no prefix can be cut from (recurrent, sliding-window, chunked;
        # position, state: kv/snapshots.py) at `snapshot_at`, a boundary the prefix cache keeps
        # beside the one at the end of the generated turn: the prompt's end, or the end of its
        # last message where the template will not render its generation prompt again
        # (message_end.py). A prefill chunk ends there.
        self.prompt_state: tuple[int, Any] | None = None
        self.snapshot_at = 0
        self.last_token = 0
        # Prefix sharing between requests in flight (prompt_batch.py): the request whose KV this
        # one waits for and how many of its first tokens it takes; the requests waiting for it.
        self.leader: ActiveGeneration | None = None
        self.shared_tokens = 0
        self.followers: list[ActiveGeneration] = []
        self._signature: tuple[np.ndarray, PromptImages] | None = None

    @property
    def done(self) -> bool:
        return self.phase is Phase.DONE

    @property
    def finish_reason(self) -> pb.FinishReason.ValueType:
        return self.output.finish_reason

    @property
    def rope_deltas(self) -> Any:
        return self.inputs.rope_deltas if self.inputs is not None else None

    @property
    def generated(self) -> tuple[int, ...]:
        return tuple(self._generated)

    @property
    def partition_key(self) -> str:
        return self.job.request.partition_key

    @property
    def prompt_signature(self) -> tuple[np.ndarray, PromptImages]:
        """(token ids, images by position) as prefix matching compares them (once prepared)."""
        if self._signature is None:
            assert self.inputs is not None
            self._signature = (
                np.asarray(self.inputs.token_ids, dtype=np.int64),
                prompt_images(self.inputs.image_spans),
            )
        return self._signature

    @property
    def tokens_left(self) -> int:
        """Tokens this request may still generate."""
        return max(0, self.max_tokens - len(self._generated))

    # -- the prompt ---------------------------------------------------------------------------

    def prepared(self, inputs: ModelInputs, cache: list[Any], cached_tokens: int, draw: TokenDraw) -> None:
        """Its model inputs, its KV cache (empty, or a reused prefix of `cached_tokens`) and its
        token draw are ready: PREPARE -> PREFILL."""
        self.inputs, self.cache = inputs, cache
        self.prefilled = self.cached_tokens = cached_tokens
        self.output.start()
        self.draw = draw
        self.phase = Phase.PREFILL

    def hand_over_cache(self) -> list[Any]:
        """The prefilled KV cache, for the decode batch (which owns it from now on)."""
        cache, self.cache = self.cache, []
        return cache

    def prompt_ran(self, token: int, score: Score | None) -> None:
        """Its whole prompt is in the KV cache and its first token was drawn: take it."""
        assert self.inputs is not None
        self.prefilled = self.prompt_tokens
        self.inputs.release_prompt()  # the prompt's embeddings are in the cache now
        self.phase = Phase.DECODE
        self.accept(token, score)

    def stop_sharing(self) -> None:
        """This request ended: its followers that still wait compute their prefix themselves
        (or find another leader), and it stops waiting for its own leader."""
        for follower in self.followers:
            follower.leader, follower.shared_tokens = None, 0
        self.followers = []
        if self.leader is not None and self in self.leader.followers:
            self.leader.followers.remove(self)
        self.leader = None

    # -- tokens -------------------------------------------------------------------------------

    def accept(self, token: int, score: Score | None = None) -> None:
        """Take `token` (its logprob `score` when asked): the sequence grows by it and the output
        side sends what it settles."""
        self.clock.tick()
        self.last_token = token
        self._generated.append(token)
        if self.output.take(token, end_of_sequence=token in self._loaded.eos_token_ids, score=score):
            self.finish(pb.FINISH_REASON_STOP)
        elif len(self._generated) >= self.max_tokens:
            self.finish(pb.FINISH_REASON_LENGTH)

    # -- the end --------------------------------------------------------------------------------

    def counted(self) -> None:
        """A count-tokens job: its prompt's length is its answer."""
        self.prompt_tokens = len(self.job.request.prompt_ids)
        self.output.counted(self.prompt_tokens)
        self.phase = Phase.DONE

    def finish(self, reason: pb.FinishReason.ValueType) -> None:
        """End the job with a result (also used for cancellation at any phase)."""
        if self.phase is Phase.DONE:
            return
        failure = self.draw.grammar_failure if self.draw is not None else None
        if failure is not None and reason != pb.FINISH_REASON_CANCELLED:
            # The grammar could not be followed (an llguidance limit): the output ended where
            # it was, so it is not what was asked for (a required call may be missing). Say so.
            self.fail(RequestError(grpc.StatusCode.ABORTED, f"constrained decoding stopped: {failure}"))
            return
        self.output.close(reason)
        self.phase = Phase.DONE
        # A row done on its first token (before the decode batch took its cache) keeps its
        # prefill cache for the runner to offer the prefix cache as it leaves (Runner._leave).
        if reason == pb.FINISH_REASON_CANCELLED or self.prefilled < self.prompt_tokens:
            self.cache = []
        self.stop_sharing()
        if self.job.request.kind is JobKind.GENERATE:
            self.output.finished(
                prompt_tokens=self.prompt_tokens, cached_tokens=self.cached_tokens, clock=self.clock
            )

    def fail(self, error: RequestError) -> None:
        if self.phase is Phase.DONE:
            return
        self.phase = Phase.DONE
        self.cache = []
        self.inputs = None
        self.stop_sharing()
        self.output.failed(error)

    def report(self) -> JobReport:
        output = self.output
        return JobReport(
            request_id=self.job.request_id,
            finish_reason=output.finish_reason,
            prompt_tokens=self.prompt_tokens,
            output_tokens=output.output_tokens,
            tokens_after_cancel=output.tokens_after_cancel,
            image_count=len(self.job.request.images),
            cached_tokens=self.cached_tokens,
            token_ids=tuple(self._generated),
        )


def guarded(generation: ActiveGeneration, work: Callable[[], object]) -> None:
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

"""One request on the generation thread, a row: prepare its inputs, prefill in chunks, then take
tokens.

The row is its sequence state (phase, token ids, KV cache, prefix sharing between requests in
flight); the request's output side (sampler, detokenizer, assembler, logprob trace, events) and
its clocks are row_output.py's, and every prompt forward is prefill.py's. A row's own work is
`prepare()` (processor, vision features, prefix-cache lookup) and `prefill()` (the next chunk of
its prompt, single-row, so its KV cache and first token are exactly what it gets alone). Once
prefilled it hands its KV cache and its token draw (draw.py: sampler, logits processors) to the
`DecodeBatch` (batch.py), which runs one forward for all decoding requests per step and draws
their tokens; the runner hands each row the tokens the step gave it, and `accept()` grows the
sequence and has the output side turn each token into events. The batch never calls a row.

Per-request position state (Qwen2-VL's M-RoPE `rope_deltas`) travels with the request (and then
with its batch row) and is passed explicitly on every call, instead of relying on the state
mlx-vlm keeps on the model, which belongs to whichever request ran last.
"""

from __future__ import annotations

import enum
import logging
from typing import Any

import grpc
import numpy as np

from vlmserve.engine.jobs import Job, JobKind, JobReport
from vlmserve.engine.kv.layout import new_prompt_cache
from vlmserve.engine.kv.views import own_copy, views
from vlmserve.engine.loop.draw import Score, TokenDraw, score_chosen
from vlmserve.engine.loop.model_inputs import ImageSpan, ModelInputs, build_model_inputs, prompt_image_spans
from vlmserve.engine.loop.prefill import HiddenReader, groupable, prefill_chunk, prompt_rest
from vlmserve.engine.loop.prefix_cache import (
    PrefixCache,
    PromptImages,
    prompt_images,
    shared_prefix_length,
)
from vlmserve.engine.loop.row_output import RowClock, RowOutput
from vlmserve.engine.loop.vision_cache import VisionFeatureCache
from vlmserve.engine.model import LoadedModel
from vlmserve.engine.request_errors import RequestError
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = ["ActiveGeneration", "Phase"]

log = logging.getLogger(__name__)


# The most prompt positions a drafter model is started from (take_prompt_hidden): a long prompt's
# hidden states are large (positions x hidden size), and a drafter head attends mostly to what is
# recent.
PROMPT_HIDDEN_POSITIONS = 4096


class Phase(enum.Enum):
    PREPARE = 1
    PREFILL = 2
    DECODE = 3
    DONE = 4


class ActiveGeneration:
    """One job on the generation thread: its sequence state (phase, token ids, KV cache, prefix
    sharing) here; the request's output side in `output` and its clocks in `clock`
    (row_output.py). Not thread-safe: the generation thread only."""

    def __init__(
        self,
        job: Job,
        loaded: LoadedModel,
        *,
        prefill_chunk_tokens: int,
        prefix_cache: PrefixCache | None = None,
        vision_cache: VisionFeatureCache | None = None,
        keep_prompt_hidden: HiddenReader | None = None,
    ) -> None:
        self.job = job
        # What a drafter model reads of the prompt's hidden states, per chunk run here, until it
        # takes them (None: not kept; speculation/model_drafter.py, dflash_drafter.py).
        self._hidden_reader = keep_prompt_hidden
        self._prompt_hidden: list[Any] | None = [] if keep_prompt_hidden is not None else None
        self._loaded = loaded
        self._prefix_cache = prefix_cache
        self._vision_cache = vision_cache
        self._chunk = max(1, prefill_chunk_tokens)
        self.phase = Phase.PREPARE
        self.output = RowOutput(job, loaded)
        # How its tokens are drawn (made by prepare(); the decode batch's once the row joins it).
        self.draw: TokenDraw | None = None
        self.clock = RowClock()
        # Whether prepare() reached the prefix-cache lookup (metrics: its hit rate).
        self.prefix_looked_up = False
        self.prompt_tokens = 0
        # Prompt tokens not prefilled: from the prefix cache, or (`shared_in_flight`) taken from
        # another request in flight.
        self.cached_tokens = 0
        self.shared_in_flight = False
        self._max_tokens = job.request.settings.max_tokens
        self._generated: list[int] = []
        self._inputs: ModelInputs | None = None
        self._prefilled = 0
        self._cache: list[Any] = []
        self.last_token = 0
        # Prefix sharing between requests in flight (follow(), start_from()): the request whose
        # KV this one waits for and how many of its first tokens it takes; the requests waiting
        # for this one.
        self.leader: ActiveGeneration | None = None
        self.shared_tokens = 0
        self.followers: list[ActiveGeneration] = []
        self._signature: tuple[np.ndarray, PromptImages] | None = None

    @property
    def done(self) -> bool:
        return self.phase is Phase.DONE

    @property
    def image_count(self) -> int:
        return len(self.job.request.images)

    @property
    def finish_reason(self) -> pb.FinishReason.ValueType:
        return self.output.finish_reason

    @property
    def prefill_remaining(self) -> int:
        """Prompt tokens still to run (before preparation: unknown, counted as 0)."""
        if self._inputs is None:
            return 0
        return self.prompt_tokens - self._prefilled

    @property
    def image_spans(self) -> tuple[ImageSpan, ...]:
        return self._inputs.image_spans if self._inputs is not None else ()

    @property
    def rope_deltas(self) -> Any:
        return self._inputs.rope_deltas if self._inputs is not None else None

    # -- preparation and prefill ------------------------------------------------------------

    def prepare(self) -> None:
        """Model inputs (vision features included) and any reusable prefix; PREPARE -> PREFILL."""
        request = self.job.request
        info = self._loaded.info
        self.prompt_tokens = len(request.prompt_ids)
        if request.kind is JobKind.COUNT_TOKENS:
            self.output.counted(self.prompt_tokens)
            self.phase = Phase.DONE
            return
        # Every prepared request fits (prep/preparer.py `_fit_context`, the one place it is checked).
        assert self.prompt_tokens < info.context_length, "a prepared prompt leaves room for output"
        self._max_tokens = min(self._max_tokens, info.context_length - self.prompt_tokens)
        self.prefix_looked_up = self._prefix_cache is not None
        # The prefix first: images inside the reused part need no vision tower (after a restart
        # the vision cache is empty, and re-encoding an agent's old screenshots would cost more
        # than the rest of the turn).
        spans = prompt_image_spans(self._loaded, request)
        taken = (
            self._prefix_cache.take(request.partition_key, request.prompt_ids, spans)
            if self._prefix_cache is not None
            else None
        )
        inputs = build_model_inputs(
            self._loaded,
            request,
            spans,
            vision_cache=self._vision_cache,
            covered_tokens=taken[1] if taken else 0,
        )
        self._inputs = inputs
        if taken is not None:
            self._cache, self._prefilled = taken
            self.cached_tokens = self._prefilled
        else:
            self._cache = new_prompt_cache(self._loaded.model.language_model, self._loaded.kv_layout)
        self.output.start()
        self.draw = TokenDraw(request, self._loaded, inputs.token_ids, self._max_tokens)
        self.phase = Phase.PREFILL

    @property
    def next_chunk_tokens(self) -> int:
        """Size of the next prefill chunk. Chunks are always whole (only the last is shorter),
        whatever else runs in the step, so a request's KV cache and first token do not depend
        on the company it keeps."""
        return min(self._chunk, self.prompt_tokens - self._prefilled)

    def prefill(self) -> int:
        """Run the next prompt chunk (prefill.py); returns its size.

        The last chunk yields the first token; then the request is in DECODE (or DONE).
        """
        import mlx.core as mx

        inputs = self._inputs
        assert inputs is not None
        start = self._prefilled
        end = start + self.next_chunk_tokens
        reader, kept = self._hidden_reader, self._prompt_hidden
        logits = prefill_chunk(
            self._loaded.model.language_model,
            inputs,
            self._cache,
            start,
            end,
            hidden=(reader, kept) if reader is not None and kept is not None else None,
        )
        if self._prompt_hidden and sum(h.shape[1] for h in self._prompt_hidden) > PROMPT_HIDDEN_POSITIONS:
            self._prompt_hidden = [mx.concatenate(self._prompt_hidden, axis=1)[:, -PROMPT_HIDDEN_POSITIONS:]]
        self._prefilled = end
        self._share_with_followers()
        if end < self.prompt_tokens:
            mx.eval([c.state for c in self._cache], self._prompt_hidden or [])
            return end - start
        inputs.release_prompt()  # the prompt's embeddings are in the cache now
        self.phase = Phase.DECODE
        self._take_first(logits[:, -1, :])
        return end - start

    @property
    def can_prefill_together(self) -> bool:
        """Whether the rest of this prompt can share one prefill forward with others' (batch.py):
        it is all one chunk, nobody waits on this request's own cache (followers) nor it on
        someone else's (a leader), and its inputs can be padded (prefill.py `groupable`). It
        may start from a cached prefix."""
        inputs = self._inputs
        if inputs is None or self.phase is not Phase.PREFILL or self.followers or self.leader is not None:
            return False
        return self.prefill_remaining <= self._chunk and groupable(inputs)

    @property
    def remaining_prompt_arrays(self) -> tuple[Any, Any, Any]:
        """The prompt not prefilled yet (prefill.py `prompt_rest`)."""
        assert self._inputs is not None
        return prompt_rest(self._inputs, self._prefilled)

    # -- prefix sharing between requests in flight ------------------------------------------

    @property
    def partition_key(self) -> str:
        return self.job.request.partition_key

    @property
    def prompt_signature(self) -> tuple[np.ndarray, PromptImages]:
        """(token ids, images by position) as the prefix matching compares them (after prepare())."""
        if self._signature is None:
            assert self._inputs is not None
            self._signature = (
                np.asarray(self._inputs.token_ids, dtype=np.int64),
                prompt_images(self._inputs.image_spans),
            )
        return self._signature

    @property
    def can_follow(self) -> bool:
        """Prepared, nothing of its prompt computed or cached yet, not tied to another request."""
        return (
            self.phase is Phase.PREFILL and not self._prefilled and self.leader is None and not self.followers
        )

    @property
    def can_lead(self) -> bool:
        """Prefilling its own cache (not waiting for someone else's)."""
        return self.phase is Phase.PREFILL and self.leader is None

    def shared_prefix_with(self, other: ActiveGeneration) -> int:
        """Prompt tokens this request shares with `other` (same partition only), leaving at least
        one of its own to run (its first token's logits)."""
        if other.partition_key != self.partition_key:
            return 0
        ids, images = self.prompt_signature
        other_ids, other_images = other.prompt_signature
        return min(shared_prefix_length(ids, images, other_ids, other_images), self.prompt_tokens - 1)

    def follow(self, leader: ActiveGeneration, tokens: int) -> None:
        """Wait for `leader`'s cache to cover the first `tokens` prompt tokens, then start from
        them instead of computing them (they count as cached tokens)."""
        self.leader, self.shared_tokens = leader, tokens
        leader.followers.append(self)
        leader._share_with_followers()  # it may be past that point already

    def _share_with_followers(self) -> None:
        """Followers whose shared prefix this request's cache now covers start from it."""
        for follower in list(self.followers):
            if follower.done:
                self.followers.remove(follower)
            elif follower.shared_tokens <= self._prefilled:
                self.followers.remove(follower)
                follower.start_from(
                    [(layer.keys, layer.values) for layer in self._cache], follower.shared_tokens
                )

    def start_from(self, layers: list[tuple[Any, Any]], tokens: int) -> None:
        """Start from the first `tokens` positions of another request's per-layer (keys, values)
        (views, not copies) instead of computing them; they count as cached tokens."""
        self._cache = views(layers, tokens, self._loaded.kv_layout)
        self._prefilled = self.cached_tokens = self.shared_tokens = tokens
        self.shared_in_flight = True
        self.leader = None

    def _stop_sharing(self) -> None:
        """This request ended: its followers that still wait compute their prefix themselves
        (or find another leader), and it stops waiting for its own leader."""
        for follower in self.followers:
            follower.leader, follower.shared_tokens = None, 0
        self.followers = []
        if self.leader is not None and self in self.leader.followers:
            self.leader.followers.remove(self)
        self.leader = None

    def prefilled_elsewhere(self, token: int, score: Score | None) -> None:
        """Its prompt ran in a shared forward (its KV row is in the batch already), which drew
        its first token: take it."""
        assert self._inputs is not None
        self._prefilled = self.prompt_tokens
        self._inputs.release_prompt()
        self._cache = []
        self.phase = Phase.DECODE
        self.accept(token, score)

    def hand_over_cache(self) -> list[Any]:
        """The prefilled KV cache, for the decode batch (which owns it from now on)."""
        cache, self._cache = self._cache, []
        return cache

    # -- tokens -------------------------------------------------------------------------------

    def _take_first(self, logits: Any) -> None:
        """Draw the first token (after the prompt's last chunk ran here), scored when asked, and
        take it."""
        draw = self.draw
        assert draw is not None
        token = draw.sample(logits).reshape(-1)
        score_chosen([draw], token)
        value = int(token.item())
        draw.took([value])
        self.accept(value, draw.take_score())

    def take_prompt_hidden(self) -> tuple[int, Any] | None:
        """(the first prompt position they cover, the prompt's last hidden states [1, n, hidden]
        from there to its end) once, for a drafter model; None when they were not kept (another
        request's forward ran the prompt, or a drafter is not in use)."""
        import mlx.core as mx

        chunks, self._prompt_hidden = self._prompt_hidden, None
        if not chunks or self._prefilled < self.prompt_tokens:
            return None
        hidden = chunks[0] if len(chunks) == 1 else mx.concatenate(chunks, axis=1)
        return self.prompt_tokens - int(hidden.shape[1]), hidden

    @property
    def tokens_left(self) -> int:
        """Tokens this request may still generate."""
        return max(0, self._max_tokens - len(self._generated))

    def accept(self, token: int, score: Score | None = None) -> None:
        """Take `token` (its logprob `score` when asked): the sequence grows by it and the output
        side sends what it settles."""
        self.clock.tick()
        self.last_token = token
        self._generated.append(token)
        if self.output.take(token, end_of_sequence=token in self._loaded.eos_token_ids, score=score):
            self.finish(pb.FINISH_REASON_STOP)
        elif len(self._generated) >= self._max_tokens:
            self.finish(pb.FINISH_REASON_LENGTH)

    # -- the end --------------------------------------------------------------------------------

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
        self._cache = []
        self._stop_sharing()
        if self.job.request.kind is JobKind.GENERATE:
            self.output.finished(
                prompt_tokens=self.prompt_tokens, cached_tokens=self.cached_tokens, clock=self.clock
            )

    def keep_prefix(self, cache: list[Any]) -> None:
        """Offer the finished request's KV cache (one row) to the prefix cache."""
        inputs = self._inputs
        if self._prefix_cache is None or inputs is None or not self._generated or not cache:
            return
        # The cache holds the prompt and the generated tokens fed back so far: all of them when
        # the row left after its last token went into a (double-buffered) forward, all but the
        # last when it left before.
        # After a verify step it may also hold accepted drafts past the token the row stopped at
        # (EOS, a stop sequence): those positions are cut, and the offsets say so.
        covered = [*inputs.token_ids, *self._generated][: getattr(cache[0], "offset", 0)]
        own_copy(cache, len(covered))
        for layer in cache:
            if isinstance(getattr(layer, "offset", None), int) and layer.offset > len(covered):
                layer.offset = len(covered)
        self._prefix_cache.store(self.job.request.partition_key, covered, inputs.image_spans, cache)

    def fail(self, error: RequestError) -> None:
        if self.phase is Phase.DONE:
            return
        self.phase = Phase.DONE
        self._cache = []
        self._inputs = None
        self._stop_sharing()
        self.output.failed(error)

    def report(self) -> JobReport:
        output = self.output
        return JobReport(
            request_id=self.job.request_id,
            finish_reason=output.finish_reason,
            prompt_tokens=self.prompt_tokens,
            output_tokens=output.output_tokens,
            tokens_after_cancel=output.tokens_after_cancel,
            image_count=self.image_count,
            cached_tokens=self.cached_tokens,
            token_ids=tuple(self._generated),
        )

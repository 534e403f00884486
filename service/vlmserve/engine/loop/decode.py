"""One request on the generation thread: prepare its inputs, prefill in chunks, then take tokens.

A request's own work is `prepare()` (processor, vision features, prefix-cache lookup) and
`prefill(budget)` (the next chunk of its prompt, single-row, so its KV cache and first token are
exactly what it gets alone). Once prefilled it hands its KV cache to the `DecodeBatch`
(batch.py), which runs one forward for all decoding requests per step and gives each row's
logits back to `sample()`; `accept()` turns the chosen token into output events.

Per-request position state (Qwen2-VL's M-RoPE `rope_deltas`) travels with the request (and then
with its batch row) and is passed explicitly on every call, instead of relying on the state
mlx-vlm keeps on the model, which belongs to whichever request ran last.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import numpy as np

from vlmserve.engine.grammar.processor import GrammarLogitsProcessor
from vlmserve.engine.jobs import (
    CountedEvent,
    FailedEvent,
    FinishedEvent,
    Job,
    JobKind,
    JobReport,
    ReasoningEvent,
    TextEvent,
    ToolCallDeltaEvent,
    ToolCallEvent,
)
from vlmserve.engine.loop.kv_cache import new_prompt_cache, own_copy, views
from vlmserve.engine.loop.logprobs import LogprobTrace, StepScores, score_rows
from vlmserve.engine.loop.model_inputs import ImageSpan, ModelInputs, build_model_inputs, prompt_image_spans
from vlmserve.engine.loop.prefix_cache import (
    PrefixCache,
    PromptImages,
    prompt_images,
    shared_prefix_length,
)
from vlmserve.engine.loop.sampling import TokenSampler
from vlmserve.engine.loop.vision_cache import VisionFeatureCache
from vlmserve.engine.model import LoadedModel
from vlmserve.engine.output.assembler import OutputAssembler, OutputPiece, Reasoning
from vlmserve.engine.output.detokenizer import IncrementalDetokenizer
from vlmserve.engine.request_errors import RequestError, context_too_long
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = ["ActiveGeneration", "LogitsProcessor", "Phase", "score_chosen"]

log = logging.getLogger(__name__)

# In the mlx-lm convention `processor(tokens, logits) -> logits`: tokens = the ids so far, prompt
# then generated (1-D int32), logits shape (1, vocab); typed loosely (no MLX types here).
LogitsProcessor = Callable[[Any, Any], Any]


# Prefill arguments a shared, left-padded prefill forward knows how to carry (the grids only
# matter to a forward that computes positions itself; this one is given them).
_GROUPABLE_PREFILL_KWARGS = frozenset({"position_ids", "rope_deltas", "image_grid_thw", "video_grid_thw"})


class Phase(enum.Enum):
    PREPARE = 1
    PREFILL = 2
    DECODE = 3
    DONE = 4


class ActiveGeneration:
    """Generation-thread state of one job. Not thread-safe: the generation thread only."""

    def __init__(
        self,
        job: Job,
        loaded: LoadedModel,
        *,
        prefill_chunk_tokens: int,
        prefix_cache: PrefixCache | None = None,
        vision_cache: VisionFeatureCache | None = None,
    ) -> None:
        self.job = job
        self._loaded = loaded
        self._prefix_cache = prefix_cache
        self._vision_cache = vision_cache
        self._chunk = max(1, prefill_chunk_tokens)
        self.phase = Phase.PREPARE
        request = job.request
        self._assembler = OutputAssembler(
            stop=request.settings.stop,
            tool_call_format=request.tool_call_format,
            parallel_tool_calls=request.parallel_tool_calls,
            max_tool_calls=request.max_tool_calls,
            thinking=request.thinking,
            tools=request.tools,
            track_spans=request.settings.logprobs,
        )
        self.started_at = time.perf_counter()
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        # Seconds since the previous token, after each accept() past the first (metrics).
        self.inter_token_seconds: float | None = None
        # Those gaps not yet read by the metrics (a verify step accepts several tokens at once).
        self.token_gaps: list[float] = []
        # Whether prepare() reached the prefix-cache lookup (metrics: its hit rate).
        self.prefix_looked_up = False
        self.prompt_tokens = 0
        # Prompt tokens not prefilled: from the prefix cache, or (`shared_in_flight`) taken from
        # another request in flight.
        self.cached_tokens = 0
        self.shared_in_flight = False
        self.output_tokens = 0
        # Output tokens generated inside <think>...</think> (the closing tag included).
        self.reasoning_tokens = 0
        self.tokens_after_cancel = 0
        self.finish_reason: pb.FinishReason.ValueType = pb.FINISH_REASON_UNSPECIFIED
        self._max_tokens = request.settings.max_tokens
        # Per-request logits processors (the grammar's), applied before sampling.
        self._processors: list[LogitsProcessor] = []
        self._recent: list[int] = []
        self._generated: list[int] = []
        self._inputs: ModelInputs | None = None
        self._prefilled = 0
        self._cache: list[Any] = []
        self.last_token = 0
        self._sampler: TokenSampler | None = None
        self._detokenizer: IncrementalDetokenizer | None = None
        # Logprobs (only when asked): the logits the last token was drawn from, until scored;
        # its score, until accepted; the tokens not yet matched to visible text.
        self.top_logprobs = request.settings.top_logprobs
        self.scored_logits: Any = None
        # (the step's scores, this row's index in them)
        self.token_score: tuple[StepScores, int] | None = None
        self._trace = LogprobTrace() if request.settings.logprobs else None
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
            self.job.emit(CountedEvent(input_tokens=self.prompt_tokens, image_count=self.image_count))
            self.phase = Phase.DONE
            return
        if self.prompt_tokens >= info.context_length:
            raise context_too_long(self.prompt_tokens, info.context_length)
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
        self._sampler = TokenSampler(request.settings, self._loaded.model.config)
        self._processors = self.new_logits_processors()
        self._detokenizer = IncrementalDetokenizer(self._loaded.tokenizer, keep=self._loaded.kept_tokens)
        self._recent = list(inputs.token_ids[-20:])
        self.phase = Phase.PREFILL

    def new_logits_processors(self) -> list[LogitsProcessor]:
        """This request's logits processors, fresh (they keep state), in the order applied."""
        constraint = self.job.request.constraint
        if constraint is None:
            return []
        return [
            GrammarLogitsProcessor(
                constraint.grammar,
                self._loaded.grammar.tokenizer,
                eos_token_ids=self._loaded.eos_token_ids,
                max_new_tokens=self._max_tokens,
                thinking_end_token_id=constraint.thinking_end_token_id,
            )
        ]

    @property
    def next_chunk_tokens(self) -> int:
        """Size of the next prefill chunk. Chunks are always whole (only the last is shorter),
        whatever else runs in the step, so a request's KV cache and first token do not depend
        on the company it keeps."""
        return min(self._chunk, self.prompt_tokens - self._prefilled)

    def prefill(self) -> int:
        """Run the next prompt chunk; returns its size.

        The last chunk yields the first token; then the request is in DECODE (or DONE).
        """
        import mlx.core as mx

        inputs = self._inputs
        assert inputs is not None
        language_model = self._loaded.model.language_model
        start = self._prefilled
        end = start + self.next_chunk_tokens
        output = language_model(
            inputs.input_ids[:, start:end],
            inputs_embeds=inputs.embeds[:, start:end],
            cache=self._cache,
            **inputs.prefill_kwargs,
        )
        self._prefilled = end
        self._share_with_followers()
        if end < self.prompt_tokens:
            mx.eval([c.state for c in self._cache])
            return end - start
        inputs.release_prompt()  # the prompt's embeddings are in the cache now
        self.phase = Phase.DECODE
        self.accept(self._chosen(self.sample(output.logits[:, -1, :])))
        return end - start

    @property
    def can_prefill_together(self) -> bool:
        """Whether the rest of this prompt can share one prefill forward with others' (batch.py):
        it is all one chunk, nobody waits on this request's own cache (followers) nor it on
        someone else's (a leader), and it carries its positions explicitly (Qwen-style M-RoPE
        position ids), so padding cannot shift them. It may start from a cached prefix."""
        inputs = self._inputs
        if inputs is None or self.phase is not Phase.PREFILL or self.followers or self.leader is not None:
            return False
        positions = inputs.prefill_kwargs.get("position_ids")
        return (
            self.prefill_remaining <= self._chunk
            and positions is not None
            and positions.ndim in (2, 3)
            and inputs.rope_deltas is not None  # M-RoPE (Qwen-VL family): positions are all explicit
            and set(inputs.prefill_kwargs) <= _GROUPABLE_PREFILL_KWARGS
        )

    @property
    def remaining_prompt_arrays(self) -> tuple[Any, Any, Any]:
        """The prompt not prefilled yet: (input ids [1, n], embeddings [1, n, hidden], position
        ids [3, 1, n])."""
        import mlx.core as mx

        inputs = self._inputs
        assert inputs is not None
        start = self._prefilled
        positions = inputs.prefill_kwargs["position_ids"]
        if positions.ndim == 2:  # text only: the same position on all three M-RoPE axes
            positions = mx.broadcast_to(positions[None], (3, *positions.shape))
        return inputs.input_ids[:, start:], inputs.embeds[:, start:], positions[..., start:]

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

    def prefilled_elsewhere(self, logits: Any) -> None:
        """Its prompt ran in a shared forward (its KV row is in the batch already): take the first token."""
        assert self._inputs is not None
        self._prefilled = self.prompt_tokens
        self._inputs.release_prompt()
        self._cache = []
        self.phase = Phase.DECODE
        self.accept(self._chosen(self.sample(logits)))

    def hand_over_cache(self) -> list[Any]:
        """The prefilled KV cache, for the decode batch (which owns it from now on)."""
        cache, self._cache = self._cache, []
        return cache

    # -- tokens and results -----------------------------------------------------------------

    def sample(self, logits: Any) -> Any:
        """This request's next token (lazy array [1]) from its logits row [1, vocab]."""
        assert self._sampler is not None
        logits = self.processed_logits(logits)
        if self._trace is not None:
            self.scored_logits = logits
        return self._sampler.choose(logits)

    def processed_logits(self, logits: Any, drafts: Sequence[int] = ()) -> Any:
        """The logits [1, vocab] a token is drawn from: the grammar and logits processors, then
        the repetition penalty, as of the tokens so far followed by `drafts` (a speculative
        verify judges each draft as if those before it had been generated)."""
        import mlx.core as mx

        assert self._sampler is not None
        if self._processors:
            assert self._inputs is not None
            so_far = mx.array([*self._inputs.token_ids, *self._generated, *drafts], dtype=mx.int32)
            for processor in self._processors:
                logits = processor(so_far, logits)
        return self._sampler.penalize(logits, [*self._recent, *drafts] if drafts else self._recent)

    # -- speculative decoding (speculation/, batch.py) ------------------------------------------

    @property
    def sampler(self) -> TokenSampler:
        assert self._sampler is not None
        return self._sampler

    @property
    def context_tokens(self) -> tuple[Sequence[int], Sequence[int]]:
        """(prompt token ids, generated token ids): the history drafts are looked up in."""
        assert self._inputs is not None
        return self._inputs.token_ids, self._generated

    @property
    def can_draft(self) -> bool:
        """Drafts can be verified for this row: no logprobs (each verified position would need
        its own score) and no logits processors but the grammar's."""
        return self._trace is None and all(isinstance(p, GrammarLogitsProcessor) for p in self._processors)

    def forced_tokens(self, pending: Sequence[int]) -> list[int]:
        """The tokens the row's grammar forces after its tokens so far and `pending` (grammar
        fast-forward); none without a grammar."""
        grammar = next((p for p in self._processors if isinstance(p, GrammarLogitsProcessor)), None)
        if grammar is None or self._inputs is None:
            return []
        return grammar.forced_after([*self._inputs.token_ids, *self._generated, *pending])

    @property
    def tokens_left(self) -> int:
        """Tokens this request may still generate."""
        return max(0, self._max_tokens - self.output_tokens)

    def _chosen(self, token: Any) -> int:
        """A token drawn alone (the first one, after prefill): scored here when asked."""
        score_chosen([self], token.reshape(-1))
        return int(token.item())

    @property
    def next_token_is_last(self) -> bool:
        """Whether the next token accepted ends the request by length (its max tokens)."""
        return self.output_tokens + 1 >= self._max_tokens

    def accept(self, token: int) -> None:
        scored, self.token_score = self.token_score, None
        now = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = now
        self.inter_token_seconds = None if self.last_token_at is None else now - self.last_token_at
        if self.inter_token_seconds is not None:
            self.token_gaps.append(self.inter_token_seconds)
        self.last_token_at = now
        self.output_tokens += 1
        if self._assembler.in_reasoning:
            self.reasoning_tokens += 1
        if self.job.cancelled:
            self.tokens_after_cancel += 1
        self.last_token = token
        self._recent.append(token)
        self._generated.append(token)
        if token in self._loaded.eos_token_ids:
            self.finish(pb.FINISH_REASON_STOP)
            return
        assert self._detokenizer is not None
        if self._trace is not None:
            assert scored is not None, "a request with logprobs took an unscored token"
            score = scored[0].row(scored[1])
            alternatives = self._detokenizer.preview([alternative for alternative, _ in score.top])
            text = self._detokenizer.add(token)
            self._trace.add(text, score, alternatives)
        else:
            text = self._detokenizer.add(token)
        self._emit(self._assembler.feed(text))
        if self._assembler.stopped:
            self.finish(pb.FINISH_REASON_STOP)
        elif self.output_tokens >= self._max_tokens:
            self.finish(pb.FINISH_REASON_LENGTH)

    def _emit(self, pieces: list[OutputPiece]) -> None:
        spans = iter(
            self._assembler.text_spans[
                len(self._assembler.text_spans) - sum(isinstance(p, str) for p in pieces) :
            ]
        )
        for piece in pieces:
            if isinstance(piece, str):
                trace = self._trace
                shown = [entry for span in next(spans) for entry in trace.shown(*span)] if trace else []
                self.job.emit(TextEvent(piece, tuple(shown)))
            elif isinstance(piece, Reasoning):
                self.job.emit(ReasoningEvent(piece.text))
            elif isinstance(piece, pb.ToolCallDelta):
                self.job.emit(ToolCallDeltaEvent(piece))
            else:
                self.job.emit(ToolCallEvent(piece))

    def finish(self, reason: pb.FinishReason.ValueType) -> None:
        """End the job with a result (also used for cancellation at any phase)."""
        if self.phase is Phase.DONE:
            return
        failure = self.grammar_failure
        if failure is not None and reason != pb.FINISH_REASON_CANCELLED:
            # The grammar could not be followed (an llguidance limit): the output ended where
            # it was, so it is not what was asked for (a required call may be missing). Say so.
            self.fail(RequestError(grpc.StatusCode.ABORTED, f"constrained decoding stopped: {failure}"))
            return
        if self._detokenizer is not None and not self._assembler.stopped:
            flushed = self._detokenizer.flush()
            if self._trace is not None:
                self._trace.add_text(flushed)
            self._emit(self._assembler.feed(flushed))
        self._emit(self._assembler.finish())
        if self._trace is not None and (settled := self._trace.finish()):
            self.job.emit(TextEvent("", tuple(settled)))
        if reason == pb.FINISH_REASON_STOP and self._assembler.tool_calls:
            reason = pb.FINISH_REASON_TOOL_CALLS
        self.finish_reason = reason
        self.phase = Phase.DONE
        self._cache = []
        self._stop_sharing()
        if self.job.request.kind is JobKind.GENERATE:
            self.job.emit(FinishedEvent(self._result()))

    @property
    def grammar_failure(self) -> str | None:
        """Why the request's grammar could not be followed to its end, if it could not."""
        for processor in self._processors:
            failure = getattr(processor, "failure", None)  # GrammarLogitsProcessor's
            if isinstance(failure, str):
                return failure
        return None

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
        self.job.emit(FailedEvent(error))

    def _result(self) -> pb.GenerateResult:
        now = time.perf_counter()
        first = self.first_token_at
        prefill_seconds = (first - self.started_at) if first is not None else 0.0
        decode_seconds = (now - first) if first is not None else 0.0
        return pb.GenerateResult(
            request_id=self.job.request_id,
            model=self._loaded.info.model_id,
            text=self._assembler.visible_text,
            reasoning_text=self._assembler.reasoning_text,
            tool_calls=self._assembler.tool_calls,
            logprobs=self._trace.listed if self._trace is not None else (),
            finish_reason=self.finish_reason,
            stop_sequence=self._assembler.stop_sequence or "",
            usage=pb.Usage(
                input_tokens=self.prompt_tokens,
                output_tokens=self.output_tokens,
                cached_tokens=self.cached_tokens,
                image_count=self.image_count,
                reasoning_tokens=self.reasoning_tokens,
            ),
            timings=pb.Timings(
                queue_seconds=max(0.0, self.started_at - self.job.submitted_at),
                time_to_first_token_seconds=prefill_seconds,
                total_seconds=now - self.job.submitted_at,
                prefill_tokens_per_second=self.prompt_tokens / prefill_seconds
                if prefill_seconds > 0
                else 0.0,
                decode_tokens_per_second=(
                    (self.output_tokens - 1) / decode_seconds
                    if decode_seconds > 0 and self.output_tokens > 1
                    else 0.0
                ),
            ),
        )

    def report(self) -> JobReport:
        return JobReport(
            request_id=self.job.request_id,
            finish_reason=self.finish_reason,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            tokens_after_cancel=self.tokens_after_cancel,
            image_count=self.image_count,
            cached_tokens=self.cached_tokens,
            token_ids=tuple(self._generated),
        )


def score_chosen(generations: list[ActiveGeneration], tokens: Any) -> None:
    """Score the tokens just drawn ([rows] lazy ids, one per generation) for the generations that
    asked for logprobs, in one batched op (not waited for); each reads its score on accept."""
    import mlx.core as mx

    wanted = [index for index, generation in enumerate(generations) if generation.scored_logits is not None]
    if not wanted:
        return
    chosen = tokens if len(wanted) == len(generations) else tokens[mx.array(wanted, dtype=mx.int32)]
    scores = score_rows(
        [generations[index].scored_logits for index in wanted],
        chosen,
        [generations[index].top_logprobs for index in wanted],
    )
    for row, index in enumerate(wanted):
        generations[index].scored_logits = None
        generations[index].token_score = (scores, row)

"""A row's output side and its clocks (generation thread only).

A row (decode.py `ActiveGeneration`) is its sequence state (phase, token ids, KV cache, prefix
sharing) plus what this module holds for it: `RowOutput`, the request's side of each token (the
sampler and its logits processors, the detokenizer, the output assembler, the logprob trace,
the events sent to the caller and the usage counted), and `RowClock`, when its tokens came.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vlmserve.engine.grammar.processor import GrammarLogitsProcessor
from vlmserve.engine.jobs import (
    CountedEvent,
    FailedEvent,
    FinishedEvent,
    Job,
    ReasoningEvent,
    TextEvent,
    ToolCallDeltaEvent,
    ToolCallEvent,
)
from vlmserve.engine.loop.logprobs import LogprobTrace, StepScores, score_rows
from vlmserve.engine.loop.sampling import TokenSampler
from vlmserve.engine.model import LoadedModel
from vlmserve.engine.output.assembler import OutputAssembler, OutputPiece, Reasoning
from vlmserve.engine.output.detokenizer import IncrementalDetokenizer
from vlmserve.engine.request_errors import RequestError
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = ["LogitsProcessor", "RowClock", "RowOutput", "score_chosen"]

# In the mlx-lm convention `processor(tokens, logits) -> logits`: tokens = the ids so far, prompt
# then generated (1-D int32), logits shape (1, vocab); typed loosely (no MLX types here).
LogitsProcessor = Callable[[Any, Any], Any]


@dataclass(slots=True)
class RowClock:
    """When a row started and took its tokens (perf_counter seconds)."""

    started_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    last_token_at: float | None = None
    # Seconds since the previous token, after each token past the first (metrics).
    inter_token_seconds: float | None = None
    # Those gaps not yet read by the metrics (a verify step accepts several tokens at once).
    token_gaps: list[float] = field(default_factory=list)

    def tick(self) -> None:
        """A token was taken now."""
        now = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = now
        self.inter_token_seconds = None if self.last_token_at is None else now - self.last_token_at
        if self.inter_token_seconds is not None:
            self.token_gaps.append(self.inter_token_seconds)
        self.last_token_at = now


class RowOutput:
    """The request's side of a row: tokens drawn and turned into events. Not thread-safe."""

    def __init__(self, job: Job, loaded: LoadedModel) -> None:
        self.job = job
        self._loaded = loaded
        request = job.request
        self.assembler = OutputAssembler(
            stop=request.settings.stop,
            tool_call_format=request.tool_call_format,
            parallel_tool_calls=request.parallel_tool_calls,
            max_tool_calls=request.max_tool_calls,
            thinking=request.thinking,
            tools=request.tools,
            track_spans=request.settings.logprobs,
        )
        self.output_tokens = 0
        # Output tokens generated inside <think>...</think> (the closing tag included).
        self.reasoning_tokens = 0
        self.tokens_after_cancel = 0
        self.finish_reason: pb.FinishReason.ValueType = pb.FINISH_REASON_UNSPECIFIED
        # Per-request logits processors (the grammar's), applied before sampling.
        self.processors: list[LogitsProcessor] = []
        self._sampler: TokenSampler | None = None
        self._detokenizer: IncrementalDetokenizer | None = None
        # The tokens the repetition penalty looks back on: the prompt's last ones, then generated.
        self._recent: list[int] = []
        # Logprobs (only when asked): the logits the last token was drawn from, until scored;
        # its score, until taken; the tokens not yet matched to visible text.
        self.top_logprobs = request.settings.top_logprobs
        self.scored_logits: Any = None
        # (the step's scores, this row's index in them)
        self.token_score: tuple[StepScores, int] | None = None
        self.trace = LogprobTrace() if request.settings.logprobs else None

    def start(self, prompt_ids: Sequence[int], max_tokens: int) -> None:
        """The prompt is ready (prepare): a sampler, fresh logits processors, a detokenizer."""
        self._sampler = TokenSampler(self.job.request.settings, self._loaded.model.config)
        self.processors = self.new_logits_processors(max_tokens)
        self._detokenizer = IncrementalDetokenizer(self._loaded.tokenizer, keep=self._loaded.kept_tokens)
        self._recent = list(prompt_ids[-20:])

    def new_logits_processors(self, max_tokens: int) -> list[LogitsProcessor]:
        """This request's logits processors, fresh (they keep state), in the order applied."""
        constraint = self.job.request.constraint
        if constraint is None:
            return []
        return [
            GrammarLogitsProcessor(
                constraint.grammar,
                self._loaded.grammar.tokenizer,
                eos_token_ids=self._loaded.eos_token_ids,
                max_new_tokens=max_tokens,
                thinking_end_token_id=constraint.thinking_end_token_id,
            )
        ]

    # -- drawing a token ----------------------------------------------------------------------

    @property
    def sampler(self) -> TokenSampler:
        assert self._sampler is not None
        return self._sampler

    def processed_logits(self, logits: Any, history: list[int], drafts: Sequence[int] = ()) -> Any:
        """The logits [1, vocab] a token is drawn from: the logits processors (given `history`,
        the ids so far and `drafts`), then the repetition penalty, as of the tokens so far
        followed by `drafts` (a speculative verify judges each draft as if those before it had
        been generated)."""
        import mlx.core as mx

        if self.processors:
            so_far = mx.array(history, dtype=mx.int32)
            for processor in self.processors:
                logits = processor(so_far, logits)
        return self.sampler.penalize(logits, [*self._recent, *drafts] if drafts else self._recent)

    def sample(self, logits: Any) -> Any:
        """The next token (lazy array [1]) from processed logits [1, vocab]."""
        if self.trace is not None:
            self.scored_logits = logits
        return self.sampler.choose(logits)

    @property
    def can_draft(self) -> bool:
        """Drafts can be verified: no logprobs (each verified position would need its own score)
        and no logits processors but the grammar's."""
        return self.trace is None and all(isinstance(p, GrammarLogitsProcessor) for p in self.processors)

    @property
    def grammar(self) -> GrammarLogitsProcessor | None:
        return next((p for p in self.processors if isinstance(p, GrammarLogitsProcessor)), None)

    @property
    def grammar_failure(self) -> str | None:
        """Why the request's grammar could not be followed to its end, if it could not."""
        for processor in self.processors:
            failure = getattr(processor, "failure", None)  # GrammarLogitsProcessor's
            if isinstance(failure, str):
                return failure
        return None

    # -- taking a token -----------------------------------------------------------------------

    def take(self, token: int, *, end_of_sequence: bool) -> bool:
        """Count `token` and send what it settles; True when it ends the output (end of sequence,
        a stop sequence, the last tool call allowed)."""
        scored, self.token_score = self.token_score, None
        self.output_tokens += 1
        if self.assembler.in_reasoning:
            self.reasoning_tokens += 1
        if self.job.cancelled:
            self.tokens_after_cancel += 1
        self._recent.append(token)
        if end_of_sequence:
            return True
        assert self._detokenizer is not None
        if self.trace is not None:
            assert scored is not None, "a request with logprobs took an unscored token"
            score = scored[0].row(scored[1])
            alternatives = self._detokenizer.preview([alternative for alternative, _ in score.top])
            text = self._detokenizer.add(token)
            self.trace.add(text, score, alternatives)
        else:
            text = self._detokenizer.add(token)
        self._emit(self.assembler.feed(text))
        return self.assembler.stopped

    def _emit(self, pieces: list[OutputPiece]) -> None:
        assembler = self.assembler
        spans = iter(
            assembler.text_spans[len(assembler.text_spans) - sum(isinstance(p, str) for p in pieces) :]
        )
        for piece in pieces:
            if isinstance(piece, str):
                trace = self.trace
                shown = [entry for span in next(spans) for entry in trace.shown(*span)] if trace else []
                self.job.emit(TextEvent(piece, tuple(shown)))
            elif isinstance(piece, Reasoning):
                self.job.emit(ReasoningEvent(piece.text))
            elif isinstance(piece, pb.ToolCallDelta):
                self.job.emit(ToolCallDeltaEvent(piece))
            else:
                self.job.emit(ToolCallEvent(piece))

    # -- the end ------------------------------------------------------------------------------

    def close(self, reason: pb.FinishReason.ValueType) -> None:
        """The output ends (`reason`): whatever the detokenizer and assembler hold is sent, and
        a stop with tool calls becomes TOOL_CALLS."""
        if self._detokenizer is not None and not self.assembler.stopped:
            flushed = self._detokenizer.flush()
            if self.trace is not None:
                self.trace.add_text(flushed)
            self._emit(self.assembler.feed(flushed))
        self._emit(self.assembler.finish())
        if self.trace is not None and (settled := self.trace.finish()):
            self.job.emit(TextEvent("", tuple(settled)))
        if reason == pb.FINISH_REASON_STOP and self.assembler.tool_calls:
            reason = pb.FINISH_REASON_TOOL_CALLS
        self.finish_reason = reason

    def counted(self, prompt_tokens: int) -> None:
        self.job.emit(CountedEvent(input_tokens=prompt_tokens, image_count=len(self.job.request.images)))

    def failed(self, error: RequestError) -> None:
        self.job.emit(FailedEvent(error))

    def finished(self, *, prompt_tokens: int, cached_tokens: int, clock: RowClock) -> None:
        self.job.emit(FinishedEvent(self._result(prompt_tokens, cached_tokens, clock)))

    def _result(self, prompt_tokens: int, cached_tokens: int, clock: RowClock) -> pb.GenerateResult:
        now = time.perf_counter()
        first = clock.first_token_at
        prefill_seconds = (first - clock.started_at) if first is not None else 0.0
        decode_seconds = (now - first) if first is not None else 0.0
        assembler, submitted_at = self.assembler, self.job.submitted_at
        return pb.GenerateResult(
            request_id=self.job.request_id,
            model=self._loaded.info.model_id,
            text=assembler.visible_text,
            reasoning_text=assembler.reasoning_text,
            tool_calls=assembler.tool_calls,
            logprobs=self.trace.listed if self.trace is not None else (),
            finish_reason=self.finish_reason,
            stop_sequence=assembler.stop_sequence or "",
            usage=pb.Usage(
                input_tokens=prompt_tokens,
                output_tokens=self.output_tokens,
                cached_tokens=cached_tokens,
                image_count=len(self.job.request.images),
                reasoning_tokens=self.reasoning_tokens,
            ),
            timings=pb.Timings(
                queue_seconds=max(0.0, clock.started_at - submitted_at),
                time_to_first_token_seconds=prefill_seconds,
                total_seconds=now - submitted_at,
                prefill_tokens_per_second=prompt_tokens / prefill_seconds if prefill_seconds > 0 else 0.0,
                decode_tokens_per_second=(
                    (self.output_tokens - 1) / decode_seconds
                    if decode_seconds > 0 and self.output_tokens > 1
                    else 0.0
                ),
            ),
        )


def score_chosen(outputs: Sequence[RowOutput], tokens: Any) -> None:
    """Score the tokens just drawn ([rows] lazy ids, one per row) for the rows that asked for
    logprobs, in one batched op (not waited for); each reads its score when it takes its token."""
    import mlx.core as mx

    wanted = [index for index, output in enumerate(outputs) if output.scored_logits is not None]
    if not wanted:
        return
    chosen = tokens if len(wanted) == len(outputs) else tokens[mx.array(wanted, dtype=mx.int32)]
    scores = score_rows(
        [outputs[index].scored_logits for index in wanted],
        chosen,
        [outputs[index].top_logprobs for index in wanted],
    )
    for row, index in enumerate(wanted):
        outputs[index].scored_logits = None
        outputs[index].token_score = (scores, row)

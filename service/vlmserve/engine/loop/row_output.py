"""A row's output side and its clocks (generation thread only).

A row (decode.py `ActiveGeneration`) is its sequence state (phase, prompt state, token ids, KV
cache, prefix sharing) plus what this module holds for it: `RowOutput`, the request's side of each token taken
(the detokenizer, the output assembler, the logprob trace, the events sent to the caller and the
usage counted), and `RowClock`, when its tokens came. How its tokens are drawn (sampler, logits
processors) is draw.py's: the decode batch holds that part.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

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
from vlmserve.engine.loop.draw import Score
from vlmserve.engine.loop.logprobs import LogprobTrace
from vlmserve.engine.model import LoadedModel
from vlmserve.engine.output.assembler import OutputAssembler, OutputPiece, Reasoning
from vlmserve.engine.output.detokenizer import IncrementalDetokenizer
from vlmserve.engine.request_errors import RequestError
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = ["RowClock", "RowOutput"]


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
    """The request's side of a row: tokens taken and turned into events. Not thread-safe."""

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
        self._detokenizer: IncrementalDetokenizer | None = None
        # Logprobs (only when asked): the tokens not yet matched to visible text.
        self.trace = LogprobTrace() if request.settings.logprobs else None

    def start(self) -> None:
        """The prompt is ready (prepare): a detokenizer."""
        self._detokenizer = IncrementalDetokenizer(self._loaded.tokenizer, keep=self._loaded.kept_tokens)

    # -- taking a token -----------------------------------------------------------------------

    def take(self, token: int, *, end_of_sequence: bool, score: Score | None = None) -> bool:
        """Count `token` (with its logprob `score` when asked) and send what it settles; True when
        it ends the output (end of sequence, a stop sequence, the last tool call allowed)."""
        self.output_tokens += 1
        if self.assembler.in_reasoning:
            self.reasoning_tokens += 1
        if self.job.cancelled:
            self.tokens_after_cancel += 1
        if end_of_sequence:
            return True
        assert self._detokenizer is not None
        if self.trace is not None:
            assert score is not None, "a request with logprobs took an unscored token"
            scored = score[0].row(score[1])
            alternatives = self._detokenizer.preview([alternative for alternative, _ in scored.top])
            text = self._detokenizer.add(token)
            self.trace.add(text, scored, alternatives)
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

"""One request on the generation thread: prepare inputs, prefill in chunks, decode token by token.

Each `step()` does one bounded piece of work (input preparation, one prefill chunk, or one
decoded token), so the generator can interleave requests and check cancellation between steps.
Built from mlx-vlm's own pieces: `prepare_inputs`, `Model.get_input_embeddings`, the language
model called with a per-request KV cache, and its sample utilities.

Per-request position state (Qwen2-VL's M-RoPE `rope_deltas`) is passed explicitly on every
call instead of relying on the state mlx-vlm keeps on the model, which belongs to whichever
request ran last.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc

from vlmserve.engine.v1 import engine_pb2 as pb

from .detokenizer import IncrementalDetokenizer
from .grammar_processor import GrammarLogitsProcessor
from .jobs import CountedEvent, FailedEvent, FinishedEvent, Job, JobKind, JobReport, TextEvent, ToolCallEvent
from .model import LoadedModel, prompt_needs_special_tokens
from .output import OutputAssembler
from .prefix_cache import PrefixCache
from .request_errors import RequestError
from .sampling import TokenSampler

__all__ = ["ActiveGeneration", "LogitsProcessor"]

# mlx-lm / mlx-vlm convention: (ids so far, logits (1, vocab)) -> logits.
LogitsProcessor = Callable[[Any, Any], Any]

log = logging.getLogger(__name__)

_INPUT_KEYS = ("input_ids", "pixel_values", "attention_mask")


class _Phase(enum.Enum):
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
    ) -> None:
        self.job = job
        self._loaded = loaded
        self._prefix_cache = prefix_cache
        self._chunk = max(1, prefill_chunk_tokens)
        self._phase = _Phase.PREPARE
        request = job.request
        self._assembler = OutputAssembler(
            stop=request.settings.stop,
            tool_call_format=request.tool_call_format,
            assistant_prefix=request.assistant_prefix,
            parallel_tool_calls=request.parallel_tool_calls,
            max_tool_calls=request.max_tool_calls,
        )
        self.started_at = time.perf_counter()
        self.first_token_at: float | None = None
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.output_tokens = 0
        self.tokens_after_cancel = 0
        self.finish_reason: pb.FinishReason.ValueType = pb.FINISH_REASON_UNSPECIFIED
        self._max_tokens = request.settings.max_tokens
        self._recent: list[int] = []
        self._prompt_ids: list[int] = []
        self._generated: list[int] = []
        self._input_ids: Any = None
        self._embeds: Any = None
        self._prefill_kwargs: dict[str, Any] = {}
        self._decode_kwargs: dict[str, Any] = {}
        self._prefilled = 0
        self._cache: list[Any] = []
        self._last_token = 0
        self._sampler: TokenSampler | None = None
        # Per-request logits processors (the grammar), applied before sampling; they see the
        # ids so far (`_token_ids`: prompt then generated), as in mlx-lm / mlx-vlm.
        self._processors: list[LogitsProcessor] = []
        self._token_ids: Any = None
        self._detokenizer: IncrementalDetokenizer | None = None

    @property
    def done(self) -> bool:
        return self._phase is _Phase.DONE

    @property
    def image_count(self) -> int:
        return len(self.job.request.images)

    def step(self) -> None:
        """One bounded unit of work; afterwards `done` says whether the job has ended."""
        if self._phase is _Phase.PREPARE:
            self._prepare()
        elif self._phase is _Phase.PREFILL:
            self._prefill_step()
        elif self._phase is _Phase.DECODE:
            self._decode_step()

    # -- phases -----------------------------------------------------------------------------

    def _prepare(self) -> None:
        from mlx_vlm import utils
        from mlx_vlm.models.cache import make_prompt_cache

        prepare_inputs: Any = utils.prepare_inputs  # unannotated in mlx-vlm

        request = self.job.request
        model = self._loaded.model
        processor = self._loaded.processor
        info = self._loaded.info
        try:
            inputs = prepare_inputs(
                processor,
                images=list(request.images) or None,
                prompts=[request.prompt_text],
                add_special_tokens=prompt_needs_special_tokens(request.prompt_text, self._loaded.tokenizer),
            )
        except (ValueError, TypeError, OSError) as error:
            raise RequestError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the model's processor could not prepare the input: {error}",
                field="messages",
            ) from None
        input_ids = inputs["input_ids"]
        self.prompt_tokens = int(input_ids.shape[-1])
        if request.kind is JobKind.COUNT_TOKENS:
            self.job.emit(CountedEvent(input_tokens=self.prompt_tokens, image_count=self.image_count))
            self._phase = _Phase.DONE
            return
        if self.prompt_tokens >= info.context_length:
            # OUT_OF_RANGE, not INVALID_ARGUMENT: the same prompt fits a model with a longer
            # context, and callers (the facade) can answer "context length exceeded" precisely.
            raise RequestError(
                grpc.StatusCode.OUT_OF_RANGE,
                f"the prompt is {self.prompt_tokens} tokens; the model's context length is "
                f"{info.context_length} tokens, which must hold the prompt and at least one generated token",
                field="messages",
            )
        self._max_tokens = min(self._max_tokens, info.context_length - self.prompt_tokens)
        extra = {k: v for k, v in inputs.items() if k not in _INPUT_KEYS and v is not None}
        embedding = model.get_input_embeddings(
            input_ids, inputs.get("pixel_values"), mask=inputs.get("attention_mask"), **extra
        )
        self._embeds = embedding.inputs_embeds
        derived = {k: v for k, v in embedding.to_dict().items() if k != "inputs_embeds" and v is not None}
        self._prefill_kwargs = {**extra, **derived}
        if "rope_deltas" in derived:
            self._decode_kwargs = {"rope_deltas": derived["rope_deltas"]}
        self._input_ids = input_ids
        self._prompt_ids = [int(t) for t in input_ids[0].tolist()]
        taken = self._prefix_cache.take(self._prompt_ids) if self._prefix_cache is not None else None
        if taken is not None:
            self._cache, self._prefilled = taken
            self.cached_tokens = self._prefilled
        else:
            self._cache = make_prompt_cache(model.language_model)
        self._sampler = TokenSampler(request.settings, model.config)
        if request.constraint is not None:
            self._processors = [
                GrammarLogitsProcessor(
                    request.constraint.grammar,
                    self._loaded.grammar.tokenizer,
                    eos_token_ids=self._loaded.eos_token_ids,
                    max_new_tokens=self._max_tokens,
                )
            ]
            self._token_ids = input_ids.reshape(-1)
        self._detokenizer = IncrementalDetokenizer(self._loaded.tokenizer)
        self._recent = self._prompt_ids[-20:]
        self._phase = _Phase.PREFILL

    def _prefill_step(self) -> None:
        import mlx.core as mx

        language_model = self._loaded.model.language_model
        total = int(self._embeds.shape[1])
        start = self._prefilled
        if total - start > self._chunk:
            end = start + self._chunk
            language_model(
                self._input_ids[:, start:end],
                inputs_embeds=self._embeds[:, start:end],
                cache=self._cache,
                **self._prefill_kwargs,
            )
            mx.eval([c.state for c in self._cache])
            self._prefilled = end
            return
        output = language_model(
            self._input_ids[:, start:],
            inputs_embeds=self._embeds[:, start:],
            cache=self._cache,
            **self._prefill_kwargs,
        )
        self._prefilled = total
        self._embeds = None  # the prompt's embeddings are in the cache now
        self._phase = _Phase.DECODE
        self._take_token(output.logits[:, -1, :])

    def _decode_step(self) -> None:
        import mlx.core as mx

        output = self._loaded.model.language_model(
            mx.array([[self._last_token]]), cache=self._cache, **self._decode_kwargs
        )
        self._take_token(output.logits[:, -1, :])

    # -- tokens and results -----------------------------------------------------------------

    def _take_token(self, logits: Any) -> None:
        import mlx.core as mx

        assert self._sampler is not None
        for processor in self._processors:
            logits = processor(self._token_ids, logits)
        token = int(self._sampler(logits, self._recent).item())
        if self._processors:
            step = mx.array([token], dtype=self._token_ids.dtype)
            self._token_ids = mx.concatenate([self._token_ids, step])
        now = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = now
        self.output_tokens += 1
        if self.job.cancelled:
            self.tokens_after_cancel += 1
        self._last_token = token
        self._recent.append(token)
        self._generated.append(token)
        if token in self._loaded.eos_token_ids:
            self.finish(pb.FINISH_REASON_STOP)
            return
        assert self._detokenizer is not None
        self._emit(self._assembler.feed(self._detokenizer.add(token)))
        if self._assembler.stopped:
            self.finish(pb.FINISH_REASON_STOP)
        elif self.output_tokens >= self._max_tokens:
            self.finish(pb.FINISH_REASON_LENGTH)

    def _emit(self, pieces: list[str | pb.ToolCall]) -> None:
        for piece in pieces:
            self.job.emit(TextEvent(piece) if isinstance(piece, str) else ToolCallEvent(piece))

    def finish(self, reason: pb.FinishReason.ValueType) -> None:
        """End the job with a result (also used for cancellation at any phase)."""
        if self._phase is _Phase.DONE:
            return
        if self._detokenizer is not None and not self._assembler.stopped:
            self._emit(self._assembler.feed(self._detokenizer.flush()))
        self._emit(self._assembler.finish())
        if reason == pb.FINISH_REASON_STOP and self._assembler.tool_calls:
            reason = pb.FINISH_REASON_TOOL_CALLS
        self.finish_reason = reason
        self._phase = _Phase.DONE
        if self._prefix_cache is not None and self._generated:
            # The cache holds the prompt and every generated token but the last (never fed back).
            self._prefix_cache.store(self._prompt_ids + self._generated[:-1], self._cache)
        self._release()
        if self.job.request.kind is JobKind.GENERATE:
            self.job.emit(FinishedEvent(self._result()))

    def fail(self, error: RequestError) -> None:
        if self._phase is _Phase.DONE:
            return
        self._phase = _Phase.DONE
        self._release()
        self.job.emit(FailedEvent(error))

    def _release(self) -> None:
        self._cache = []
        self._embeds = None
        self._input_ids = None

    def _result(self) -> pb.GenerateResult:
        now = time.perf_counter()
        first = self.first_token_at
        prefill_seconds = (first - self.started_at) if first is not None else 0.0
        decode_seconds = (now - first) if first is not None else 0.0
        return pb.GenerateResult(
            request_id=self.job.request_id,
            model=self._loaded.info.model_id,
            text=self._assembler.visible_text,
            tool_calls=self._assembler.tool_calls,
            finish_reason=self.finish_reason,
            usage=pb.Usage(
                input_tokens=self.prompt_tokens,
                output_tokens=self.output_tokens,
                cached_tokens=self.cached_tokens,
                image_count=self.image_count,
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
        )

"""What the engine tells about its work: metrics, spans and log lines (generation thread, but
`state`, read at scrape time).

The serve loop (generator.py) hands the observer each step's result (`stepped`: batch size,
inter-token gaps, speculative decoding's counts) and each row it retires (`retired`: the job's
report kept, its counters, its queue/prefill/decode spans, one log line). Nothing here decides
anything the engine does.
"""

from __future__ import annotations

import collections
import logging
import time

from vlmserve.common.tracing import record_span
from vlmserve.engine.jobs import JobKind, JobReport
from vlmserve.engine.loop.admission import Admission
from vlmserve.engine.loop.decode import ActiveGeneration
from vlmserve.engine.loop.prefix_cache import PrefixCache
from vlmserve.engine.loop.runner import StepResult
from vlmserve.engine.loop.vision_cache import VisionFeatureCache
from vlmserve.engine.metrics import EngineMetrics, EngineState
from vlmserve.engine.speculation.drafter import SOURCES, SpeculationCounts
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = ["EngineObserver"]

log = logging.getLogger(__name__)


class EngineObserver:
    def __init__(self, metrics: EngineMetrics, admission: Admission) -> None:
        self.metrics = metrics
        self._admission = admission
        # Recent finished jobs, newest last (logs, tests, metrics).
        self.reports: collections.deque[JobReport] = collections.deque(maxlen=256)
        # The loaded model's caches, once built (read by `state` and the prefix-hit counters).
        self.prefix_cache: PrefixCache | None = None
        self.vision_cache: VisionFeatureCache | None = None
        metrics.watch(self.state)

    def watch_caches(self, prefix_cache: PrefixCache, vision_cache: VisionFeatureCache) -> None:
        """The loaded model's caches (wiring.py), read from now on."""
        self.prefix_cache, self.vision_cache = prefix_cache, vision_cache

    def state(self) -> EngineState:
        admission, vision, prefixes = self._admission, self.vision_cache, self.prefix_cache
        disk = prefixes.disk if prefixes is not None else None
        return EngineState(
            queued=admission.queued,
            active=admission.active,
            vision_cache_hits=vision.hits if vision is not None else 0,
            vision_cache_encoded=vision.encoded if vision is not None else 0,
            prefix_cache_hits=dict(prefixes.hits) if prefixes is not None else {},
            prefix_cache_bytes={
                "memory": prefixes.bytes if prefixes is not None else 0,
                "disk": disk.bytes if disk is not None and disk.enabled else 0,
            },
            memory_reserved=admission.memory_in_use,
            memory_budget=admission.memory.budget_bytes if admission.memory is not None else 0,
            memory_refused=admission.memory_refused,
            prefix_disk_enabled=disk.enabled if disk is not None else None,
            prefix_disk_pending_bytes=disk.pending_bytes if disk is not None else 0,
        )

    def stepped(self, result: StepResult, speculation: SpeculationCounts | None) -> None:
        """A step ran: its batch size and each advanced row's token gaps; speculation's counts."""
        metrics = self.metrics
        if result.advanced:
            metrics.batch_size.observe(len(result.advanced))
        for advance in result.advanced:
            for gap in advance.row.clock.token_gaps:
                metrics.inter_token.observe(gap)
            advance.row.clock.token_gaps.clear()
        if speculation is not None:
            self._count_speculation(speculation)

    def retired(self, generation: ActiveGeneration) -> JobReport:
        """A row left for good: its report (kept, returned), counters, spans and log line."""
        report = generation.report()
        self.reports.append(report)
        self._count(generation, report)
        _record_phase_spans(generation)
        if generation.job.request.kind is JobKind.GENERATE:
            _log_line(generation, report)
        return report

    def _count_speculation(self, counts: SpeculationCounts) -> None:
        # Only what moved: eleven labelled increments a step, most of them by zero, were ~15 us
        # of a plain step that off does not pay (1-2 % of the fixtures' ~1 ms steps; issue 37.1).
        metrics = self.metrics
        if counts.verifies or any(counts.drafting_rows.values()):
            for source in SOURCES:
                if counts.drafting_rows[source]:
                    metrics.speculative_drafted.labels(source).inc(counts.drafted[source])
                    metrics.speculative_accepted.labels(source).inc(counts.accepted[source])
                    metrics.speculative_rows.labels(source).inc(counts.drafting_rows[source])
            if counts.verifies:
                metrics.decode_forwards.labels("verify").inc(counts.verifies)
        if counts.forwards > counts.verifies:
            metrics.decode_forwards.labels("plain").inc(counts.forwards - counts.verifies)

    def _count(self, generation: ActiveGeneration, report: JobReport) -> None:
        metrics = self.metrics
        request = generation.job.request
        outcome = (
            pb.FinishReason.Name(report.finish_reason).removeprefix("FINISH_REASON_").lower()
            if report.finish_reason
            else "error"
        )
        metrics.requests.labels(request.kind.value, outcome).inc()
        if request.kind is not JobKind.GENERATE or generation.job.loop is None:
            return  # counting only, or the engine's own warm-up
        metrics.prompt_tokens.inc(report.prompt_tokens)
        metrics.output_tokens.inc(report.output_tokens)
        metrics.cached_tokens.inc(report.cached_tokens)
        if generation.shared_in_flight:
            metrics.shared_prefix_tokens.inc(report.cached_tokens)
        metrics.images.inc(len(request.images))
        metrics.image_bytes.inc(sum(image.byte_count for image in request.images))
        if self.prefix_cache is not None and self.prefix_cache.enabled and generation.prefix_looked_up:
            metrics.prefix_lookups.inc()
            if report.cached_tokens > 0 and not generation.shared_in_flight:
                metrics.prefix_hits.inc()
        if generation.clock.first_token_at is not None:
            metrics.time_to_first_token.observe(generation.clock.first_token_at - generation.job.submitted_at)


def _log_line(generation: ActiveGeneration, report: JobReport) -> None:
    first = generation.clock.first_token_at
    constraint = generation.job.request.constraint
    log.info(
        "request %s: prompt_tokens=%d images=%d generated=%d ttft=%s finish=%s%s%s",
        report.request_id,
        report.prompt_tokens,
        report.image_count,
        report.output_tokens,
        f"{first - generation.clock.started_at:.3f}s" if first is not None else "-",
        pb.FinishReason.Name(report.finish_reason) if report.finish_reason else "ERROR",
        f" tokens_after_cancel={report.tokens_after_cancel}" if generation.job.cancelled else "",
        f" constrained=({constraint.summary})" if constraint is not None else "",
        extra={"request_id": report.request_id},
    )


def _record_phase_spans(generation: ActiveGeneration) -> None:
    """The job's queue, prefill and decode spans under its gRPC call's span (if traced)."""
    job = generation.job
    if job.trace_context is None:
        return
    end = time.perf_counter()
    first = generation.clock.first_token_at
    record_span("engine.queue", job.trace_context, job.submitted_at, generation.clock.started_at)
    record_span(
        "engine.prefill",
        job.trace_context,
        generation.clock.started_at,
        first if first is not None else end,
        {
            "vlmserve.prompt_tokens": generation.prompt_tokens,
            "vlmserve.cached_tokens": generation.cached_tokens,
        },
    )
    if first is not None:
        record_span(
            "engine.decode",
            job.trace_context,
            first,
            end,
            {"vlmserve.output_tokens": generation.output.output_tokens},
        )

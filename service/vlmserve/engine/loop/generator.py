"""The generation thread: the only thread that touches MLX.

It loads the model (MLX streams are thread-local, so loading happens here too), warms it up
with one step-by-step generation, then serves: each step takes the new jobs from its intake
source (intake.py: the admission queue, or rank 0's broadcast in the distributed mode), ends
waiting jobs whose caller left, and runs one step (runner.py `StepRunner.run_step`, the same
for warm-up and serving); rows that left are retired here (report, metrics, spans, log line).

Three concerns, three modules: admission (admission.py, any thread), the step policy
(scheduler.py, pure) and the step itself (runner.py); this module only ties them to a thread.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vlmserve.common.tracing import record_span
from vlmserve.engine.config import EngineConfig
from vlmserve.engine.jobs import Job, JobKind, JobReport
from vlmserve.engine.kv.layout import KVLayout, layout_for
from vlmserve.engine.kv.sizing import bytes_per_token, kv_shape
from vlmserve.engine.loop.admission import Admission
from vlmserve.engine.loop.decode import ActiveGeneration
from vlmserve.engine.loop.intake import IntakeSource, LocalIntake
from vlmserve.engine.loop.memory_budget import MemoryBudget, default_budget_bytes, device_memory_bytes
from vlmserve.engine.loop.prefix_cache import PrefixCache
from vlmserve.engine.loop.prefix_disk import PrefixDiskTier, disk_namespace
from vlmserve.engine.loop.runner import StepRunner
from vlmserve.engine.loop.verifier import Verifier
from vlmserve.engine.loop.vision_cache import VisionFeatureCache
from vlmserve.engine.metrics import EngineMetrics, EngineState
from vlmserve.engine.model import LoadedModel, fresh_weights, load_model
from vlmserve.engine.model_lifecycle import ModelLifecycle
from vlmserve.engine.prep.preparer import RequestPreparer
from vlmserve.engine.speculation.drafter import SOURCES, SpeculationCounts, Speculator
from vlmserve.engine.speculation.model_drafter import AnyDrafter, load_model_drafter
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = ["Generator", "IntakeFactory"]

log = logging.getLogger(__name__)

ReadyCallback = Callable[[LoadedModel | None, BaseException | None], None]
# Builds the loop's intake source around the engine's admission (distributed.py wraps it).
IntakeFactory = Callable[[Admission], IntakeSource]


def _plain_kv_layers(loaded: LoadedModel) -> bool:
    """Whether every layer keeps a plain KV cache, the only kind the prefix cache can cut and
    share (a sliding-window or recurrent layer's state is not a prefix of token positions)."""
    from mlx_vlm.models.cache import KVCache, make_prompt_cache

    return all(type(layer) is KVCache for layer in make_prompt_cache(loaded.model.language_model))


class Generator:
    def __init__(self, config: EngineConfig, *, intake: IntakeFactory = LocalIntake) -> None:
        self.config = config
        self.metrics = EngineMetrics()
        self.admission = Admission(config.max_queue, on_refused=self.metrics.refused.inc)
        self.intake = intake(self.admission)
        self._thread: threading.Thread | None = None
        self.loaded: LoadedModel | None = None
        # Set once the model is loaded; used from the preparation worker threads.
        self.preparer: RequestPreparer | None = None
        self.load_error: BaseException | None = None
        self.ready = threading.Event()
        # Recent finished jobs, newest last (logs, tests, metrics).
        self.reports: collections.deque[JobReport] = collections.deque(maxlen=256)
        # Generation thread only (read by tests once idle).
        self.prefix_cache: PrefixCache | None = None
        self.vision_cache: VisionFeatureCache | None = None
        self._runner: StepRunner | None = None
        # --draft-model, loaded with the model (speculation/model_drafter.py).
        self._model_drafter: AnyDrafter | None = None
        self.metrics.watch(self._state)
        # Whether the weights are in memory: --load lazy, --idle-unload-seconds (generation thread).
        self.lifecycle = ModelLifecycle(
            open_model=self._open_model,
            fresh_weights=functools.partial(
                fresh_weights, config.model, trust_remote_code=config.trust_remote_code, dtype=config.dtype
            ),
            drop_caches=self._drop_caches,
            metrics=self.metrics,
            lazy=config.load == "lazy",
            idle_unload_s=config.idle_unload_seconds,
        )

    def _state(self) -> EngineState:
        vision, prefixes = self.vision_cache, self.prefix_cache
        disk = prefixes.disk if prefixes is not None else None
        return EngineState(
            queued=self.admission.queued,
            active=self.admission.active,
            vision_cache_hits=vision.hits if vision is not None else 0,
            vision_cache_encoded=vision.encoded if vision is not None else 0,
            prefix_cache_hits=dict(prefixes.hits) if prefixes is not None else {},
            prefix_cache_bytes={
                "memory": prefixes.bytes if prefixes is not None else 0,
                "disk": disk.bytes if disk is not None and disk.enabled else 0,
            },
            memory_reserved=self.admission.memory_in_use,
            memory_budget=self.admission.memory.budget_bytes if self.admission.memory is not None else 0,
            memory_refused=self.admission.memory_refused,
            prefix_disk_enabled=disk.enabled if disk is not None else None,
            prefix_disk_pending_bytes=disk.pending_bytes if disk is not None else 0,
        )

    @property
    def prefilled_together(self) -> int:
        """Requests whose prompts were prefilled in a shared forward (tests, metrics)."""
        return self._runner.prefilled_together if self._runner is not None else 0

    # -- lifecycle (any thread) -------------------------------------------------------------

    def start(self, on_ready: ReadyCallback | None = None) -> None:
        """Start the generation thread; it loads and warms the model, then calls `on_ready`."""
        if self._thread is not None:
            raise RuntimeError("generator already started")
        self._thread = threading.Thread(
            target=self._run, args=(on_ready,), name="vlmserve-generation", daemon=True
        )
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def stop_accepting(self) -> None:
        self.admission.stop_accepting()

    def stop(self, timeout: float | None = 10.0) -> None:
        """Cancel everything still in flight and end the thread."""
        for job in self.admission.close():
            job.cancel()
        self.join(timeout)

    def wait_idle(self, timeout: float) -> bool:
        """Block until no job is queued or running (True), or the timeout passes (False)."""
        return self.admission.wait_idle(timeout)

    @property
    def in_flight(self) -> int:
        return self.admission.in_flight

    # -- requests (any thread; see admission.py) ---------------------------------------------

    def reserve(self) -> None:
        self.admission.reserve()

    def release(self) -> None:
        self.admission.release()

    def submit(self, job: Job, *, reserved: bool = False) -> None:
        """Admit a job or refuse it with a RequestError (queue full, not ready, duplicate id)."""
        try:
            job = self.intake.check(job)
        except BaseException:
            if reserved:
                self.admission.release()
            raise
        self.admission.submit(job, reserved=reserved)

    def abort(self, request_id: str) -> bool:
        return self.admission.abort(request_id)

    # -- the generation thread --------------------------------------------------------------

    def _open_model(self, lazy: bool) -> LoadedModel:
        return load_model(
            self.config.model,
            trust_remote_code=self.config.trust_remote_code,
            dtype=self.config.dtype,
            max_output_tokens=self.config.max_output_tokens,
            image_limits=self.config.image_limits,
            max_images_per_request=self.config.max_images_per_request,
            distributed=self.config.distributed,
            lazy=lazy,
        )

    def _drop_caches(self) -> None:
        """What was computed with the weights goes with them (a disk tier keeps its entries)."""
        if self.prefix_cache is not None:
            self.prefix_cache.release_memory()
        if self.vision_cache is not None:
            self.vision_cache.clear()

    def _run(self, on_ready: ReadyCallback | None) -> None:
        try:
            loaded = self.lifecycle.open()
            loaded.kv_layout = self._kv_layout(loaded)
            self._load_model_drafter(loaded)
            self.admission.memory = self._memory_budget(loaded)
            self.prefix_cache = PrefixCache(
                min_tokens=self.config.prefix_cache_min_tokens,
                max_bytes=self.config.prefix_cache_mib << 20,
                disk=self._prefix_disk_tier(loaded),
                layout=loaded.kv_layout,
            )
            self.vision_cache = VisionFeatureCache(
                self.config.vision_cache_mib << 20, namespace=loaded.info.cache_namespace
            )
            preparer = RequestPreparer(
                loaded,
                max_request_pixels=self.config.max_request_pixels,
                decode_slots=self.config.image_decode_slots,
            )
            # A lazy start leaves the warm-up to the first request (it would read the weights).
            if self.config.warmup and self.lifecycle.resident:
                self._warm_up(loaded, preparer)
                self.prefix_cache.clear()
                self.vision_cache.clear()
            self._runner = self._new_runner(loaded)
            self.intake.start(preparer)
        except BaseException as error:  # reported to the server, which exits
            log.exception("model load failed")
            self.load_error = error
            if on_ready is not None:
                on_ready(None, error)
            return
        self.loaded = loaded
        self.preparer = preparer
        self.admission.open()  # (not when stopped while loading)
        self.ready.set()
        if on_ready is not None:
            on_ready(loaded, None)
        self._serve(loaded, self._runner)
        self._persist_prefix_cache()

    def _kv_layout(self, loaded: LoadedModel) -> KVLayout:
        bits = self.config.kv_bits
        if bits is None:
            return KVLayout()
        if not _plain_kv_layers(loaded):
            log.warning(
                "--kv-bits %d ignored: this model's cache layers (sliding-window, chunked or recurrent) are "
                "not plain KV layers mlx-vlm can quantize; its KV stays at full precision",
                bits,
            )
            return KVLayout()
        language_model = loaded.model.language_model
        try:
            layout = layout_for(
                bits, self.config.kv_group_size, kv_shape(language_model)[1], self.config.kv_quant_scheme
            )
        except ValueError as error:  # MLX quantizes groups of 32, 64 or 128 values only
            log.warning("--kv-bits %d ignored: %s; its KV stays at full precision", bits, error)
            return KVLayout()
        log.info("KV cache: %s", layout.describe)
        return layout

    def _memory_budget(self, loaded: LoadedModel) -> MemoryBudget:
        from mlx.utils import tree_flatten

        parameters: list[Any] = list(tree_flatten(loaded.model.parameters()))
        model_bytes = sum(int(value.nbytes) for _, value in parameters)
        dtype_bytes = int(parameters[0][1].itemsize) if parameters else 4
        if self.config.memory_budget_mib > 0:
            budget = self.config.memory_budget_mib << 20
        else:
            budget = default_budget_bytes(device_memory_bytes(), model_bytes)
        per_token = bytes_per_token(loaded.model.language_model, loaded.kv_layout, dtype_bytes)
        log.info(
            "memory budget for requests in flight: %.0f MiB (KV %d bytes per token)",
            budget / (1 << 20),
            per_token,
        )
        return MemoryBudget(budget_bytes=budget, kv_bytes_per_token=per_token)

    def _prefix_disk_tier(self, loaded: LoadedModel) -> PrefixDiskTier | None:
        if self.config.prefix_cache_dir is None or not _plain_kv_layers(loaded):
            return None
        return PrefixDiskTier(
            Path(self.config.prefix_cache_dir),
            namespace=disk_namespace(self.config.model, loaded),
            max_bytes=self.config.prefix_cache_disk_mib << 20,
            on_error=lambda kind: self.metrics.prefix_disk_errors.labels(kind).inc(),
        )

    def _persist_prefix_cache(self) -> None:
        """At shutdown: the prefix cache's entries to its disk tier (a restart finds them)."""
        cache = self.prefix_cache
        if cache is None or cache.disk is None:
            return
        started = time.perf_counter()
        try:
            cache.persist()
        except Exception:  # the engine is stopping anyway: a failed write only loses the cache
            log.warning("prefix cache not written at shutdown", exc_info=True)
            return
        log.info(
            "prefix cache written: %d entries, %.1f MiB on disk, in %.2fs",
            len(cache.disk),
            cache.disk.bytes / (1 << 20),
            time.perf_counter() - started,
        )

    def _new_runner(self, loaded: LoadedModel) -> StepRunner:
        return StepRunner(
            loaded,
            step_tokens=self.config.step_tokens,
            prefill_chunk_tokens=self.config.prefill_chunk_tokens,
            shared_prefix_min_tokens=self.config.shared_prefix_min_tokens,
            group_prefill=_plain_kv_layers(loaded),
            prefix_cache=self.prefix_cache,
            vision_cache=self.vision_cache,
            new_verifier=self._new_verifier,
        )

    def _new_verifier(self, language_model: Any) -> Verifier[ActiveGeneration] | None:
        """Speculative decoding for a decode batch, unless it is off (or the ranks of a
        distributed model would have to agree on every row's drafts: not built)."""
        config = self.config
        if config.speculative == "off" or config.distributed != "off":
            return None
        if self._model_drafter is not None and self.loaded is not None:
            self._model_drafter.bind(self.loaded.model)
        speculator = Speculator(
            max_draft=config.speculative_max_draft,
            position_cost=config.speculative_position_cost,
            lookup=config.speculative != "draft",
            model_drafter=self._model_drafter if config.speculative != "lookup" else None,
        )
        return Verifier(language_model, speculator)

    def _load_model_drafter(self, loaded: LoadedModel) -> None:
        """`--draft-model` for this load of the model (bound to its weights); a drafter that
        cannot serve it fails the load, with why."""
        self._model_drafter = None
        if self.config.draft_model is None or self.config.speculative in ("off", "lookup"):
            return
        self._model_drafter = load_model_drafter(self.config.draft_model, loaded.model)

    def _count_speculation(self, counts: SpeculationCounts) -> None:
        metrics = self.metrics
        for source in SOURCES:
            metrics.speculative_drafted.labels(source).inc(counts.drafted[source])
            metrics.speculative_accepted.labels(source).inc(counts.accepted[source])
            metrics.speculative_rows.labels(source).inc(counts.drafting_rows[source])
        metrics.decode_forwards.labels("verify").inc(counts.verifies)
        metrics.decode_forwards.labels("plain").inc(counts.forwards - counts.verifies)

    def _warm_up(self, loaded: LoadedModel, preparer: RequestPreparer) -> None:
        """One short generation with an image, so the first request does not pay for kernel setup."""
        import io

        from PIL import Image

        if loaded.template is None:
            return  # such a model takes no conversation, so no request would run
        started = time.perf_counter()
        png = io.BytesIO()
        Image.new("RGB", (112, 112), (127, 127, 127)).save(png, "PNG")
        parts = [pb.Part(text=pb.TextPart(text="warm-up"))]
        if preparer.takes_images:
            parts.insert(0, pb.Part(image=pb.ImagePart(data=png.getvalue(), media_type="image/png")))
        request = preparer.prepare(
            pb.GenerateRequest(
                request_id="warm-up",
                messages=[pb.Message(role=pb.ROLE_USER, parts=parts)],
                sampling=pb.SamplingParams(max_tokens=2, temperature=0.0),
            ),
            kind=JobKind.GENERATE,
        )
        runner = self._new_runner(loaded)
        joined = [Job(request, None)]
        while joined or len(runner):
            runner.run_step(joined)
            joined = []
        log.info("warm-up done in %.2fs", time.perf_counter() - started)

    def _serve(self, loaded: LoadedModel, runner: StepRunner) -> None:
        while True:
            idle = not len(runner)
            # Idle: wait for work, or until the weights are due to be freed.
            taken = self.intake.next(
                self.config.max_active - len(runner),
                block=idle,
                timeout=self.lifecycle.idle_wait() if idle else None,
            )
            if idle and not taken.jobs and not taken.stop and self.lifecycle.unload_due():
                # The batch holds the model's language model: the weights go with it.
                runner.renew_batch(before=functools.partial(self.lifecycle.unload, loaded))
            for job in taken.jobs:
                if self._resident(loaded, job):
                    runner.renew_batch()  # read again (nothing was in flight): the new model's
            if taken.jobs or len(runner):
                self.lifecycle.worked()
            # Waiting jobs whose caller left or aborted end now, not when a slot frees up
            # (each would keep its queue place and its caller waiting meanwhile).
            for job in self.admission.drop_cancelled():
                self._end_unstarted(job, runner)
            if taken.stop:
                for generation in [*runner.end_all(), *(runner.new_row(job) for job in taken.jobs)]:
                    generation.finish(pb.FINISH_REASON_CANCELLED)
                    self._retire(generation)
                for job in self.admission.drain():
                    self._end_unstarted(job, runner)
                return
            result = runner.run_step(taken.jobs)
            if result.advanced:
                self.metrics.batch_size.observe(len(result.advanced))
            for advance in result.advanced:
                for gap in advance.row.clock.token_gaps:
                    self.metrics.inter_token.observe(gap)
                advance.row.clock.token_gaps.clear()
            for generation in result.left:
                self._retire(generation)
            if runner.batch.verifier is not None:
                self._count_speculation(runner.batch.verifier.take_counts())

    def _resident(self, loaded: LoadedModel, job: Job) -> bool:
        """Before a job starts, its weights must be in memory: True when they were read now
        (the jobs behind it in the queue wait meanwhile). A failed read fails the job (its
        error in the log); the next job tries again."""
        if job.request.kind is not JobKind.GENERATE or job.cancelled:
            return False
        try:
            return self.lifecycle.ensure_resident(loaded)
        except Exception:
            log.exception("loading the weights failed")
            return False

    def _end_unstarted(self, job: Job, runner: StepRunner) -> None:
        generation = runner.new_row(job)
        generation.finish(pb.FINISH_REASON_CANCELLED)
        self._retire(generation)

    def _retire(self, generation: ActiveGeneration) -> None:
        report = generation.report()
        self.reports.append(report)
        self.admission.finished(generation.job.request_id)
        self.intake.retired(generation.job)
        generation.job.done.set()
        self._count(generation, report)
        _record_phase_spans(generation)
        if generation.job.request.kind is JobKind.GENERATE:
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

"""The generation thread: the only thread that touches MLX.

It loads the model (MLX streams are thread-local, so loading happens here too), warms it up,
then serves jobs from a bounded admission queue with continuous batching. Each step:

1. requests whose caller cancelled leave (the cancel flag is checked every step);
2. every decoding request advances one token in one batched forward (batch.py);
3. requests still starting are prepared and prefilled, shortest remaining prompt first, in
   whole chunks while they fit the step's token budget (`step_tokens`, the decode rows count
   too; at least one chunk runs per step, so a long prompt always progresses). A request whose
   last chunk ran has its first token and joins the batch for the next step.

So a short request that arrives while a long prompt prefills waits at most one step, and
nobody's decode stalls for a whole prefill. Any failure of one job becomes that job's error;
the thread itself keeps running.
"""

from __future__ import annotations

import collections
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from vlmserve.common.tracing import record_span
from vlmserve.engine.config import EngineConfig
from vlmserve.engine.jobs import Job, JobKind, JobReport
from vlmserve.engine.loop.batch import DecodeBatch
from vlmserve.engine.loop.decode import ActiveGeneration, Phase
from vlmserve.engine.loop.kv_cache import KVLayout, kv_shape, layout_for
from vlmserve.engine.loop.prefix_cache import PrefixCache
from vlmserve.engine.loop.prefix_disk import PrefixDiskTier, disk_namespace
from vlmserve.engine.loop.vision_cache import VisionFeatureCache
from vlmserve.engine.metrics import EngineMetrics, EngineState
from vlmserve.engine.model import LoadedModel, fresh_weights, load_model
from vlmserve.engine.model_lifecycle import ModelLifecycle
from vlmserve.engine.prep.preparer import RequestPreparer
from vlmserve.engine.request_errors import RequestError, internal_error
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = ["Generator"]

log = logging.getLogger(__name__)


ReadyCallback = Callable[[LoadedModel | None, BaseException | None], None]


def _release_buffers() -> None:
    """Return MLX's cached buffers (a finished prefill's activations, a leaving row's cache) to
    the system, as mlx-vlm's batch generator does after each prompt batch: otherwise the
    allocator keeps every size it has seen and the process's memory only grows."""
    import mlx.core as mx

    mx.clear_cache()


def _plain_kv_layers(loaded: LoadedModel) -> bool:
    """Whether every layer keeps a plain KV cache, the only kind the prefix cache can cut and
    share (a sliding-window or recurrent layer's state is not a prefix of token positions)."""
    from mlx_vlm.models.cache import KVCache, make_prompt_cache

    return all(type(layer) is KVCache for layer in make_prompt_cache(loaded.model.language_model))


class Generator:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        # Notified whenever a job leaves, for draining.
        self._idle = threading.Condition(self._lock)
        self._jobs: dict[str, Job] = {}
        self._waiting = 0
        self._accepting = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.loaded: LoadedModel | None = None
        # Set once the model is loaded; used from the preparation worker threads.
        self.preparer: RequestPreparer | None = None
        # Queue places held by requests still being prepared (see reserve()).
        self._reserved = 0
        self.load_error: BaseException | None = None
        self.ready = threading.Event()
        # Recent finished jobs, newest last (logs, tests, metrics).
        self.reports: collections.deque[JobReport] = collections.deque(maxlen=256)
        # Generation thread only (read by tests once idle).
        self.prefix_cache: PrefixCache | None = None
        # Requests whose prompts were prefilled in a shared forward (tests, metrics).
        self.prefilled_together = 0
        self._group_prefill = False
        self._share_prefixes = False
        self.vision_cache: VisionFeatureCache | None = None
        self.metrics = EngineMetrics()
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
        with self._lock:
            queued = self._waiting + self._reserved
            active = len(self._jobs) - self._waiting
        vision, prefixes = self.vision_cache, self.prefix_cache
        disk = prefixes.disk if prefixes is not None else None
        return EngineState(
            queued=queued,
            active=active,
            vision_cache_hits=vision.hits if vision is not None else 0,
            vision_cache_encoded=vision.encoded if vision is not None else 0,
            prefix_cache_hits=dict(prefixes.hits) if prefixes is not None else {},
            prefix_cache_bytes={
                "memory": prefixes.bytes if prefixes is not None else 0,
                "disk": disk.bytes if disk is not None and disk.enabled else 0,
            },
        )

    # -- lifecycle (any thread) -------------------------------------------------------------

    def start(self, on_ready: ReadyCallback | None = None) -> None:
        """Start the generation thread; it loads and warms the model, then calls `on_ready`."""
        if self._thread is not None:
            raise RuntimeError("generator already started")
        self._thread = threading.Thread(
            target=self._run, args=(on_ready,), name="vlmserve-generation", daemon=True
        )
        self._thread.start()

    def stop_accepting(self) -> None:
        with self._lock:
            self._accepting = False

    def stop(self, timeout: float | None = 10.0) -> None:
        """Cancel everything still in flight and end the thread."""
        with self._lock:
            self._accepting = False
            self._stopping = True
            jobs = list(self._jobs.values())
        for job in jobs:
            job.cancel()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_idle(self, timeout: float) -> bool:
        """Block until no job is queued or running (True), or the timeout passes (False)."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._jobs, timeout)

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._jobs)

    # -- requests (asyncio thread) ----------------------------------------------------------

    def reserve(self) -> None:
        """Hold a queue place for a request about to be prepared, or refuse it now.

        Called before any decoding or tokenizing, so a full queue costs a refused request
        nothing; `submit(job, reserved=True)` then uses the place, `release()` gives it back.
        """
        with self._lock:
            self._check_accepting()
            self._check_queue_space()
            self._reserved += 1

    def release(self) -> None:
        """Give back a place from `reserve()` that no job will use (preparation failed)."""
        with self._lock:
            self._reserved -= 1

    def submit(self, job: Job, *, reserved: bool = False) -> None:
        """Admit a job or refuse it with a RequestError (queue full, not ready, duplicate id).

        With `reserved`, the job takes the place `reserve()` held (given back if refused here).
        """
        with self._lock:
            if reserved:
                self._reserved -= 1
            self._check_accepting()
            if job.request_id in self._jobs:
                raise RequestError(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"request id {job.request_id!r} is already queued or running",
                    field="request_id",
                )
            if not reserved:
                self._check_queue_space()
            self._jobs[job.request_id] = job
            self._waiting += 1
        self._queue.put(job)

    def _check_accepting(self) -> None:
        if not self._accepting:
            raise RequestError(
                grpc.StatusCode.UNAVAILABLE,
                "the engine is not accepting requests (loading or shutting down)",
            )

    def _check_queue_space(self) -> None:
        waiting = self._waiting + self._reserved
        if waiting >= self.config.max_queue:
            self.metrics.refused.inc()
            raise RequestError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the engine's queue is full ({waiting} requests waiting or being prepared, "
                f"limit {self.config.max_queue}); retry later",
                # RetryInfo: what tells this apart from gRPC's message-size limit (same code).
                retry_after_s=1.0,
            )

    def abort(self, request_id: str) -> bool:
        with self._lock:
            job = self._jobs.get(request_id)
        if job is None:
            return False
        job.cancel()
        return True

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
            self._group_prefill = _plain_kv_layers(loaded)
            self._share_prefixes = self._group_prefill and self.config.shared_prefix_min_tokens > 0
            # A lazy start leaves the warm-up to the first request (it would read the weights).
            if self.config.warmup and self.lifecycle.resident:
                self._warm_up(loaded, preparer)
                self.prefix_cache.clear()
                self.vision_cache.clear()
        except BaseException as error:  # reported to the server, which exits
            log.exception("model load failed")
            self.load_error = error
            if on_ready is not None:
                on_ready(None, error)
            return
        self.loaded = loaded
        self.preparer = preparer
        with self._lock:
            # Stopped while loading: never start accepting.
            self._accepting = not self._stopping
        self.ready.set()
        if on_ready is not None:
            on_ready(loaded, None)
        self._serve(loaded)
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
            layout = layout_for(bits, self.config.kv_group_size, kv_shape(language_model)[1])
        except ValueError as error:  # MLX quantizes groups of 32, 64 or 128 values only
            log.warning("--kv-bits %d ignored: %s; its KV stays at full precision", bits, error)
            return KVLayout()
        log.info("KV cache: %s", layout.describe)
        return layout

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
        generation = self._new_generation(Job(request, None), loaded)
        batch = DecodeBatch(loaded.model.language_model)
        generation.prepare()
        while generation.phase is Phase.PREFILL:
            generation.prefill()
        if generation.phase is Phase.DECODE:
            batch.add(generation)
            while not generation.done:
                batch.launch()
                for row, token in batch.take():
                    row.accept(token)
                if not generation.done:
                    batch.sample()
            batch.remove(generation, extract=False)
        log.info("warm-up done in %.2fs", time.perf_counter() - started)

    def _new_generation(self, job: Job, loaded: LoadedModel) -> ActiveGeneration:
        return ActiveGeneration(
            job,
            loaded,
            prefill_chunk_tokens=self.config.prefill_chunk_tokens,
            prefix_cache=self.prefix_cache,
            vision_cache=self.vision_cache,
        )

    def _serve(self, loaded: LoadedModel) -> None:
        batch = DecodeBatch(loaded.model.language_model)
        # Admitted, preparing or prefilling, in arrival order.
        starting: list[ActiveGeneration] = []
        while True:
            while len(starting) + len(batch) < self.config.max_active:
                idle = not (starting or batch)
                try:
                    # Idle: wait for work, or until the weights are due to be freed.
                    job = self._queue.get(block=idle, timeout=self.lifecycle.idle_wait() if idle else None)
                except queue.Empty:
                    if idle and self.lifecycle.unload_due():
                        del batch  # it holds the model's language model: the weights go with it
                        self.lifecycle.unload(loaded)
                        batch = DecodeBatch(loaded.model.language_model)
                    break
                if job is None:
                    self._drain_on_stop([*batch.rows, *starting], loaded)
                    return
                with self._lock:
                    self._waiting -= 1
                if self._resident(loaded, job):
                    # Read again (nothing was in flight): the batch holds the new model.
                    batch = DecodeBatch(loaded.model.language_model)
                starting.append(self._new_generation(job, loaded))
            if starting or batch:
                self.lifecycle.worked()
            self._end_cancelled_waiting(loaded)
            self._before_step()
            # (Cancelled decoding rows leave in the decode step, once its token in flight is taken.)
            for generation in list(starting):
                if generation.job.cancelled:
                    generation.finish(pb.FINISH_REASON_CANCELLED)
                    self._leave(generation, batch, starting)
            if batch:
                self._decode_step(batch, starting)
            self._start_step(batch, starting, budget=self.config.step_tokens - len(batch))

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

    def _before_step(self) -> None:
        """Hook between admitting jobs and acting on cancellations, once per step: in the
        distributed mode the ranks agree here on the step's admissions and cancellations
        (distributed.py), so every rank runs the same forwards."""

    def _decode_step(self, batch: DecodeBatch, starting: list[ActiveGeneration]) -> None:
        """Launch this step's forward, accept the previous step's tokens while it runs, then
        sample this step's (see batch.py: double-buffered). A row that finished, failed or was
        cancelled leaves before sampling; a cancelled row gets at most the token in flight."""
        try:
            batch.launch()
            taken = batch.take()
        except Exception:  # the batch's forward failed: every row fails, the thread lives
            self._fail_batch(batch, starting)
            return
        if taken:
            self.metrics.batch_size.observe(len(taken))
        for generation, token in taken:
            self._guarded(generation, functools.partial(generation.accept, token))
            if generation.inter_token_seconds is not None:
                self.metrics.inter_token.observe(generation.inter_token_seconds)
        for generation in list(batch.rows):
            if not generation.done and generation.job.cancelled:
                generation.finish(pb.FINISH_REASON_CANCELLED)
            if generation.done:
                self._leave(generation, batch, starting)
        try:
            batch.sample()
        except Exception:
            self._fail_batch(batch, starting)

    def _fail_batch(self, batch: DecodeBatch, starting: list[ActiveGeneration]) -> None:
        log.exception("batched decode step failed")
        for generation in list(batch.rows):
            generation.fail(internal_error())
            self._leave(generation, batch, starting)

    def _start_step(self, batch: DecodeBatch, starting: list[ActiveGeneration], *, budget: int) -> None:
        """Prepare new arrivals, then prefill chunks, shortest remaining prompt first, within
        `budget`; requests that others wait on (leaders of a shared prefix) go first."""
        ran = False
        for generation in [g for g in starting if g.phase is Phase.PREPARE]:
            if ran and budget <= 0:
                break
            self._guarded(generation, generation.prepare)
            ran = True
            budget -= max(1, sum(span.length for span in generation.image_spans))
            if generation.done:
                self._leave(generation, batch, starting)
        if self._share_prefixes:
            self._follow_leaders(batch, starting)
        leaders = [g for g in starting if g.followers]
        budget, ran = self._prefill_chunks(leaders, batch, starting, budget=budget, ran=ran)
        left = self._prefill_together(batch, starting, budget=budget)
        ran, budget = ran or left != budget, left
        rest = sorted(
            (g for g in starting if g.phase is Phase.PREFILL and g.leader is None),
            key=lambda g: g.prefill_remaining,
        )
        self._prefill_chunks(rest, batch, starting, budget=budget, ran=ran)

    def _prefill_chunks(
        self,
        generations: list[ActiveGeneration],
        batch: DecodeBatch,
        starting: list[ActiveGeneration],
        *,
        budget: int,
        ran: bool,
    ) -> tuple[int, bool]:
        """Each request's next prompt chunk, in this order, while it fits `budget` (the step's
        first chunk always runs); after its last chunk a request joins the batch. Returns what is
        left of the budget and whether any chunk of the step ran."""
        for generation in generations:
            if ran and generation.next_chunk_tokens > budget:
                continue
            budget -= generation.next_chunk_tokens
            ran = True
            self._guarded(generation, generation.prefill)
            if generation.phase is Phase.DECODE:
                starting.remove(generation)
                batch.add(generation)
                _release_buffers()
            elif generation.done:
                self._leave(generation, batch, starting)
        return budget, ran

    def _follow_leaders(self, batch: DecodeBatch, starting: list[ActiveGeneration]) -> None:
        """A prepared request that shares at least `shared_prefix_min_tokens` first prompt tokens
        with another request in flight (same partition) starts from that request's KV for them.
        From a decoding request's batch row at once; from an earlier one still prefilling once
        its chunks get there (it follows it: waits, and its leader's chunks run first). Leaders
        are earlier in arrival order and never followers themselves, so nobody waits in a circle."""
        minimum = self.config.shared_prefix_min_tokens
        for index, generation in enumerate(starting):
            if not generation.can_follow:
                continue
            best, shared = None, 0
            for other in [*batch.rows, *(g for g in starting[:index] if g.can_lead)]:
                length = generation.shared_prefix_with(other)
                if length > shared:
                    best, shared = other, length
            if best is None or shared < minimum:
                continue
            if best.phase is Phase.DECODE:
                layers = batch.row_prefix(best, shared)
                if layers is not None:
                    generation.start_from(layers, shared)
            else:
                generation.follow(best, shared)

    def _prefill_together(self, batch: DecodeBatch, starting: list[ActiveGeneration], *, budget: int) -> int:
        """Prompts whose rest is one chunk (from whatever prefix) and fits the budget share one
        prefill forward; returns what is left of the budget."""
        if not self._group_prefill or batch.has_unbatchable_rows:
            return budget
        group: list[ActiveGeneration] = []
        for generation in sorted(
            (g for g in starting if g.can_prefill_together), key=lambda g: g.prefill_remaining
        ):
            if generation.prefill_remaining > budget - sum(g.prefill_remaining for g in group):
                break
            group.append(generation)
        if len(group) < 2:
            return budget
        for generation in group:
            starting.remove(generation)
        try:
            logits = batch.add_prefilled_together(group)
        except Exception:
            log.exception("shared prefill failed")
            for generation in group:
                generation.fail(internal_error())  # the text and traceback are in the log
                self._leave(generation, batch, starting)
            return budget
        self.prefilled_together += len(group)
        spent = sum(g.prefill_remaining for g in group)
        for index, generation in enumerate(group):
            self._guarded(
                generation, functools.partial(generation.prefilled_elsewhere, logits[index : index + 1])
            )
            if generation.done:
                self._leave(generation, batch, starting)
        _release_buffers()
        return budget - spent

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

    def _leave(
        self, generation: ActiveGeneration, batch: DecodeBatch, starting: list[ActiveGeneration]
    ) -> None:
        """A done request leaves at once (its KV row goes to the prefix cache)."""
        if generation in starting:
            starting.remove(generation)
        elif generation in batch.rows:
            keep = self.prefix_cache is not None and self.prefix_cache.enabled
            # A failed request (no finish reason) leaves nothing behind.
            row = batch.remove(
                generation, extract=keep and generation.finish_reason != pb.FINISH_REASON_UNSPECIFIED
            )
            if row is not None:
                generation.keep_prefix(row)
            _release_buffers()
        self._retire(generation)

    def _end_cancelled_waiting(self, loaded: LoadedModel) -> None:
        """End queued jobs whose caller left or aborted now, not when a slot frees up.

        Otherwise each would keep its queue place (new requests refused as the queue is "full")
        and its caller waiting, for as long as the running jobs take.
        """
        # Queue.mutex and Queue.queue are the stdlib Queue's own lock and deque; this queue is
        # unbounded and never join()ed, so removing items under its lock keeps it consistent.
        with self._queue.mutex:
            waiting = self._queue.queue
            cancelled = [job for job in waiting if job is not None and job.cancelled]
            for job in cancelled:
                waiting.remove(job)
        if not cancelled:
            return
        with self._lock:
            self._waiting -= len(cancelled)
        for job in cancelled:
            generation = self._new_generation(job, loaded)
            generation.finish(pb.FINISH_REASON_CANCELLED)
            self._retire(generation)

    def _retire(self, generation: ActiveGeneration) -> None:
        report = generation.report()
        self.reports.append(report)
        with self._lock:
            self._jobs.pop(generation.job.request_id, None)
            self._idle.notify_all()
        generation.job.done.set()
        self._count(generation, report)
        _record_phase_spans(generation)
        if generation.job.request.kind is JobKind.GENERATE:
            first = generation.first_token_at
            constraint = generation.job.request.constraint
            log.info(
                "request %s: prompt_tokens=%d images=%d generated=%d ttft=%s finish=%s%s%s",
                report.request_id,
                report.prompt_tokens,
                report.image_count,
                report.output_tokens,
                f"{first - generation.started_at:.3f}s" if first is not None else "-",
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
        if generation.first_token_at is not None:
            metrics.time_to_first_token.observe(generation.first_token_at - generation.job.submitted_at)

    def _drain_on_stop(self, active: list[ActiveGeneration], loaded: LoadedModel) -> None:
        """Stop requested: everything still here ends as cancelled."""
        pending = list(active)
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                with self._lock:
                    self._waiting -= 1
                pending.append(self._new_generation(job, loaded))
        for generation in pending:
            generation.finish(pb.FINISH_REASON_CANCELLED)
            self._retire(generation)


def _record_phase_spans(generation: ActiveGeneration) -> None:
    """The job's queue, prefill and decode spans under its gRPC call's span (if traced)."""
    job = generation.job
    if job.trace_context is None:
        return
    end = time.perf_counter()
    first = generation.first_token_at
    record_span("engine.queue", job.trace_context, job.submitted_at, generation.started_at)
    record_span(
        "engine.prefill",
        job.trace_context,
        generation.started_at,
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
            {"vlmserve.output_tokens": generation.output_tokens},
        )

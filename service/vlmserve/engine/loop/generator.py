"""The generation thread: the only thread that touches MLX.

It loads the model (MLX streams are thread-local, so loading happens here too), builds the
engine's parts on it (wiring.py `build_parts`), warms it up with one short generation
(warm_up.py), then serves: each step takes the new jobs from its intake source (intake.py: the
admission queue, or rank 0's broadcast in the distributed mode), ends waiting jobs whose caller
left, and runs one step (runner.py `StepRunner.run_step`, the same for warm-up and serving);
rows that left are retired here and told of by the observer (observer.py: metrics, spans, logs).

Admission (admission.py, any thread), the step policy (scheduler.py, pure), the step itself
(runner.py), the parts (wiring.py) and what is told (observer.py) are modules of their own; this
one ties them to a thread.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from collections.abc import Callable

from vlmserve.engine.config import EngineConfig
from vlmserve.engine.jobs import Job, JobKind, JobReport
from vlmserve.engine.load_progress import LoadProgress
from vlmserve.engine.loop.admission import Admission
from vlmserve.engine.loop.decode import ActiveGeneration
from vlmserve.engine.loop.intake import IntakeSource, LocalIntake
from vlmserve.engine.loop.observer import EngineObserver
from vlmserve.engine.loop.prefix_cache import PrefixCache
from vlmserve.engine.loop.runner import StepRunner
from vlmserve.engine.loop.vision_cache import VisionFeatureCache
from vlmserve.engine.loop.warm_up import warm_up
from vlmserve.engine.loop.wiring import EngineParts, build_parts, model_lifecycle, persist_caches
from vlmserve.engine.metrics import EngineMetrics
from vlmserve.engine.model import LoadedModel
from vlmserve.engine.prep.preparer import RequestPreparer
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = ["Generator", "IntakeFactory"]

log = logging.getLogger(__name__)

ReadyCallback = Callable[[LoadedModel | None, BaseException | None], None]
# Builds the loop's intake source around the engine's admission (distributed.py wraps it).
IntakeFactory = Callable[[Admission], IntakeSource]


class Generator:
    def __init__(self, config: EngineConfig, *, intake: IntakeFactory = LocalIntake) -> None:
        self.config = config
        self.metrics = EngineMetrics()
        self.admission = Admission(config.max_queue, on_refused=self.metrics.refused.inc)
        self.intake = intake(self.admission)
        self.observer = EngineObserver(self.metrics, self.admission)
        self._thread: threading.Thread | None = None
        self.loaded: LoadedModel | None = None
        # Set once the model is loaded; used from the preparation worker threads.
        self.preparer: RequestPreparer | None = None
        self.load_error: BaseException | None = None
        self.ready = threading.Event()
        # Generation thread only (read by tests once idle).
        self._parts: EngineParts | None = None
        self._runner: StepRunner | None = None
        # Whether the weights are in memory: --load lazy, --idle-unload-seconds (generation thread).
        self.lifecycle = model_lifecycle(config, self.metrics, drop_caches=self._drop_caches)
        # The start's phases, logged as they go and told to callers while loading (load_progress.py).
        self.load_progress = LoadProgress(config.model)

    @property
    def reports(self) -> collections.deque[JobReport]:
        """Recent finished jobs, newest last (logs, tests, metrics)."""
        return self.observer.reports

    @property
    def prefix_cache(self) -> PrefixCache | None:
        return self._parts.prefix_cache if self._parts is not None else None

    @property
    def vision_cache(self) -> VisionFeatureCache | None:
        return self._parts.vision_cache if self._parts is not None else None

    @property
    def prefilled_together(self) -> int:
        """Requests whose prompts were prefilled in a shared forward (tests, metrics)."""
        return self._runner.prefilled_together if self._runner is not None else 0

    # -- lifecycle and requests (any thread; the rest is admission.py's) ----------------------

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

    def stop(self, timeout: float | None = 10.0) -> None:
        """Cancel everything still in flight and end the thread."""
        for job in self.admission.close():
            job.cancel()
        self.join(timeout)

    def submit(self, job: Job, *, reserved: bool = False) -> None:
        """Admit a job or refuse it with a RequestError (queue full, not ready, duplicate id)."""
        try:
            job = self.intake.check(job)
        except BaseException:
            if reserved:
                self.admission.release()
            raise
        self.admission.submit(job, reserved=reserved)

    def wait_idle(self, timeout: float) -> bool:
        """Block until no job is queued or running (True), or the timeout passes (False)."""
        return self.admission.wait_idle(timeout)

    # -- the generation thread --------------------------------------------------------------

    def _drop_caches(self) -> None:
        if self._parts is not None:
            self._parts.drop_caches()

    def _run(self, on_ready: ReadyCallback | None) -> None:
        progress = self.load_progress
        try:
            progress.enter("reading weights")
            loaded = self.lifecycle.open()
            progress.enter("building the engine")
            parts = build_parts(self.config, loaded, self.metrics)
            self._parts = parts
            self.observer.watch_caches(parts.prefix_cache, parts.vision_cache)
            self.admission.memory = parts.memory
            # A lazy start leaves the warm-up to the first request (it would read the weights).
            if self.config.warmup and self.lifecycle.resident:
                progress.enter("warming up")
                warm_up(loaded, parts, chunk_tokens=self.config.prefill_chunk_tokens)
            self._runner = runner = parts.new_runner()
            self.intake.start(parts.preparer)
            progress.done()
        except BaseException as error:  # reported to the server, which exits
            log.exception("model load failed")
            progress.fail(error)
            self.load_error = error
            if on_ready is not None:
                on_ready(None, error)
            return
        self.loaded, self.preparer = loaded, parts.preparer
        self.admission.open()  # (not when stopped while loading)
        self.ready.set()
        if on_ready is not None:
            on_ready(loaded, None)
        self._serve(loaded, runner)
        persist_caches(parts)

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
                self._retire(runner.new_row(job), pb.FINISH_REASON_CANCELLED)
            if taken.stop:
                for generation in [*runner.end_all(), *(runner.new_row(job) for job in taken.jobs)]:
                    self._retire(generation, pb.FINISH_REASON_CANCELLED)
                for job in self.admission.drain():
                    self._retire(runner.new_row(job), pb.FINISH_REASON_CANCELLED)
                return
            result = runner.run_step(taken.jobs)
            if self.admission.prefilling:  # rows decoding are past their vision tower
                self.admission.prefilled(row.job.request_id for row in runner.batch.rows)
            self.observer.stepped(result, runner.take_speculation_counts())
            for generation in result.left:
                self._retire(generation)

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

    def _retire(self, generation: ActiveGeneration, reason: pb.FinishReason.ValueType | None = None) -> None:
        """A row leaves for good (ended with `reason` first, if given): its job is done."""
        if reason is not None:
            generation.finish(reason)
        self.observer.retired(generation)
        self.admission.finished(generation.job.request_id)
        self.intake.retired(generation.job)
        generation.job.done.set()

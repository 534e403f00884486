"""Admission: which jobs the engine holds, from any thread (the gRPC event loop, preparation
workers, the generation thread).

A request first reserves a queue place (`reserve`, before any decoding or tokenizing, so a full
queue costs a refused request nothing), then its prepared job is `submit`ted into it. The
generation thread `take`s waiting jobs when it has room and tells `finished` when one leaves;
`drop_cancelled` hands it the waiting jobs whose caller left, so they end now instead of
holding a place until a slot frees up. Nothing here touches MLX.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import grpc

from vlmserve.engine.jobs import Job, JobKind, PreparedRequest, array_bytes
from vlmserve.engine.loop.memory_budget import MemoryBudget
from vlmserve.engine.loop.scheduler import fair_admission
from vlmserve.engine.request_errors import RequestError

__all__ = ["Admission", "Taken"]


@dataclass(frozen=True, slots=True)
class Taken:
    """What the generation thread took in one step: jobs in arrival order, and whether the
    engine is stopping (nothing is taken after that)."""

    jobs: tuple[Job, ...] = ()
    stop: bool = False


class Admission:
    def __init__(self, max_queue: int, *, on_refused: Callable[[], None] = lambda: None) -> None:
        self._max_queue = max_queue
        self._on_refused = on_refused
        self._lock = threading.Lock()
        # Notified when a job arrives, when one leaves (draining) and on close().
        self._changed = threading.Condition(self._lock)
        self._jobs: dict[str, Job] = {}
        self._waiting: collections.deque[Job] = collections.deque()
        # Queue places held by requests still being prepared.
        self._reserved = 0
        self._accepting = False
        self._closed = False
        # Admission by memory (memory_budget.py), set once the model is loaded: each waiting
        # job's estimate, and the estimates of the jobs taken and not finished.
        self.memory: MemoryBudget | None = None
        self._costs: dict[str, int] = {}
        self._taken_costs: dict[str, int] = {}
        # The vision-tower transient inside each estimate, given back once the job's prefill is
        # done (`prefilled`): held from admission through prefill only.
        self._transients: dict[str, int] = {}
        self.memory_in_use = 0
        self.memory_refused = 0
        # Fair admission across partitions (scheduler.fair_admission): each taken job's
        # partition, how many each partition holds, and when each was last admitted (a sequence
        # number; kept only for partitions with jobs held or waiting).
        self._taken_partitions: dict[str, str] = {}
        self._held: collections.Counter[str] = collections.Counter()
        self._last_admitted: dict[str, int] = {}
        self._admissions = 0

    # -- counts -----------------------------------------------------------------------------

    @property
    def queued(self) -> int:
        """Waiting for a slot, or reserved while being prepared."""
        with self._lock:
            return len(self._waiting) + self._reserved

    @property
    def active(self) -> int:
        """Taken by the generation thread and not finished."""
        with self._lock:
            return len(self._jobs) - len(self._waiting)

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._jobs)

    @property
    def reserved(self) -> int:
        with self._lock:
            return self._reserved

    def wait_idle(self, timeout: float) -> bool:
        """Block until no job is waiting or running (True), or the timeout passes (False)."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._jobs, timeout)

    # -- opening and closing ----------------------------------------------------------------

    def open(self) -> None:
        """Start accepting (the model is loaded), unless closed meanwhile."""
        with self._lock:
            self._accepting = not self._closed

    def stop_accepting(self) -> None:
        with self._lock:
            self._accepting = False

    def close(self) -> list[Job]:
        """Accept nothing more and wake the generation thread, whose next `take` says stop.
        Returns every job still held (the caller cancels them)."""
        with self._changed:
            self._accepting = False
            self._closed = True
            self._changed.notify_all()
            return list(self._jobs.values())

    # -- requests (any thread) --------------------------------------------------------------

    def reserve(self) -> None:
        """Hold a queue place for a request about to be prepared, or refuse it now."""
        with self._lock:
            self._check_accepting()
            self._check_queue_space()
            self._reserved += 1

    def release(self) -> None:
        """Give back a place from `reserve()` that no job will use (preparation failed)."""
        with self._lock:
            self._reserved -= 1

    def submit(self, job: Job, *, reserved: bool = False) -> None:
        """Admit a job or refuse it with a RequestError (queue full, not accepting, duplicate id).

        With `reserved`, the job takes the place `reserve()` held (given back if refused here).
        """
        with self._changed:
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
            cost = self._memory_cost(job.request)
            self._jobs[job.request_id] = job
            self._costs[job.request_id] = cost
            self._waiting.append(job)
            self._changed.notify_all()

    def abort(self, request_id: str) -> bool:
        with self._lock:
            job = self._jobs.get(request_id)
        if job is None:
            return False
        job.cancel()
        return True

    def _memory_cost(self, request: PreparedRequest) -> int:
        """The job's memory estimate; a job that can never fit the budget is refused here."""
        if self.memory is None or request.kind is not JobKind.GENERATE:
            return 0
        image_bytes = sum(int(a.nbytes) for image in request.images for a in image.arrays.values())
        image_bytes += sum(array_bytes(a) for a in (request.joint_arrays or {}).values())
        image_bytes += sum(array_bytes(a) for a in (request.clip_arrays or {}).values())
        # A clip goes through its tower a placeholder run at a time (a frame or two: attention
        # stays within one), so each run counts as an image of its tokens.
        image_tokens = self.memory.image_tokens(
            request.prompt_ids, [image.token_count for image in request.images]
        ) + tuple(length for clip in request.clips for _, length in clip.spans)
        try:
            cost = self.memory.check_fits(
                len(request.prompt_ids), request.settings.max_tokens, image_bytes, image_tokens
            )
        except RequestError:
            self.memory_refused += 1
            raise
        if image_tokens:
            self._transients[request.request_id] = self.memory.transient(image_tokens)
        return cost

    def _check_accepting(self) -> None:
        if not self._accepting:
            raise RequestError(
                grpc.StatusCode.UNAVAILABLE,
                "the engine is not accepting requests (loading or shutting down)",
            )

    def _check_queue_space(self) -> None:
        waiting = len(self._waiting) + self._reserved
        if waiting >= self._max_queue:
            self._on_refused()
            raise RequestError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the engine's queue is full ({waiting} requests waiting or being prepared, "
                f"limit {self._max_queue}); retry later",
                # RetryInfo: what tells this apart from gRPC's message-size limit (same code).
                retry_after_s=1.0,
            )

    # -- the generation thread --------------------------------------------------------------

    def take(self, room: int, *, block: bool, timeout: float | None = None) -> Taken:
        """Up to `room` waiting jobs, in round robin over partitions (each one's oldest first),
        while their memory estimates fit the budget beside those in flight; with `block`, wait
        for at least one (or close), at most `timeout` seconds (None: no limit)."""
        with self._changed:
            if block:
                self._changed.wait_for(lambda: self._waiting or self._closed, timeout)
            if self._closed:
                return Taken(stop=True)
            waiting = list(self._waiting)
            chosen = fair_admission(
                [(job.request.partition_key, self._costs.get(job.request_id, 0)) for job in waiting],
                held=self._held,
                last_admitted=self._last_admitted,
                room=room,
                in_use=self.memory_in_use,
                budget=self.memory.budget_bytes if self.memory is not None else None,
            )
            for job in (waiting[i] for i in chosen):
                cost = self._costs.get(job.request_id, 0)
                partition = job.request.partition_key
                self._taken_costs[job.request_id] = cost
                self.memory_in_use += cost
                self._taken_partitions[job.request_id] = partition
                self._held[partition] += 1
                self._admissions += 1
                self._last_admitted[partition] = self._admissions
            if chosen:
                taken = set(chosen)
                self._waiting = collections.deque(job for i, job in enumerate(waiting) if i not in taken)
        # In arrival order, as the runner prepares them.
        return Taken(tuple(waiting[i] for i in sorted(chosen)))

    @property
    def prefilling(self) -> bool:
        """Whether some taken job still holds a vision transient (`prefilled` has work to do)."""
        return bool(self._transients)

    def prefilled(self, request_ids: Iterable[str]) -> None:
        """These jobs' prompts are in (their vision towers ran): their transients are free."""
        with self._changed:
            freed = 0
            for request_id in request_ids:
                if request_id not in self._taken_costs:
                    continue  # (still waiting: its transient is not yet held)
                transient = self._transients.pop(request_id, 0)
                self._taken_costs[request_id] -= transient
                freed += transient
            if freed:
                self.memory_in_use -= freed
                self._changed.notify_all()

    def drop_cancelled(self) -> list[Job]:
        """Waiting jobs whose caller cancelled, out of the queue (the caller ends them)."""
        with self._lock:
            cancelled = [job for job in self._waiting if job.cancelled]
            for job in cancelled:
                self._waiting.remove(job)
            return cancelled

    def drain(self) -> list[Job]:
        """Every waiting job, out of the queue (stopping: the caller ends them)."""
        with self._lock:
            jobs = list(self._waiting)
            self._waiting.clear()
            return jobs

    def finished(self, request_id: str) -> None:
        """A job left the engine (its place is free; a drain may be waiting for this)."""
        with self._changed:
            job = self._jobs.pop(request_id, None)
            self._costs.pop(request_id, None)
            self._transients.pop(request_id, None)
            self.memory_in_use -= self._taken_costs.pop(request_id, 0)
            if self._taken_partitions.pop(request_id, None) is not None and job is not None:
                self._held[job.request.partition_key] -= 1
            if job is not None:
                self._forget_partition_if_idle(job.request.partition_key)
            self._changed.notify_all()

    def _forget_partition_if_idle(self, partition: str) -> None:
        """Drop a partition's fairness record once it holds and awaits nothing (bounded state)."""
        if self._held[partition] > 0:
            return
        del self._held[partition]
        if not any(job.request.partition_key == partition for job in self._waiting):
            self._last_admitted.pop(partition, None)

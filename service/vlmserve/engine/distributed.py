"""One model across several processes (hosts): mlx-vlm's `sharded_load` over `mx.distributed`.

Started by `mlx.launch` (or with MLX's ring environment set by hand: MLX_HOSTFILE, MLX_RANK),
every process runs the same `vlmserve-engine --distributed tensor|pipeline ...` command. Each
loads its share of the language model; a forward is one collective program that every rank must
run together, with the same inputs, in the same order.

Rank 0 serves gRPC (`LeaderGenerator`); the others (`FollowerGenerator`) serve nothing and run the
same generation loop (generator.py) on the same jobs. The loop is a function of two things only
that happen outside it: which jobs it admits at each step, and which of its jobs were cancelled.
So once per step (the generator's `_before_step` hook) rank 0 sends a `StepPlan` — the contract
requests it admitted this step and the ids cancelled since the last — over the group's own
collectives (`broadcast`); a follower prepares each request again from the contract message (as
rank 0 did: same model files, same preparation code) and runs the step exactly as rank 0 does:
the same prefills, chunks, batched decode steps, requests joining and leaving. Rank 0 sees a
cancellation only through the plan too (a latched copy of each job), so both act on it at the same
step. Sampling needs no message: the ranks compute identical logits (the collectives give every
rank the same sums), and rank 0 pins each request's random seed before it is sent.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import json
import logging
import os
import queue
import secrets
import signal
import threading
from typing import Any

from vlmserve.engine.config import EngineConfig
from vlmserve.engine.jobs import Job, JobKind, PreparedRequest
from vlmserve.engine.loop.decode import ActiveGeneration
from vlmserve.engine.loop.generator import Generator
from vlmserve.engine.model import LoadedModel
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = [
    "AdmittedRequest",
    "FollowerGenerator",
    "LeaderGenerator",
    "StepPlan",
    "broadcast",
    "decode_plan",
    "encode_plan",
    "follow",
    "generator_for",
    "rank",
    "sharded_model",
    "world",
]

log = logging.getLogger(__name__)


def world() -> Any:
    """The `mx.distributed` group of all the processes `mlx.launch` started (any backend)."""
    import mlx.core as mx

    try:
        return mx.distributed.init(strict=True)
    except RuntimeError as error:
        raise RuntimeError(
            "--distributed needs the processes started by mlx.launch (or MLX_HOSTFILE and MLX_RANK "
            f"set for the ring backend): {error}"
        ) from error


def rank() -> int:
    return int(world().rank())


def sharded_model(source: str, distributed: str) -> tuple[Any, Any]:
    """mlx-vlm's `sharded_load`: this rank's share of the model, over the whole group."""
    from mlx_vlm.utils import sharded_load

    group = world()
    try:
        if distributed == "tensor":
            loaded: tuple[Any, Any] = sharded_load(source, tensor_group=group)
        else:
            loaded = sharded_load(source, pipeline_group=group)
    except ValueError as error:  # mlx-vlm's model has no `shard` / `pipeline`
        raise ValueError(f"{source} cannot be loaded with --distributed {distributed}: {error}") from error
    log.info("rank %d of %d holds its %s-parallel share", group.rank(), group.size(), distributed)
    return loaded


# -- the step plan ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class AdmittedRequest:
    # Request id and seed filled in: preparing it again gives the same job.
    request: pb.GenerateRequest
    kind: JobKind


@dataclasses.dataclass(frozen=True, slots=True)
class StepPlan:
    """What rank 0 decided in one step that the other ranks cannot know."""

    admitted: tuple[AdmittedRequest, ...] = ()
    cancelled: tuple[str, ...] = ()
    # Rank 0 is stopping: the followers end their jobs and leave too.
    stop: bool = False


def encode_plan(plan: StepPlan) -> bytes:
    """The plan as bytes; empty for a step with nothing to say (most decode steps)."""
    if plan == StepPlan():
        return b""
    document = {
        "admitted": [
            {"kind": a.kind.value, "request": base64.b64encode(a.request.SerializeToString()).decode()}
            for a in plan.admitted
        ],
        "cancelled": list(plan.cancelled),
        "stop": plan.stop,
    }
    return json.dumps(document, separators=(",", ":")).encode()


def decode_plan(data: bytes) -> StepPlan:
    if not data:
        return StepPlan()
    document = json.loads(data)
    return StepPlan(
        admitted=tuple(
            AdmittedRequest(pb.GenerateRequest.FromString(base64.b64decode(a["request"])), JobKind(a["kind"]))
            for a in document["admitted"]
        ),
        cancelled=tuple(document["cancelled"]),
        stop=bool(document["stop"]),
    )


def broadcast(payload: bytes | None, group: Any) -> bytes:
    """Rank 0's `payload` on every rank (the others pass None), over the group's all_sum: the
    same channel as the model's own collectives, so it stays in step with them."""
    import mlx.core as mx
    import numpy as np

    mine = payload if payload is not None else b""
    size = mx.distributed.all_sum(mx.array([len(mine)], dtype=mx.int32), group=group, stream=mx.cpu)
    length = int(np.array(size)[0])
    if length == 0:
        return b""
    buffer = np.zeros(length, dtype=np.uint8) if payload is None else np.frombuffer(payload, dtype=np.uint8)
    summed = mx.distributed.all_sum(mx.array(buffer), group=group, stream=mx.cpu)
    return bytes(np.array(summed, copy=False))


def _to_send(request: PreparedRequest) -> pb.GenerateRequest:
    if request.source is None or request.logits_processors:
        # The other ranks rebuild the request from its contract message; Python callables have none.
        raise ValueError(
            "a distributed engine takes only requests prepared from a contract message, "
            "without logits_processors"
        )
    message = pb.GenerateRequest()
    message.CopyFrom(request.source)
    message.request_id = request.request_id
    if request.settings.seed is not None:
        message.sampling.seed = request.settings.seed
    return message


# -- rank 0 ----------------------------------------------------------------------------------


class _TakenQueue(queue.Queue[Job | None]):
    """The admission queue, remembering the jobs the generation loop took since the last plan."""

    def __init__(self) -> None:
        super().__init__()
        self.taken: list[Job] = []

    def get(self, block: bool = True, timeout: float | None = None) -> Job | None:
        job = super().get(block, timeout)
        if job is not None:
            self.taken.append(job)
        return job


class LeaderGenerator(Generator):
    """Rank 0: the generator that serves gRPC, telling the other ranks each step's decisions."""

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self._queue: _TakenQueue = _TakenQueue()
        # Admitted jobs by id: (the caller's job, the copy the loop sees, cancelled only by a plan).
        self._latched: dict[str, tuple[Job, Job]] = {}
        self._group: Any = None

    def submit(self, job: Job, *, reserved: bool = False) -> None:
        _to_send(job.request)  # refuses a job the followers could not prepare
        settings = job.request.settings
        if settings.seed is None:  # the followers must draw the same random numbers
            pinned = dataclasses.replace(settings, seed=secrets.randbits(63))
            job.request = dataclasses.replace(job.request, settings=pinned)
        super().submit(job, reserved=reserved)

    def _new_generation(self, job: Job, loaded: LoadedModel) -> ActiveGeneration:
        if any(taken is job for taken in self._queue.taken):
            copy = dataclasses.replace(job, _cancel=threading.Event())
            self._latched[job.request_id] = (job, copy)
            job = copy
        return super()._new_generation(job, loaded)

    def _plan(self, *, stop: bool = False) -> StepPlan:
        taken = self._queue.taken
        admitted = tuple(AdmittedRequest(_to_send(job.request), job.request.kind) for job in taken)
        self._queue.taken.clear()
        cancelled: list[str] = []
        for request_id, (caller, copy) in self._latched.items():
            if caller.cancelled and not copy.cancelled:
                copy.cancel()
                cancelled.append(request_id)
        return StepPlan(admitted, tuple(cancelled), stop)

    def _send(self, plan: StepPlan) -> None:
        if self._group is None:
            self._group = world()
        broadcast(encode_plan(plan), self._group)

    def _before_step(self) -> None:
        self._send(self._plan())

    def _retire(self, generation: ActiveGeneration) -> None:
        super()._retire(generation)
        self._latched.pop(generation.job.request_id, None)

    def _drain_on_stop(self, active: list[ActiveGeneration], loaded: LoadedModel) -> None:
        self._send(self._plan(stop=True))
        super()._drain_on_stop(active, loaded)


# -- the other ranks -------------------------------------------------------------------------


class _PlanQueue(queue.Queue[Job | None]):
    """A follower's admission queue: the jobs rank 0 admitted in the same step."""

    def __init__(self, follower: FollowerGenerator) -> None:
        super().__init__()
        self._follower = follower

    def get(self, block: bool = True, timeout: float | None = None) -> Job | None:
        return self._follower.next_admitted()


class FollowerGenerator(Generator):
    """Rank 1..n-1: no server; runs rank 0's steps on its share of the model."""

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self._queue: _PlanQueue = _PlanQueue(self)
        self._group: Any = None
        self._plan: StepPlan | None = None
        self._admitting: collections.deque[AdmittedRequest] = collections.deque()
        self._followed: dict[str, Job] = {}
        self.stopped = False

    def _receive(self) -> StepPlan:
        if self._plan is None:
            if self._group is None:
                self._group = world()
            self._plan = decode_plan(broadcast(None, self._group))
            self._admitting.extend(self._plan.admitted)
        return self._plan

    def next_admitted(self) -> Job | None:
        """The step's next admitted job; queue.Empty when there is none; None when rank 0 stops."""
        if self.stopped:
            raise queue.Empty
        plan = self._receive()
        if self._admitting:
            admitted = self._admitting.popleft()
            assert self.preparer is not None
            prepared = self.preparer.prepare(admitted.request, kind=admitted.kind)
            job = Job(prepared, None)
            self._followed[job.request_id] = job
            with self._lock:
                self._jobs[job.request_id] = job
                self._waiting += 1
            return job
        if plan.stop:
            self.stopped = True
            return None
        raise queue.Empty

    def _before_step(self) -> None:
        plan = self._receive()
        for request_id in plan.cancelled:
            if (job := self._followed.get(request_id)) is not None:
                job.cancel()
        self._plan = None

    def _retire(self, generation: ActiveGeneration) -> None:
        super()._retire(generation)
        self._followed.pop(generation.job.request_id, None)


def generator_for(config: EngineConfig) -> Generator:
    """The generator rank 0 serves with: plain, or telling the other ranks what to run."""
    return Generator(config) if config.distributed == "off" else LeaderGenerator(config)


def follow(config: EngineConfig, *, grace_seconds: float) -> int:
    """Run a follower rank until rank 0 stops (0) or this rank fails (1).

    SIGTERM / SIGINT (mlx.launch and service managers signal every rank): rank 0 drains its
    requests and needs this rank's share of every forward until then, so this rank keeps going
    until rank 0's stop plan, for at most `grace_seconds` (rank 0 may be gone: a dead peer leaves
    the collectives blocked, not failed). A second signal: leave at once.
    """
    group = world()
    generator = FollowerGenerator(config)

    def on_ready(model: LoadedModel | None, error: BaseException | None) -> None:
        if model is not None:
            log.info("rank %d of %d ready: following rank 0", group.rank(), group.size())

    signals: list[int] = []

    def leave(signum: int) -> None:
        logging.shutdown()
        os._exit(128 + signum)

    def on_signal(signum: int, _frame: object) -> None:
        if signals:
            leave(signum)
        signals.append(signum)
        log.info(
            "rank %d: %s, stopping when rank 0 stops (at most %.0fs)",
            group.rank(),
            signal.Signals(signum).name,
            grace_seconds,
        )
        timer = threading.Timer(grace_seconds, leave, args=(signum,))
        timer.daemon = True
        timer.start()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    generator.start(on_ready=on_ready)
    assert generator._thread is not None
    generator._thread.join()
    return 0 if generator.stopped else 1

"""One model across several processes (hosts): mlx-vlm's `sharded_load` over `mx.distributed`.

Started by `mlx.launch` (or with MLX's ring environment set by hand: MLX_HOSTFILE, MLX_RANK),
every process runs the same `vlmserve-engine --distributed tensor|pipeline ...` command. Each
loads its share of the language model; a forward is one collective program that every rank must
run together, with the same inputs, in the same order.

Rank 0 serves gRPC; the others serve nothing and run the same generation loop (loop/generator.py)
on the same jobs. The loop is a function of two things only that happen outside it: which jobs it
takes at each step, and which of its jobs were cancelled; both come from its injected intake
source (loop/intake.py). So once per step rank 0's source (`BroadcastIntake`) sends a
`StepPlan` — the contract requests it admitted this step and the ids cancelled since the last —
over the group's own collectives (process_group.py `broadcast`); a follower's source
(`FollowerIntake`) prepares each request again from the contract message (as rank 0 did: same
model files, same preparation code) and runs the step exactly as rank 0 does:
the same prefills, chunks, batched decode steps, requests joining and leaving. Rank 0 sees a
cancellation only through the plan too (a latched copy of each job), so both act on it at the same
step. Sampling needs no message: the ranks compute identical logits (the collectives give every
rank the same sums), and rank 0 pins each request's random seed before it is sent.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import secrets
import signal
import threading
from typing import Any

from vlmserve.engine.config import EngineConfig
from vlmserve.engine.jobs import Job, JobKind, PreparedRequest
from vlmserve.engine.loop.admission import Admission, Taken
from vlmserve.engine.loop.generator import Generator
from vlmserve.engine.loop.intake import LocalIntake
from vlmserve.engine.model import LoadedModel
from vlmserve.engine.prep.preparer import RequestPreparer
from vlmserve.engine.process_group import broadcast, world
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = [
    "AdmittedRequest",
    "BroadcastIntake",
    "FollowerIntake",
    "StepPlan",
    "decode_plan",
    "encode_plan",
    "follow",
    "generator_for",
]

log = logging.getLogger(__name__)


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


def _to_send(request: PreparedRequest) -> pb.GenerateRequest:
    if request.source is None:
        # The other ranks rebuild the request from its contract message.
        raise ValueError("a distributed engine takes only requests prepared from a contract message")
    message = pb.GenerateRequest()
    message.CopyFrom(request.source)
    message.request_id = request.request_id
    if request.settings.seed is not None:
        message.sampling.seed = request.settings.seed
    return message


# -- rank 0 ----------------------------------------------------------------------------------


class BroadcastIntake:
    """Rank 0's intake: the admission queue, with each step's intake sent to the other ranks.

    The loop sees a latched copy of each job it took, whose cancel flag is set only when a plan
    says so, so every rank acts on a cancellation at the same step."""

    def __init__(self, admission: Admission, group: Any = None) -> None:
        self._local = LocalIntake(admission)
        self._group = group
        # Taken jobs by id: (the caller's job, the copy the loop sees).
        self._latched: dict[str, tuple[Job, Job]] = {}

    def start(self, preparer: RequestPreparer) -> None:
        if self._group is None:
            self._group = world()

    def check(self, job: Job) -> Job:
        _to_send(job.request)  # refuses a job the followers could not prepare
        settings = job.request.settings
        if settings.seed is None:  # the followers must draw the same random numbers
            pinned = dataclasses.replace(settings, seed=secrets.randbits(63))
            job.request = dataclasses.replace(job.request, settings=pinned)
        return job

    def next(self, room: int, *, block: bool, timeout: float | None = None) -> Taken:
        taken = self._local.next(room, block=block, timeout=timeout)
        copies = []
        for job in taken.jobs:
            copy = dataclasses.replace(job, _cancel=threading.Event())
            self._latched[job.request_id] = (job, copy)
            copies.append(copy)
        cancelled: list[str] = []
        for request_id, (caller, copy) in self._latched.items():
            if caller.cancelled and not copy.cancelled:
                copy.cancel()
                cancelled.append(request_id)
        admitted = tuple(AdmittedRequest(_to_send(job.request), job.request.kind) for job in taken.jobs)
        broadcast(encode_plan(StepPlan(admitted, tuple(cancelled), taken.stop)), self._group)
        return Taken(tuple(copies), taken.stop)

    def retired(self, job: Job) -> None:
        self._latched.pop(job.request_id, None)


# -- the other ranks -------------------------------------------------------------------------


class FollowerIntake:
    """Rank 1..n-1: each step's jobs are rank 0's, received and prepared again here."""

    def __init__(self, admission: Admission, group: Any = None) -> None:
        self._group = group
        self._preparer: RequestPreparer | None = None
        self._followed: dict[str, Job] = {}
        self.stopped = False

    def start(self, preparer: RequestPreparer) -> None:
        self._preparer = preparer
        if self._group is None:
            self._group = world()

    def check(self, job: Job) -> Job:
        raise RuntimeError("a follower rank takes no requests of its own")

    def next(self, room: int, *, block: bool, timeout: float | None = None) -> Taken:
        assert self._preparer is not None
        plan = decode_plan(broadcast(None, self._group))
        jobs = []
        for admitted in plan.admitted:
            job = Job(self._preparer.prepare(admitted.request, kind=admitted.kind), None)
            self._followed[job.request_id] = job
            jobs.append(job)
        for request_id in plan.cancelled:
            if (followed := self._followed.get(request_id)) is not None:
                followed.cancel()
        self.stopped = plan.stop
        return Taken(tuple(jobs), plan.stop)

    def retired(self, job: Job) -> None:
        self._followed.pop(job.request_id, None)


def generator_for(config: EngineConfig) -> Generator:
    """The generator rank 0 serves with: plain, or telling the other ranks what to run."""
    return Generator(config) if config.distributed == "off" else Generator(config, intake=BroadcastIntake)


def follow(config: EngineConfig, *, grace_seconds: float) -> int:
    """Run a follower rank until rank 0 stops (0) or this rank fails (1).

    SIGTERM / SIGINT (mlx.launch and service managers signal every rank): rank 0 drains its
    requests and needs this rank's share of every forward until then, so this rank keeps going
    until rank 0's stop plan, for at most `grace_seconds` (rank 0 may be gone: a dead peer leaves
    the collectives blocked, not failed). A second signal: leave at once.
    """
    group = world()
    intake: FollowerIntake | None = None

    def follower_intake(admission: Admission) -> FollowerIntake:
        nonlocal intake
        intake = FollowerIntake(admission, group)
        return intake

    generator = Generator(config, intake=follower_intake)

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
    generator.join()
    return 0 if intake is not None and intake.stopped else 1

"""Where the generation loop's new jobs come from, once per step: its intake source.

The loop is a function of two things that happen outside it: which jobs it takes at each step,
and which of its jobs were cancelled (each job's own flag, read once per step). A source
answers both. Serving alone, that is the admission queue (`LocalIntake`); in the distributed
mode rank 0 wraps it to broadcast each step's intake and the others receive it
(distributed.py), so every rank runs the same steps without the loop knowing.
"""

from __future__ import annotations

from typing import Protocol

from vlmserve.engine.jobs import Job
from vlmserve.engine.loop.admission import Admission, Taken
from vlmserve.engine.prep.preparer import RequestPreparer

__all__ = ["IntakeSource", "LocalIntake", "Taken"]


class IntakeSource(Protocol):
    def start(self, preparer: RequestPreparer) -> None:
        """The model is loaded (called on the generation thread, before the first step)."""

    def check(self, job: Job) -> Job:
        """A job about to be submitted (any thread): the job to queue, or a RequestError/ValueError."""

    def next(self, room: int, *, block: bool, timeout: float | None = None) -> Taken:
        """This step's new jobs (at most `room`); with `block`, wait for some (nothing in
        flight), at most `timeout` seconds (None: until some come)."""

    def retired(self, job: Job) -> None:
        """A job the loop took has left it."""


class LocalIntake:
    """One engine process: the admission queue as it is."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission

    def start(self, preparer: RequestPreparer) -> None:
        pass

    def check(self, job: Job) -> Job:
        return job

    def next(self, room: int, *, block: bool, timeout: float | None = None) -> Taken:
        return self._admission.take(room, block=block, timeout=timeout)

    def retired(self, job: Job) -> None:
        pass

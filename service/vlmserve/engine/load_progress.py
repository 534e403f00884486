"""How far the engine is in getting ready: the phases of a start (reading the weights, building
the engine's parts, warming up), each timed. Long work says so while it runs: each phase is
logged as it begins and ends, and one still running is logged again every `log_every_s`, so a
start that takes minutes (a large model off a slow disk) shows what it is doing. `describe()` is
the one-line state the engine puts in its "still loading" answers (rpc/server.py), which the
facade's /readyz passes on.

Written by the generation thread, read by any thread (a lock).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PHASES", "LoadProgress", "weights_bytes"]

log = logging.getLogger("vlmserve.engine.load")

PHASES = ("reading weights", "building the engine", "warming up")


def weights_bytes(model: str) -> int | None:
    """Bytes of a local model's weight files (None for a hub id or a folder without any)."""
    folder = Path(model)
    if not folder.is_dir():
        return None
    sizes = [path.stat().st_size for path in folder.glob("*.safetensors")]
    return sum(sizes) if sizes else None


def _size(value: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value} B"


@dataclass
class LoadProgress:
    model: str
    log_every_s: float = 10.0
    clock: Callable[[], float] = time.monotonic
    phase: str | None = None
    finished: dict[str, float] = field(default_factory=dict)
    ready: bool = False
    failed: str | None = None
    _started: float | None = None
    _phase_started: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _changed: threading.Event = field(default_factory=threading.Event)

    def enter(self, phase: str) -> None:
        """`phase` begins (the one before it ends)."""
        now = self.clock()
        with self._lock:
            if self._started is None:
                self._started = now
            self._close(now)
            self.phase, self._phase_started = phase, now
            self._changed.set()  # the last phase's reminders stop (under the lock: none after this)
            self._changed = changed = threading.Event()
        step = PHASES.index(phase) + 1 if phase in PHASES else 0
        extra = ""
        if phase == "reading weights":
            size = weights_bytes(self.model)
            extra = f", {_size(size)}" if size is not None else ""
        log.info("loading %s: %s (step %d of %d%s)", self.model, phase, step, len(PHASES), extra)
        if self.log_every_s > 0:
            threading.Thread(
                target=self._remind, args=(phase, changed), name="vlmserve-load-progress", daemon=True
            ).start()

    def done(self) -> None:
        now = self.clock()
        with self._lock:
            self._close(now)
            self.phase, self.ready = None, True
            total = now - (self._started if self._started is not None else now)
            self._changed.set()
        log.info(
            "loading %s: done in %.1f s (%s)",
            self.model,
            total,
            ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.finished.items()),
        )

    def fail(self, error: BaseException) -> None:
        with self._lock:
            self.failed = f"{self.phase or 'loading'} failed: {error}"
            self._changed.set()

    def describe(self) -> str:
        """E.g. `warming up (step 3 of 3, 2.1 s; reading weights took 5.0 s, ...)`."""
        now = self.clock()
        with self._lock:
            if self.failed:
                return self.failed
            if self.ready:
                return "ready"
            if self.phase is None:
                return "starting"
            step = PHASES.index(self.phase) + 1 if self.phase in PHASES else 0
            took = "".join(f"; {name} took {seconds:.1f} s" for name, seconds in self.finished.items())
            return f"{self.phase} (step {step} of {len(PHASES)}, {now - self._phase_started:.1f} s{took})"

    def _close(self, now: float) -> None:
        if self.phase is not None:
            self.finished[self.phase] = now - self._phase_started

    def _remind(self, phase: str, changed: threading.Event) -> None:
        while not changed.wait(self.log_every_s):
            with self._lock:  # the phase cannot end while this is said
                if changed.is_set():
                    return
                log.info(
                    "loading %s: still %s after %.0f s", self.model, phase, self.clock() - self._phase_started
                )

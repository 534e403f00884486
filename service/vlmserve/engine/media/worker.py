"""Run a decoder in a process of its own, bounded in time and memory.

Demuxers and codecs parse hostile bytes (FFmpeg's and miniaudio's C code): a hang, a crash or an
allocation storm there must cost one request a 400, never the engine. So decoding runs in worker
processes (`python -m vlmserve.engine.media.worker`: a clean interpreter that imports only the
decoders, no MLX, no gRPC, none of the engine's threads), each with its private memory capped
(RLIMIT_DATA counts heap and anonymous mappings, where FFmpeg's frame buffers live). A worker
that passes the wall-clock limit is killed, as is one that crashed or ran out of memory; the
next decode starts a fresh one. The clip's bytes and the decoded arrays travel through pipes:
nothing is written to disk.

Workers are kept between decodes (their imports, OpenCV and SciPy, take seconds), and an engine
whose model takes clips starts them as it loads (`start_workers`), so its first clip does not pay
for them; at most `DECODE_SLOTS` decode at once, engine-wide, and a decode waits for a slot. At
exit every worker still alive is ended (`stop_workers`): none outlives the engine. multiprocessing's
fork server was the first choice, but its children re-run the parent's main script (the
engine's entry point, which imports MLX) before doing anything.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from vlmserve.engine.media.limits import MediaError

__all__ = ["DECODE_SLOTS", "run_bounded", "start_workers", "stop_workers"]

# Decodes at once, engine-wide: each may hold its clip and its frames.
DECODE_SLOTS = 2
# A new worker's imports (OpenCV, miniaudio, SciPy) must be done in this long; not the decode's time.
_START_TIMEOUT_S = 120.0
# The worker's main module (its own: `-m` of a module the package already imported would run a
# second copy of it).
_ENTRY = "vlmserve.engine.media.worker_process"
# FFmpeg and OpenCV write their own diagnostics of a damaged clip to stderr; the 400 says it.
# BLAS thread pools (NumPy's, SciPy's) each reserve buffers per thread, counted in the memory cap,
# for no use here; the engine's preloaded BLAS is for MLX, which the worker never imports.
_WORKER_ENV = {
    "OPENCV_FFMPEG_LOGLEVEL": "-8",
    "OPENCV_LOG_LEVEL": "SILENT",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
}


class _Worker:
    """One worker process and its two pipes (requests in, results out)."""

    def __init__(self, memory_mib: int) -> None:
        self.memory_mib = memory_mib
        request_read, request_write = os.pipe()
        result_read, result_write = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-m", _ENTRY, str(request_read), str(result_write), str(memory_mib)],
            pass_fds=(request_read, result_write),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env={**{k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}, **_WORKER_ENV},
        )
        os.close(request_read)
        os.close(result_write)
        self.requests = Connection(request_write, readable=False)
        self.results = Connection(result_read, writable=False)
        self.ready = False
        with _IDLE_LOCK:
            _LIVE.add(self)

    def wait_ready(self) -> None:
        if self.ready:
            return
        try:
            started = self.results.poll(_START_TIMEOUT_S) and self.results.recv() == ("ready", None)
        except (EOFError, OSError):
            started = False
        if not started:  # not the clip's fault: INTERNAL, and the operator sees why in the log
            raise RuntimeError(
                f"the media decoding worker did not start (with --media-decode-memory-mib {self.memory_mib})"
            )
        self.ready = True

    def close(self, *, idle: bool = False) -> None:
        """End the process. An idle ready worker leaves on the closed pipe (as it does when the
        engine dies); one starting, hung, crashed or decoding is killed."""
        with _IDLE_LOCK:
            _LIVE.discard(self)
        self.requests.close()
        self.results.close()
        if idle and self.ready:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(_LEAVE_TIMEOUT_S)
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


_SLOTS = threading.BoundedSemaphore(DECODE_SLOTS)
_IDLE: list[_Worker] = []
# Every worker started and not yet closed: idle, decoding, or starting.
_LIVE: set[_Worker] = set()
_IDLE_LOCK = threading.Lock()
# How long a ready worker may take to leave once its pipe is closed, before it is killed.
_LEAVE_TIMEOUT_S = 2.0


@atexit.register
def stop_workers() -> None:
    """End every worker (the engine's exit: registered with atexit). A decode still running then
    fails as damaged; there is no request left to answer."""
    with _IDLE_LOCK:
        idle = set(_IDLE)
        workers = list(_LIVE)
        _IDLE.clear()
    for worker in workers:
        worker.close(idle=worker in idle)


def _take(memory_mib: int) -> _Worker:
    with _IDLE_LOCK:
        for index, worker in enumerate(_IDLE):
            if worker.memory_mib == memory_mib:
                return _IDLE.pop(index)
    return _Worker(memory_mib)


def _give_back(worker: _Worker) -> None:
    with _IDLE_LOCK:
        _IDLE.append(worker)
        spare = _IDLE[:-DECODE_SLOTS] if len(_IDLE) > DECODE_SLOTS else []
        del _IDLE[: len(spare)]
    for extra in spare:
        extra.close(idle=True)


def start_workers(memory_mib: int) -> None:
    """Start the decoding workers now rather than on the first clip (their imports take seconds:
    an engine calls this as it loads, so its first clip is as quick as the next). It does not
    wait for them: their imports run beside the model's warm-up, and the first decode waits for
    its worker's (a worker that fails to start fails that decode, as one started then would).
    Tops up to `DECODE_SLOTS` idle workers for this memory limit: a second load adds none."""
    with _IDLE_LOCK:
        have = sum(1 for worker in _IDLE if worker.memory_mib == memory_mib)
    for _ in range(DECODE_SLOTS - have):
        _give_back(_Worker(memory_mib))


def run_bounded(function: str, args: tuple[Any, ...], *, what: str, timeout_s: float, memory_mib: int) -> Any:
    """`decoders.<function>(*args)` in a worker; its MediaError re-raised here, any other failure a
    MediaError. By name: the engine process never imports the decoders. `what` names the clip in
    messages ("video", "audio")."""
    with _SLOTS:
        worker = _take(memory_mib)
        healthy = False
        try:
            worker.wait_ready()
            worker.requests.send((function, args))
            deadline = time.monotonic() + timeout_s
            if not worker.results.poll(max(0.0, deadline - time.monotonic())):
                raise MediaError(
                    f"the {what} took longer than {timeout_s:g} s to decode, "
                    "the limit (--media-decode-timeout-s)",
                    code="timeout",
                )
            status, payload = worker.results.recv()
            healthy = status in ("ok", "refused")
        except (EOFError, OSError):  # the worker died: a decoder crash, or killed at the memory limit
            status, payload = "damaged", None
        finally:
            if healthy:
                _give_back(worker)
            else:
                worker.close()
    if status == "ok":
        return payload
    if status == "refused":
        reason, code, field = payload
        raise MediaError(reason, code=code, field=field)
    if status == "memory":
        raise MediaError(
            f"the {what} needs more than {memory_mib} MiB to decode, the limit (--media-decode-memory-mib)",
            code="memory",
        )
    raise MediaError(
        f"the {what} could not be decoded (damaged or unsupported)", code="damaged", field=f"{what}.data"
    )

"""PDFs are rendered in worker processes, never in the facade's own (docs/hardening.md, PDFs).

The checks in `vlmserve.common.documents` refuse the bombs they can see before PDFium renders,
but a page's content is parsed when the page loads (nested form XObjects: a 2 KB file reached
3.4 GB), and a memory cap on the facade itself made PDFium abort it, cutting every client. Here
each PDF goes to a process of its own (`pdf_worker_main.py`) under RLIMIT_AS and RLIMIT_CPU, with
a wall-clock deadline, killed at once when the request's client goes away; one PDF per process,
so nothing a PDF leaves behind outlives it. A worker that dies, runs out of time or misbehaves
is a `DocumentError` (a 400 naming the file's field), never a 500.

At most `workers` PDFs render at once (the facade gives PDF requests their own translation
threads, as many, so they never hold the threads plain requests use). One spare process is
started ahead, so a PDF does not wait for Python to start; unused, it exits after a minute.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from vlmserve.common.documents import DocumentError, DocumentLimits, PdfPage
from vlmserve.facade.documents.pdf_worker_main import SPARE_IDLE_S, frame_length, job_frame, parse_answer

__all__ = ["PdfWorkers", "RenderCancelled"]

_WORKER = Path(__file__).with_name("pdf_worker_main.py")
_READ_CHUNK = 1024 * 1024
# How often a waiting render looks at its request's cancel flag.
_POLL_S = 0.05
# A spare older than this may be about to leave by itself (SPARE_IDLE_S): started afresh instead.
_SPARE_USABLE_S = SPARE_IDLE_S / 2


Worker = subprocess.Popen[bytes]


class RenderCancelled(Exception):
    """The request's client went away: its worker was killed, and nobody waits for an answer."""


class PdfWorkers:
    def __init__(self, *, workers: int, memory_bytes: int, cpu_s: int, timeout_s: float) -> None:
        self.workers = workers
        self.memory_bytes = memory_bytes
        self.cpu_s = cpu_s
        self.timeout_s = timeout_s
        self._slots = threading.BoundedSemaphore(workers)
        self._lock = threading.Lock()
        # (started at, process): at most one, ready for the next PDF.
        self._spares: list[tuple[float, Worker]] = []
        self._closed = False
        # Workers killed or crashed so far (tests, logs).
        self.killed = 0

    def render(
        self,
        data: bytes,
        limits: DocumentLimits,
        *,
        max_pixels: int | None = None,
        max_pages: int | None = None,
        cancelled: threading.Event | None = None,
    ) -> list[PdfPage]:
        """The pages, as `render_pdf` gives them; blocks its (translation) thread meanwhile."""
        frame = job_frame(data, limits, max_pixels=max_pixels, max_pages=max_pages)
        deadline = time.monotonic() + self.timeout_s
        while not self._slots.acquire(timeout=_POLL_S):
            self._check(cancelled, deadline)
        try:
            worker = self._take()
            try:
                return self._run(worker, frame, deadline, cancelled)
            finally:
                self._end(worker)
        finally:
            self._slots.release()
            self._top_up()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            spares, self._spares = self._spares, []
        for _, worker in spares:
            self._end(worker)

    # ---- one job ---------------------------------------------------------------------------

    def _run(
        self, worker: Worker, frame: bytes, deadline: float, cancelled: threading.Event | None
    ) -> list[PdfPage]:
        assert worker.stdin is not None and worker.stdout is not None
        to_worker, from_worker = worker.stdin.fileno(), worker.stdout.fileno()
        os.set_blocking(to_worker, False)
        os.set_blocking(from_worker, False)
        sent = 0
        answer = bytearray()
        with selectors.DefaultSelector() as selector:
            selector.register(to_worker, selectors.EVENT_WRITE)
            selector.register(from_worker, selectors.EVENT_READ)
            while True:
                self._check(cancelled, deadline, worker)
                for key, _ in selector.select(_POLL_S):
                    if key.fd == to_worker:
                        try:
                            sent += os.write(to_worker, memoryview(frame)[sent : sent + _READ_CHUNK])
                        except BrokenPipeError:
                            sent = len(frame)  # it died: its exit status says why
                        if sent >= len(frame):
                            selector.unregister(to_worker)
                            worker.stdin.close()
                        continue
                    chunk = os.read(from_worker, _READ_CHUNK)
                    if not chunk:
                        return self._finished(worker, bytes(answer))
                    answer += chunk

    def _finished(self, worker: Worker, answer: bytes) -> list[PdfPage]:
        status = worker.wait()
        try:
            length = frame_length(answer)
            if status == 0 and length == len(answer):
                return parse_answer(answer)
        except DocumentError:
            raise
        except (ValueError, KeyError, TypeError):
            pass
        self.killed += 1
        if status == -signal.SIGXCPU or status == -signal.SIGKILL:
            raise DocumentError(
                f"rendering the PDF took more than {self.cpu_s} s of CPU, the limit", code="file_too_complex"
            )
        # SIGABRT / SIGSEGV (PDFium out of memory under the address-space limit) or a bad answer.
        raise DocumentError(
            f"the PDF could not be rendered within the server's limits ({self.memory_bytes // 2**20} MiB "
            f"of memory, {self.cpu_s} s of CPU)",
            code="file_too_complex",
        )

    def _check(
        self, cancelled: threading.Event | None, deadline: float, worker: Worker | None = None
    ) -> None:
        if cancelled is not None and cancelled.is_set():
            if worker is not None:
                self._kill(worker)
            raise RenderCancelled
        if time.monotonic() > deadline:
            if worker is not None:
                self._kill(worker)
            raise DocumentError(
                f"rendering the PDF took longer than {self.timeout_s:g} s, the limit", code="file_too_complex"
            )

    # ---- processes -------------------------------------------------------------------------

    def _start(self) -> Worker:
        # -P: the script's folder is not put on sys.path (only installed packages are imported).
        return subprocess.Popen(
            [sys.executable, "-P", str(_WORKER), str(self.memory_bytes), str(self.cpu_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            start_new_session=True,  # a Ctrl-C for the facade is the facade's to handle
        )

    def _take(self) -> Worker:
        with self._lock:
            spares, self._spares = self._spares, []
        fresh = None
        for started, worker in spares:
            if fresh is None and worker.poll() is None and time.monotonic() - started < _SPARE_USABLE_S:
                fresh = worker
            else:
                self._end(worker)
        return fresh if fresh is not None else self._start()

    def _top_up(self) -> None:
        """Keep one spare started (its start-up overlaps the next PDF's wait); an idle one leaves
        by itself, so a quiet facade holds no worker processes."""
        with self._lock:
            if self._closed or self._spares:
                return
            self._spares.append((time.monotonic(), self._start()))

    def _kill(self, worker: Worker) -> None:
        if worker.poll() is None:
            worker.kill()
            self.killed += 1
        worker.wait()

    def _end(self, worker: Worker) -> None:
        self._kill(worker)
        for stream in (worker.stdin, worker.stdout):
            if stream is not None:
                stream.close()

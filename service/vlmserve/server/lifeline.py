"""A child process that stops when the process that started it is gone, however it went.

The launcher (`make run`) starts the engine and the facade in sessions of their own (so a
terminal's Ctrl-C reaches only the launcher, which stops them in order). If the launcher itself
is killed (SIGKILL, a crash, an OOM kill) nothing would stop them, and they would keep serving
from their own sessions. So the launcher hands each child the read end of a pipe whose write end
only it holds (`LIFELINE_ENV` names the descriptor). The kernel closes that end whenever the
launcher exits; the child's watcher thread then reads end-of-file and sends its own process
SIGTERM, the same graceful stop as any other. Works alike on Linux and macOS (no prctl).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Mapping

__all__ = ["LIFELINE_ENV", "watch_lifeline"]

LIFELINE_ENV = "VLMSERVE_LIFELINE_FD"

log = logging.getLogger(__name__)


def watch_lifeline(environ: Mapping[str, str] | None = None) -> threading.Thread | None:
    """Start watching the descriptor named by $VLMSERVE_LIFELINE_FD (no-op without it)."""
    raw = (os.environ if environ is None else environ).get(LIFELINE_ENV)
    if not raw:
        return None
    fd = int(raw)
    os.set_inheritable(fd, False)  # our own children (none today) must not keep it open
    thread = threading.Thread(target=_watch, args=(fd,), name="vlmserve-lifeline", daemon=True)
    thread.start()
    return thread


def _watch(fd: int) -> None:
    try:
        while os.read(fd, 1):
            pass  # the launcher never writes; anything read is ignored
    except OSError:
        pass
    log.warning("the launcher that started this process is gone; stopping")
    os.kill(os.getpid(), signal.SIGTERM)

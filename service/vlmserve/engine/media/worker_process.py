"""The media decoding worker's main module (`python -m vlmserve.engine.media.worker_process REQUEST_FD
RESULT_FD MEMORY_MIB`, started by `worker.py`, never by hand): caps its own memory, imports the
decoders once, then runs the decodes sent down one pipe and answers on the other until the
engine closes the pipe.
"""

from __future__ import annotations

import importlib
import os
import resource
import sys
from multiprocessing.connection import Connection
from typing import Any

from vlmserve.engine.media.limits import MediaError

__all__ = ["main"]

_DECODERS = "vlmserve.engine.media.decoders"


def _serve(requests: Connection, results: Connection) -> None:
    decoders = importlib.import_module(_DECODERS)
    try:
        results.send(("ready", None))
    except OSError:  # the engine left (or closed this worker) while it was starting
        return
    while True:
        try:
            function, args = requests.recv()
        except (EOFError, OSError):  # the engine closed the pipe: it is done with this worker
            return
        try:
            result: tuple[str, Any] = ("ok", getattr(decoders, function)(*args))
        except MediaError as error:
            result = ("refused", (error.reason, error.code, error.field))
        except MemoryError:
            result = ("memory", None)
        except Exception:  # a decoder's own text never reaches a client
            result = ("damaged", None)
        try:
            results.send(result)
        except OSError:  # the engine left mid-decode: nobody is waiting for the answer
            return


def main(argv: list[str]) -> None:
    request_fd, result_fd, memory_mib = (int(value) for value in argv)
    memory = memory_mib * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))
    _serve(Connection(request_fd, writable=False), Connection(result_fd, readable=False))
    # Nothing to flush or save: skip the interpreter's teardown of OpenCV, SciPy and the rest
    # (a second or more), so an engine that closes its workers as it exits is not kept waiting.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])

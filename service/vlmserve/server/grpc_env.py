"""gRPC's own settings for the processes we start (the engine, the facade, the launcher), made
when this module is imported: the entry points import it before anything imports grpc, which
reads its environment once, as it loads (set later, it has no effect).

`-event_engine_client,-event_engine_listener`: a connection's reads are done by the thread that
waits on the completion queue (gRPC's older I/O path) instead of an EventEngine poller thread
handing each read to a worker thread, which hands the completed operation to the completion
queue's thread, which wakes asyncio. One streamed message then wakes one gRPC thread instead of
three: the facade spent about 0.15 ms less CPU per streamed token (0.83 -> 0.68 at 20 tokens/s,
bench/stack_cpu.py --fake-engine-pace; docs/performance.md, issue 37.2). A value the user set
wins. (The `getpid` calls per token are asyncio's running-loop check, not gRPC's fork support,
which Python's gRPC leaves off unless GRPC_ENABLE_FORK_SUPPORT asks for it.)
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

GRPC_ENVIRONMENT = {"GRPC_EXPERIMENTS": "-event_engine_client,-event_engine_listener"}


def apply(environ: MutableMapping[str, str] = os.environ) -> None:
    """Our defaults, where `environ` has no value of its own."""
    for name, value in GRPC_ENVIRONMENT.items():
        environ.setdefault(name, value)


apply()

"""uvicorn's server, woken once a second instead of ten times when nothing happens.

uvicorn's main loop wakes every 0.1 s to see whether it should exit (and, every tenth time, to
renew the `date` header): idle, that was the facade's only wake-up and 2 ms of CPU a second, a
fifth of a millisecond per token of a 10 tokens/s stream on the cores the forward computes on
(docs/performance.md, issue 37.2). `FacadeServer` ticks once a second, renewing the date header
each tick as uvicorn does each tenth, and wakes at once when `should_exit` is set (a stop signal,
or a test that ends its server), so stopping takes no longer than before.
"""

from __future__ import annotations

import asyncio

import uvicorn

__all__ = ["TICK_S", "FacadeServer"]

TICK_S = 1.0
# uvicorn's on_tick renews the date header when its counter is a multiple of this (its ten ticks
# of 0.1 s): each of our ticks does.
_UVICORN_TICKS_PER_SECOND = 10


class FacadeServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        # The loop the main loop runs in, while it runs.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tick: asyncio.Future[None] | None = None
        self._exit_requested = False
        # Set (in the loop) once a stop is asked for: what the event streams wait on.
        self._stopping: asyncio.Event | None = None
        super().__init__(config)

    @property
    def should_exit(self) -> bool:
        return self._exit_requested

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._exit_requested = value
        if value:
            self._wake()

    def _wake(self) -> None:
        # Set from a signal handler or another thread: no lock taken here, only the loop's
        # thread-safe call (a deque append and a byte to its self-pipe).
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._stop_asked)

    def _stop_asked(self) -> None:
        self._end_tick()
        if self._stopping is not None:
            self._stopping.set()

    def _end_tick(self) -> None:
        if self._tick is not None and not self._tick.done():
            self._tick.set_result(None)

    def serves_in(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether this server's main loop is running, in `loop`. The streams find their server
        through the SIGTERM handler, and in a process that ran others (tests, an app served by a
        client library in a thread of its own) that can be a server of another loop: its stop
        (an event of that loop) is not theirs to wait on."""
        return self._loop is loop

    async def exit_requested(self) -> None:
        """Until a stop is asked for (at once if it was). The event streams wait on this
        (delivery.EventStream) instead of sse-starlette's watcher, which polls for it every
        0.5 s for the life of the process once a stream has run."""
        if self._stopping is None:
            self._stopping = asyncio.Event()
        if not self.should_exit:
            await self._stopping.wait()

    async def main_loop(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        counter = 0
        try:
            should_exit = await self.on_tick(counter)
            while not should_exit:
                counter = (counter + _UVICORN_TICKS_PER_SECOND) % 864000
                self._tick = loop.create_future()
                timer = loop.call_later(TICK_S, self._end_tick)
                if not self.should_exit:  # set between the last tick and now
                    await self._tick
                timer.cancel()
                should_exit = await self.on_tick(counter)
        finally:
            self._loop = None
            # However the loop ended (a stop, uvicorn's request limit): the streams drain.
            if self._stopping is not None:
                self._stopping.set()

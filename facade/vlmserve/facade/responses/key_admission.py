"""Each API key's share of the engine (docs/hardening.md, "Round 3"): how much work one key may
have at once, and fair admission to the engine between keys.

Without them one key made 120 background runs in 2 s: every one was accepted, the engine's
queue filled, 40 of them failed `engine_overloaded` and the other key's requests got 503 while
they lasted. Now:

* `KeyAdmission.admit(owner)`: a key may have at most `max_per_key` responses (chat completions
  included) at once, running or waiting, background ones included; past it, a 429
  `rate_limit_exceeded` with `Retry-After`, before anything is stored or sent to the engine
  (with API keys off every client is the same owner, and the limit is off);
* `EngineSlots`: this facade keeps at most `capacity` calls open at the engine. A generation
  past it waits (a background one stays `queued`, a stream sends its heartbeats) until a slot
  is free, and a freed slot goes to the waiting key that holds the fewest: a key with 60 runs
  waiting cannot make another key's one request wait behind them.

Everything runs on the event loop's thread: no locks.
"""

from __future__ import annotations

import asyncio
from collections import deque

from vlmserve.facade.http.errors import APIError

__all__ = ["EngineSlots", "KeyAdmission"]


class EngineSlots:
    """At most `capacity` engine calls at once (None: no bound), handed out fairly by owner."""

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self.in_use = 0
        self.by_owner: dict[str, int] = {}
        # Owners with a generation waiting, in the order they first waited; each one's FIFO.
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}

    @property
    def waiting(self) -> int:
        return sum(len(queue) for queue in self._waiting.values())

    async def acquire(self, owner: str) -> None:
        """A slot for `owner`, once one is free and it is `owner`'s turn; give it back with
        `release`. Cancelled while waiting: nothing is held."""
        if not self._waiting and self._free():
            self._take(owner)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(owner, deque()).append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(owner)  # granted just as it was cancelled: pass it on
            else:
                self._forget(owner, future)
            raise

    def release(self, owner: str) -> None:
        self.in_use -= 1
        left = self.by_owner.get(owner, 0) - 1
        if left > 0:
            self.by_owner[owner] = left
        else:
            self.by_owner.pop(owner, None)
        self._grant()

    def _free(self) -> bool:
        return self.capacity is None or self.in_use < self.capacity

    def _take(self, owner: str) -> None:
        self.in_use += 1
        self.by_owner[owner] = self.by_owner.get(owner, 0) + 1

    def _grant(self) -> None:
        while self._waiting and self._free():
            # The waiting owner holding the fewest slots; ties go to the one waiting longest.
            owner = min(self._waiting, key=lambda name: self.by_owner.get(name, 0))
            queue = self._waiting[owner]
            future = queue.popleft()
            if not queue:
                del self._waiting[owner]
            if future.cancelled():
                continue
            self._take(owner)
            future.set_result(None)

    def _forget(self, owner: str, future: asyncio.Future[None]) -> None:
        queue = self._waiting.get(owner)
        if queue is None:
            return
        if future in queue:
            queue.remove(future)
        if not queue:
            del self._waiting[owner]


class KeyAdmission:
    """How many responses each owner has at once (running or waiting), bounded per owner; and
    how many of them carry logprobs (`top_logprobs` 20 costs the facade about 8x the CPU and 33x
    the bytes per token of a plain stream), bounded apart."""

    def __init__(
        self, max_per_key: int | None, *, max_logprobs_per_key: int | None = None, retry_after_s: int = 1
    ) -> None:
        self.max_per_key = max_per_key
        self.max_logprobs_per_key = max_logprobs_per_key
        self.retry_after_s = retry_after_s
        self.active: dict[str, int] = {}
        self.with_logprobs: dict[str, int] = {}

    def admit(self, owner: str, *, logprobs: bool = False) -> None:
        """Count one more response of `owner`, or 429 when it has its limit already."""
        count = self.active.get(owner, 0)
        if self.max_per_key is not None and count >= self.max_per_key:
            raise self._refused(f"{count} responses running or waiting")
        costly = self.with_logprobs.get(owner, 0)
        if logprobs and self.max_logprobs_per_key is not None and costly >= self.max_logprobs_per_key:
            raise self._refused(f"{costly} responses with logprobs running or waiting")
        self.active[owner] = count + 1
        if logprobs:
            self.with_logprobs[owner] = costly + 1

    def done(self, owner: str, *, logprobs: bool = False) -> None:
        _decrement(self.active, owner)
        if logprobs:
            _decrement(self.with_logprobs, owner)

    def _refused(self, what: str) -> APIError:
        return APIError(
            429,
            f"This API key has {what}, this server's limit per key; retry when one has finished.",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(self.retry_after_s)},
            type="requests",
        )


def _decrement(counts: dict[str, int], owner: str) -> None:
    left = counts.get(owner, 0) - 1
    if left > 0:
        counts[owner] = left
    else:
        counts.pop(owner, None)

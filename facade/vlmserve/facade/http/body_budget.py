"""A bound on the request bodies in flight, by bytes, with a share per API key (docs/hardening.md,
"Slow clients and many large bodies").

`max_request_bytes` bounds one body; without a bound on all of them, a few large bodies at once
(base64 images: the raw bytes, the parsed JSON, the decoded images and the translated request
all live together for a while) could take the facade's memory anywhere. Every body being read
and translated holds its bytes in the `BodyBudget` **as they arrive** (request_body.BodyMeter),
never as declared: a client that declares 64 MiB and sends a byte a second holds one byte a
second (and the minimum body rate cuts it off), not the budget. Each owner (API key) may hold at
most `per_owner_bytes` of it, so one key's bodies never take every other key's room. A chunk
that does not fit is refused at once with 503 and `Retry-After` (waiting would only hold more
connections open). The hold is given back when the request is finished (a response: when it is
stored and its stream ended, since its parsed and translated forms live that long), whatever
happens.

Everything runs on the event loop's thread, so plain integers need no lock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from vlmserve.facade.http.errors import APIError

__all__ = ["BodyBudget", "BodyHold"]


class BodyBudget:
    def __init__(self, max_bytes: int, *, per_owner_bytes: int | None = None, retry_after_s: int = 1) -> None:
        self.max_bytes = max_bytes
        # None: no share per owner (API keys off: every client is the same owner).
        self.per_owner_bytes = per_owner_bytes
        self.retry_after_s = retry_after_s
        self.in_flight = 0
        self.by_owner: dict[str, int] = {}
        # The most ever held at once (tests, logs).
        self.peak = 0

    @contextmanager
    def hold(self) -> Iterator[BodyHold]:
        """A hold for one request's body, given back when the block ends."""
        hold = BodyHold(self)
        try:
            yield hold
        finally:
            hold.release()

    def _take(self, owner: str, size: int) -> None:
        held_by_owner = self.by_owner.get(owner, 0)
        if self.per_owner_bytes is not None and held_by_owner + size > self.per_owner_bytes:
            raise self._busy(
                "This API key's requests being read hold its share of the server; retry shortly."
            )
        if self.in_flight + size > self.max_bytes:
            raise self._busy("The server is busy reading other large requests; retry shortly.")
        self.in_flight += size
        self.by_owner[owner] = held_by_owner + size
        self.peak = max(self.peak, self.in_flight)

    def _give_back(self, owner: str, size: int) -> None:
        self.in_flight -= size
        left = self.by_owner.get(owner, 0) - size
        if left > 0:
            self.by_owner[owner] = left
        else:
            self.by_owner.pop(owner, None)

    def _busy(self, message: str) -> APIError:
        return APIError(
            503,
            message,
            code="server_busy",
            # No `Connection: close`: uvicorn reads (and drops) the rest of the body, so the
            # client finishes sending and reads this answer instead of a reset.
            headers={"Retry-After": str(self.retry_after_s)},
        )


class BodyHold:
    """What one request holds of the budget, under its owner (set before the first reserve)."""

    def __init__(self, budget: BodyBudget, owner: str = "") -> None:
        self._budget = budget
        self.owner = owner
        self.held = 0

    def reserve(self, total: int) -> None:
        """Hold `total` bytes (what has arrived of the body so far): 503 if they do not fit."""
        if total > self.held:
            self._budget._take(self.owner, total - self.held)
            self.held = total

    def release(self) -> None:
        self._budget._give_back(self.owner, self.held)
        self.held = 0

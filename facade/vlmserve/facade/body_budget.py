"""A bound on the request bodies in flight, by bytes (docs/hardening.md, "Slow clients
and many large bodies").

`max_request_bytes` bounds one body; without a bound on all of them, a few large bodies at once
(base64 images: the raw bytes, the parsed JSON, the decoded images and the translated request
all live together for a while) could take the facade's memory anywhere. Every body being read
and translated holds its size in the `BodyBudget`: the declared `Content-Length` before anything
is read, else each chunk as it arrives. A body that does not fit is refused at once with 503 and
`Retry-After` (waiting would only hold more connections open). The hold is given back when the
request is finished (a response: when it is stored and its stream ended, since its parsed and
translated forms live that long), whatever happens.

Everything runs on the event loop's thread, so plain integers need no lock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from .http_errors import APIError

__all__ = ["BodyBudget", "BodyHold"]


class BodyBudget:
    def __init__(self, max_bytes: int, *, retry_after_s: int = 1) -> None:
        self.max_bytes = max_bytes
        self.retry_after_s = retry_after_s
        self.in_flight = 0
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

    def _take(self, size: int) -> None:
        if self.in_flight + size > self.max_bytes:
            raise APIError(
                503,
                "The server is busy reading other large requests; retry shortly.",
                code="server_busy",
                headers={"Retry-After": str(self.retry_after_s)},
            )
        self.in_flight += size
        self.peak = max(self.peak, self.in_flight)

    def _give_back(self, size: int) -> None:
        self.in_flight -= size


class BodyHold:
    """What one request holds of the budget."""

    def __init__(self, budget: BodyBudget) -> None:
        self._budget = budget
        self.held = 0

    def reserve(self, total: int) -> None:
        """Hold up to `total` bytes (the body's declared size): 503 if they do not fit."""
        if total > self.held:
            self._budget._take(total - self.held)
            self.held = total

    def release(self) -> None:
        self._budget._give_back(self.held)
        self.held = 0

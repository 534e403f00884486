"""uvicorn's h11 protocol, bounded against slow and numerous clients (docs/hardening.md,
"Slow clients and many large bodies").

uvicorn times out only idle keep-alive connections: a client that trickles its request line and
headers a byte at a time (slowloris) keeps its connection for as long as it likes, and the server
accepts any number of such connections. `bounded_protocol()` makes the class the CLI gives
uvicorn (`http=`), adding to uvicorn's own `H11Protocol`:

* a connection cap: past `max_connections` open connections a new one is answered 503 with
  `Retry-After` and closed before anything is read from it;
* a header deadline: a request's line and headers must have arrived `header_timeout_s` after the
  connection opened (or after the previous response, on a kept-alive connection); otherwise the
  client gets 408 and the connection is closed.

The body has a deadline of its own where it is read (request_body.read_json), so the client gets
an OpenAI-shaped 408 there.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["bounded_protocol"]

# How long a refused connection stays open, reading and dropping, after its answer.
_LINGER_S = 1.0


def _canned(status: int, reason: str, extra: bytes = b"") -> bytes:
    return (
        f"HTTP/1.1 {status} {reason}\r\n".encode("ascii")
        + extra
        + b"content-type: text/plain; charset=utf-8\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    )


class _BoundedH11Protocol(H11Protocol):
    max_connections = 1000
    header_timeout_s = 10.0
    retry_after_s = 1

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            retry_after = f"retry-after: {self.retry_after_s}\r\n".encode("ascii")
            self._refuse(_canned(503, "Service Unavailable", retry_after))
            return
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        if not self._refused:  # a refused client's bytes are read and dropped until it closes
            super().data_received(data)

    def _refuse(self, answer: bytes) -> None:
        """Answer, then close our side; read (and drop) what the client still sends for a moment
        before closing for good: closing with unread bytes would reset the connection, and the
        client would never see the answer."""
        self._refused = True
        self._disarm_header_deadline()
        self.transport.write(answer)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(_LINGER_S, self.transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:
            self._disarm_header_deadline()  # the headers are in: the request has begun

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm_header_deadline()  # the next request on this connection

    def _arm_header_deadline(self) -> None:
        self._disarm_header_deadline()
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _header_timeout(self) -> None:
        self._header_deadline = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        partial, _closed = self.conn.trailing_data
        if partial:  # a request begun and not finished in time
            self._refuse(_canned(408, "Request Timeout"))
        else:  # an idle connection just closes
            self.transport.close()


def bounded_protocol(
    *, max_connections: int, header_timeout_s: float, retry_after_s: int
) -> type[H11Protocol]:
    """The protocol class for `uvicorn.Config(http=...)` with these bounds."""
    return type(
        "BoundedH11Protocol",
        (_BoundedH11Protocol,),
        {
            "max_connections": max_connections,
            "header_timeout_s": header_timeout_s,
            "retry_after_s": retry_after_s,
        },
    )

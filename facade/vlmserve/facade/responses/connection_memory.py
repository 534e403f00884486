"""What one WebSocket connection remembers: its last response, as the turns a continuation replays.

OpenAI's WebSocket mode keeps the connection's most recent response in memory, so a client that
stores nothing (`store: false`, or zero data retention) continues it by `previous_response_id`
on the same connection, sending only the new items. Here too: the last response that finished
(`completed` or `incomplete`) on a connection is kept as the contract messages a continuation
replays (what came before it, its input, its output), exactly what the store would give back
for a stored one. One response is kept, not a chain: each continuation folds the one before
it in, and memory is freed when the connection closes. Anything else is looked up in the store
as over HTTP (`previous_response_not_found` when it is not there either).
"""

from __future__ import annotations

from dataclasses import dataclass

from vlmserve.facade.store.message_codec import detached
from vlmserve.facade.store.records import Replay
from vlmserve.responses import ResponseResource, TranslatedRequest

# A response that ended any other way (failed, cancelled) is no turn to continue.
_CONTINUABLE = ("completed", "incomplete")


@dataclass
class _Pending:
    response_id: str
    earlier: Replay
    translated: TranslatedRequest


@dataclass
class ConnectionMemory:
    _last_id: str | None = None
    _last: Replay | None = None
    _pending: _Pending | None = None

    def lookup(self, response_id: str) -> Replay | None:
        """The turns up to and including `response_id`, if it is this connection's last response."""
        return self._last if response_id == self._last_id else None

    def started(self, response_id: str, earlier: Replay, translated: TranslatedRequest) -> None:
        """A response of this connection was prepared, continuing `earlier`."""
        self._pending = _Pending(response_id, earlier, translated)

    def ended(self, resource: ResponseResource) -> None:
        """The response now over: kept as the connection's last, if it can be continued."""
        pending, self._pending = self._pending, None
        if pending is None or pending.response_id != resource.id or resource.status not in _CONTINUABLE:
            return
        if pending.earlier.items:
            # Turns stored before messages were kept replay as items, after any messages: the
            # store keeps those in order; continuing from memory would not.
            return
        translated = pending.translated
        messages = [
            *pending.earlier.messages,
            *translated.input_messages.owned(),
            *detached(translated.output_messages(resource.output)),
        ]
        self._last_id, self._last = resource.id, Replay(messages=messages)

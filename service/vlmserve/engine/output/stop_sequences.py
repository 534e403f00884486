"""Streaming stop-sequence matching over generated text.

Text that might be the start of a stop sequence is held back until decided, so a stop sequence
is never streamed, even when it arrives split across tokens. The held text is shorter than the
longest stop sequence, so each piece of text is examined a bounded number of times.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["StopSequenceMatcher"]


class StopSequenceMatcher:
    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._longest = max((len(s) for s in self._stops), default=0)
        self._held = ""
        self.stopped = False
        # The stop sequence that ended the text (the earliest in it), once one has.
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        """Text safe to emit now. After a stop sequence is seen, `stopped` is True and the
        text before it is the last thing returned; later input is ignored."""
        if self.stopped:
            return ""
        if not self._stops:
            return text
        window = self._held + text
        first: int | None = None
        for stop in self._stops:
            index = window.find(stop)
            if index >= 0 and (first is None or index < first):
                first, self.matched = index, stop
        if first is not None:
            self.stopped = True
            self._held = ""
            return window[:first]
        keep = self._held_length(window)
        self._held = window[len(window) - keep :] if keep else ""
        return window[: len(window) - keep]

    def flush(self) -> str:
        """Generation ended without a stop sequence: release what was held."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _held_length(self, window: str) -> int:
        """Longest suffix of `window` that is a proper prefix of some stop sequence."""
        for length in range(min(self._longest - 1, len(window)), 0, -1):
            suffix = window[-length:]
            if any(stop.startswith(suffix) for stop in self._stops):
                return length
        return 0

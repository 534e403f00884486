"""gpt-oss "harmony" output -> reasoning and answer runs. Pure, per request, streamed.

A harmony model writes messages, each a header then a body:
`<|channel|>analysis<|message|>thinking<|end|><|start|>assistant<|channel|>final<|message|>answer`.
The `analysis` channel is reasoning; `final` is the answer; `commentary` with a recipient
(`to=functions.NAME`, in the channel or the role header) is a tool call, passed on to the answer
stream in the one spelling mlx-vlm's harmony parser reads
(`<|channel|>commentary to=NAME <|constrain|>json<|message|>{...}<|call|>`); `commentary`
without one (a preamble) is answer text. Headers are markup: never shown.

The call-end `<|call|>` (like `<|return|>`) is an end-of-sequence token in gpt-oss's generation
config, so the engine stops before the text sees it: at the end of the output a call whose body
is complete JSON is closed here; a cut-off body stays unclosed (the parser gives it back as text).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

__all__ = ["HARMONY_MARKERS", "HarmonySplitter", "starts_harmony"]

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
END, RETURN, CALL, CONSTRAIN = "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"
HARMONY_MARKERS = (START, CHANNEL, MESSAGE, END, RETURN, CALL, CONSTRAIN)
_BODY_ENDS = (END, RETURN, CALL, START)
# A header longer than this without `<|message|>` is not one: given back as answer text.
_MAX_HEADER_CHARS = 512

_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CONSTRAINT = re.compile(re.escape(CONSTRAIN) + r"\s*([^\s<]+)")


def starts_harmony(text: str) -> bool | None:
    """Whether output beginning with `text` is harmony (None: too short to tell)."""
    text = text.lstrip()
    if text.startswith((CHANNEL, START)):
        return True
    if CHANNEL.startswith(text) or START.startswith(text):
        return None
    return False


def _held(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that could begin one of `markers`."""
    for size in range(min(len(text), max(map(len, markers)) - 1), 0, -1):
        tail = text[-size:]
        if any(marker.startswith(tail) for marker in markers):
            return size
    return 0


@dataclass
class HarmonySplitter:
    """Raw harmony output -> (is_reasoning, text) runs (`ThinkingSplitter`'s interface)."""

    # The body being read: "analysis", "final", "call", "text"; None while reading a header.
    body: str | None = None
    _buffer: str = ""
    _call_body: list[str] = field(default_factory=list)
    # Raw text fed so far; the runs of the last feed()/finish() start at these raw offsets (None:
    # call markup written here, in the parser's spelling, not the model's text).
    _fed: int = 0
    starts: list[int | None] = field(default_factory=list)
    _starts: list[int | None] = field(default_factory=list)

    @property
    def thinking(self) -> bool:
        return self.body == "analysis"

    def feed(self, text: str) -> list[tuple[bool, str]]:
        self._buffer += text
        self._fed += len(text)
        self._starts = []
        out: list[tuple[bool, str]] = []
        while self._buffer:
            if self.body is None:
                if not self._read_header(out):
                    break
            elif not self._read_body(out):
                break
        return self._runs(out)

    def finish(self) -> list[tuple[bool, str]]:
        out: list[tuple[bool, str]] = []
        self._starts = []
        if self.body is None:
            pass  # an unfinished header is markup
        else:
            self._emit(self._buffer, out)
            if self.body == "call" and self._complete_json("".join(self._call_body)):
                self._write(out, CALL)
        self._buffer = ""
        self.body = None
        return self._runs(out)

    def _runs(self, out: list[tuple[bool, str]]) -> list[tuple[bool, str]]:
        kept = [(run, start) for run, start in zip(out, self._starts, strict=True) if run[1]]
        self.starts = [start for _, start in kept]
        return [run for run, _ in kept]

    def _write(self, out: list[tuple[bool, str]], markup: str) -> None:
        """Call markup in the parser's spelling (not the model's text: no raw offset)."""
        out.append((False, markup))
        self._starts.append(None)

    def _read_header(self, out: list[tuple[bool, str]]) -> bool:
        end = self._buffer.find(MESSAGE)
        if end < 0:
            if len(self._buffer) > _MAX_HEADER_CHARS:
                self.body, self._buffer = "text", self._buffer  # not a header after all
                return True
            return False
        header, self._buffer = self._buffer[:end], self._buffer[end + len(MESSAGE) :]
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        name = channel.group(1) if channel else ""
        if recipient is not None:
            self.body, self._call_body = "call", []
            constraint = _CONSTRAINT.search(header)
            constrain = f" {CONSTRAIN}{constraint.group(1)}" if constraint else ""
            self._write(out, f"{CHANNEL}commentary to={recipient.group(1)}{constrain}{MESSAGE}")
        elif name == "analysis":
            self.body = "analysis"
        elif name == "final":
            self.body = "final"
        else:
            self.body = "text"
        return True

    def _read_body(self, out: list[tuple[bool, str]]) -> bool:
        found = [(index, marker) for marker in _BODY_ENDS if (index := self._buffer.find(marker)) >= 0]
        if not found:
            keep = _held(self._buffer, _BODY_ENDS)
            self._emit(self._buffer[: len(self._buffer) - keep], out)
            self._buffer = self._buffer[len(self._buffer) - keep :]
            return False
        index, marker = min(found)
        self._emit(self._buffer[:index], out)
        if self.body == "call":
            self._write(out, CALL)
        # `<|start|>` opens the next header itself; the others end the message before it.
        self._buffer = self._buffer[index if marker == START else index + len(marker) :]
        self.body = None
        return True

    def _emit(self, text: str, out: list[tuple[bool, str]]) -> None:
        if not text:
            return
        if self.body == "call":
            self._call_body.append(text)
        out.append((self.body == "analysis", text))
        # `text` is the start of the buffer, which is the end of the raw text fed.
        self._starts.append(self._fed - len(self._buffer))

    @staticmethod
    def _complete_json(text: str) -> bool:
        try:
            json.loads(text)
        except ValueError:
            return False
        return True

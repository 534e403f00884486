"""Streaming tool-call parsers, chosen per model family.

A parser turns the model's raw text, fed in arbitrary pieces, into visible text and whole tool
calls. Markup is never emitted as text: a possible start tag at the end of the input is held
back until it is decided, and a call is emitted once, complete, when its end tag arrives.
Work is linear in the input (each character is scanned a bounded number of times) and a call
body is bounded; an over-long or malformed call is given back as text so nothing is dropped.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "DEFAULT_MAX_CALL_CHARS",
    "HERMES_FORMAT",
    "HermesToolCallParser",
    "ParsedToolCall",
    "PlainTextParser",
    "TextPiece",
    "ToolCallParser",
    "ToolCallPiece",
    "make_parser",
    "tool_call_format_for",
]

HERMES_FORMAT = "hermes"
DEFAULT_MAX_CALL_CHARS = 1 << 20  # a call body (e.g. a whole patch) may be large, but not unbounded

# Model families whose chat templates use `<tool_call>{json}</tool_call>` (Qwen2/2.5/3, Hermes).
_HERMES_FAMILIES = frozenset(
    {"qwen2", "qwen2_vl", "qwen2_5_vl", "qwen2_5_omni", "qwen3", "qwen3_vl", "qwen3_vl_moe", "qwen3_moe"}
)


@dataclass(frozen=True, slots=True)
class ParsedToolCall:
    id: str
    name: str
    # JSON text of the arguments object.
    arguments: str


@dataclass(frozen=True, slots=True)
class TextPiece:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallPiece:
    call: ParsedToolCall


Piece = TextPiece | ToolCallPiece


class ToolCallParser(Protocol):
    def feed(self, text: str) -> list[Piece]:
        """Consume more raw model text; return what can be decided now, in order."""
        ...

    def finish(self) -> list[Piece]:
        """The model stopped: give back anything held (an unfinished call becomes text)."""
        ...


def tool_call_format_for(model_type: str, chat_template: str | None) -> str:
    """The parser name for a model: by family, else by what its chat template writes ("" if none)."""
    if model_type in _HERMES_FAMILIES:
        return HERMES_FORMAT
    if chat_template and "<tool_call>" in chat_template:
        return HERMES_FORMAT
    return ""


def make_parser(tool_call_format: str, *, max_call_chars: int = DEFAULT_MAX_CALL_CHARS) -> ToolCallParser:
    """A fresh per-request parser; "" (no tool format, or tools disabled) passes text through."""
    if tool_call_format == HERMES_FORMAT:
        return HermesToolCallParser(max_call_chars=max_call_chars)
    if tool_call_format == "":
        return PlainTextParser()
    raise ValueError(f"unknown tool call format {tool_call_format!r}")


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


class PlainTextParser:
    """No tool calls: every piece of text is visible text."""

    def feed(self, text: str) -> list[Piece]:
        return [TextPiece(text)] if text else []

    def finish(self) -> list[Piece]:
        return []


def _held_prefix_length(buffer: str, tag: str) -> int:
    """Length of the longest suffix of `buffer` that is a proper prefix of `tag`."""
    for length in range(min(len(tag) - 1, len(buffer)), 0, -1):
        if buffer.endswith(tag[:length]):
            return length
    return 0


def _parse_hermes_body(body: str) -> ParsedToolCall | None:
    """`{"name": ..., "arguments": {...}}` -> a call; None when it is not one."""
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return None
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):
        # Some models double-encode; keep the text when it already is JSON.
        try:
            json.loads(arguments)
            arguments_text = arguments
        except ValueError:
            arguments_text = json.dumps(arguments, ensure_ascii=False)
    else:
        arguments_text = json.dumps(arguments, ensure_ascii=False)
    return ParsedToolCall(id=new_call_id(), name=name, arguments=arguments_text)


class HermesToolCallParser:
    """Qwen/Hermes markup: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.

    Whitespace between or after calls is dropped (it is layout, not an answer); any other text
    around calls is visible text.
    """

    start_tag = "<tool_call>"
    end_tag = "</tool_call>"

    def __init__(self, *, max_call_chars: int = DEFAULT_MAX_CALL_CHARS) -> None:
        self._max_call_chars = max_call_chars
        self._buffer = ""
        self._inside = False
        # Inside a call: how far the buffer was already searched for the end tag.
        self._searched = 0
        self._seen_call = False
        # Whitespace after a call, emitted only if real text follows.
        self._pending_space = ""

    def feed(self, text: str) -> list[Piece]:
        self._buffer += text
        pieces: list[Piece] = []
        while True:
            if self._inside:
                if not self._scan_call(pieces):
                    break
            elif not self._scan_text(pieces):
                break
        return pieces

    def finish(self) -> list[Piece]:
        pieces: list[Piece] = []
        if self._inside:
            self._emit_text(self.start_tag + self._buffer, pieces)
        else:
            self._emit_text(self._buffer, pieces)
        self._buffer = ""
        self._inside = False
        self._pending_space = ""
        return pieces

    def _emit_text(self, text: str, pieces: list[Piece]) -> None:
        if not text:
            return
        if self._seen_call and not text.strip():
            self._pending_space += text
            return
        text, self._pending_space = self._pending_space + text, ""
        if pieces and isinstance(pieces[-1], TextPiece):
            pieces[-1] = TextPiece(pieces[-1].text + text)
        else:
            pieces.append(TextPiece(text))

    def _scan_text(self, pieces: list[Piece]) -> bool:
        """Outside a call; True when a start tag was consumed (keep scanning)."""
        index = self._buffer.find(self.start_tag)
        if index >= 0:
            self._emit_text(self._buffer[:index], pieces)
            self._buffer = self._buffer[index + len(self.start_tag) :]
            self._inside = True
            self._searched = 0
            return True
        held = _held_prefix_length(self._buffer, self.start_tag)
        self._emit_text(self._buffer[: len(self._buffer) - held], pieces)
        self._buffer = self._buffer[len(self._buffer) - held :]
        return False

    def _scan_call(self, pieces: list[Piece]) -> bool:
        """Inside a call; True when the call ended (keep scanning the rest)."""
        start = max(0, self._searched - len(self.end_tag) + 1)
        index = self._buffer.find(self.end_tag, start)
        if index < 0:
            self._searched = len(self._buffer)
            if len(self._buffer) > self._max_call_chars:
                # Too long to be a call we would accept: give it back as text, stop looking.
                self._emit_text(self.start_tag + self._buffer, pieces)
                self._buffer = ""
                self._inside = False
            return False
        body = self._buffer[:index]
        self._buffer = self._buffer[index + len(self.end_tag) :]
        self._inside = False
        call = _parse_hermes_body(body.strip()) if len(body) <= self._max_call_chars else None
        if call is None:
            self._emit_text(self.start_tag + body + self.end_tag, pieces)
        else:
            self._pending_space = ""
            self._seen_call = True
            pieces.append(ToolCallPiece(call))
        return True


def collect(parser: ToolCallParser, chunks: Sequence[str]) -> list[Piece]:
    """Feed all chunks then finish; adjacent text pieces merged (for tests and unary use)."""
    pieces: list[Piece] = []
    for chunk in chunks:
        pieces.extend(parser.feed(chunk))
    pieces.extend(parser.finish())
    merged: list[Piece] = []
    for piece in pieces:
        if merged and isinstance(piece, TextPiece) and isinstance(merged[-1], TextPiece):
            merged[-1] = TextPiece(merged[-1].text + piece.text)
        else:
            merged.append(piece)
    return merged

"""Generated text -> visible text and tool calls, with stop sequences. Pure, per request.

Order matters: stop sequences cut the raw text first (a stop ends generation wherever it
appears), then the tool-call parser separates markup from visible text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vlmserve.engine.v1 import engine_pb2 as pb

from .harmony import HarmonySplitter, starts_harmony
from .stop_sequences import StopSequenceMatcher
from .tool_parsers import Piece, TextPiece, ToolCallPiece, make_parser

__all__ = ["OutputAssembler", "OutputPiece", "Reasoning", "ThinkingSplitter", "prompt_leaves_thinking"]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True, slots=True)
class Reasoning:
    """Thinking text (between `<think>` and `</think>`): never part of the visible text."""

    text: str


OutputPiece = str | pb.ToolCall | Reasoning


def prompt_leaves_thinking(prompt_text: str) -> bool:
    """The prompt opens `<think>` without closing it (Qwen3-VL-Thinking's generation prompt)."""
    return prompt_text.rfind(THINK_OPEN) > prompt_text.rfind(THINK_CLOSE)


def _held_prefix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that could be the start of `marker`."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


@dataclass
class ThinkingSplitter:
    """Raw output -> (is_reasoning, text) runs. Thinking is the text up to `</think>` when the
    prompt left `<think>` open, or when the output itself starts with `<think>`; output that
    starts with a harmony header (`<|channel|>`, `<|start|>`) is read by `HarmonySplitter`."""

    thinking: bool = False
    _held: str = ""
    # Still at the start of the output: the model may open `<think>` itself.
    _may_open: bool = True
    # Right after `</think>`: whitespace before the answer is dropped.
    _after_close: bool = False
    _harmony: HarmonySplitter | None = None

    def __post_init__(self) -> None:
        if self.thinking:
            self._may_open = False

    @property
    def in_reasoning(self) -> bool:
        return self._harmony.thinking if self._harmony is not None else self.thinking

    def feed(self, text: str) -> list[tuple[bool, str]]:
        if self._harmony is not None:
            return self._harmony.feed(text)
        out: list[tuple[bool, str]] = []
        buffer, self._held = self._held + text, ""
        while buffer:
            if self.thinking:
                end = buffer.find(THINK_CLOSE)
                if end >= 0:
                    out.append((True, buffer[:end]))
                    buffer = buffer[end + len(THINK_CLOSE) :]
                    self.thinking, self._after_close = False, True
                    continue
                keep = _held_prefix(buffer, THINK_CLOSE)
                out.append((True, buffer[: len(buffer) - keep]))
                self._held = buffer[len(buffer) - keep :]
                break
            if self._may_open:
                harmony = starts_harmony(buffer)
                if harmony:
                    self._harmony, self._may_open = HarmonySplitter(), False
                    return self._harmony.feed(buffer)
                start = buffer.lstrip()
                if start.startswith(THINK_OPEN):
                    buffer, self.thinking, self._may_open = start[len(THINK_OPEN) :], True, False
                    continue
                if THINK_OPEN.startswith(start) or harmony is None:
                    self._held = buffer
                    break
                self._may_open = False
            if self._after_close:
                buffer = buffer.lstrip()
                if not buffer:
                    break
                self._after_close = False
            out.append((False, buffer))
            break
        return [(reasoning, text) for reasoning, text in out if text]

    def finish(self) -> list[tuple[bool, str]]:
        if self._harmony is not None:
            return self._harmony.finish()
        held, self._held = self._held, ""
        if not held or (self._after_close and not held.strip()):
            return []
        return [(self.thinking, held)]


@dataclass
class OutputAssembler:
    stop: Sequence[str]
    tool_call_format: str
    # Markup the prompt already ends with (forced tool choice); parsed, never shown.
    assistant_prefix: str = ""
    parallel_tool_calls: bool = True
    # None: no limit. The grammar enforces it where the format has one; this is the backstop.
    max_tool_calls: int | None = None
    # The prompt left `<think>` open: the output starts as reasoning.
    thinking: bool = False
    # The offered tools (chat-template form), for parsers that type arguments by their schema.
    tools: Sequence[dict[str, Any]] = ()
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: list[pb.ToolCall] = field(default_factory=list)
    # Where each `text` piece came from in the raw text fed so far: [start, end) offsets (None
    # where unknown), so logprobs.py can tell which tokens it shows.
    text_spans: list[tuple[int, int] | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stops = StopSequenceMatcher(self.stop)
        self._parser = make_parser(self.tool_call_format, tools=self.tools)
        self._thoughts = ThinkingSplitter(thinking=self.thinking)
        # Raw text fed; where the visible text starts in it (after any reasoning: from there on
        # every raw character reaches the stop matcher); the parser's input so far (the stop
        # matcher's output after the prefix) and how far its text pieces have been located.
        self._fed = 0
        self._visible_from: int | None = None
        self._parser_input = self.assistant_prefix
        self._located = 0
        self._after_call = False
        if self.assistant_prefix:
            self._accept(self._parser.feed(self.assistant_prefix))

    @property
    def stopped(self) -> bool:
        """A stop sequence was seen, or the last call allowed arrived."""
        return self._stops.stopped or self._calls_full

    @property
    def _calls_full(self) -> bool:
        limit = 1 if not self.parallel_tool_calls else self.max_tool_calls
        return limit is not None and len(self.tool_calls) >= limit

    @property
    def in_reasoning(self) -> bool:
        """The output is inside `<think>...</think>` (or harmony's analysis channel) now."""
        return self._thoughts.in_reasoning

    def feed(self, text: str) -> list[OutputPiece]:
        """Newly decoded text -> pieces to stream now."""
        if self.stopped:
            return []
        self._fed += len(text)
        return self._split(self._thoughts.feed(text))

    def finish(self) -> list[OutputPiece]:
        """Generation ended: release held text and any unfinished markup (as text)."""
        out: list[OutputPiece] = []
        if not self.stopped:
            out = self._split(self._thoughts.finish())
        pieces: list[Piece] = []
        if not self.stopped:
            pieces.extend(self._parser.feed(self._to_parser(self._stops.flush())))
        pieces.extend(self._parser.finish())
        return out + self._accept(pieces)

    def _split(self, runs: list[tuple[bool, str]]) -> list[OutputPiece]:
        out: list[OutputPiece] = []
        for is_reasoning, text in runs:
            if self.stopped:
                break
            if is_reasoning:
                self.reasoning.append(text)
                out.append(Reasoning(text))
            else:
                if self._visible_from is None:
                    # The first visible run is the end of everything fed (nothing held after it).
                    self._visible_from = self._fed - len(text)
                out.extend(self._accept(self._parser.feed(self._to_parser(self._stops.feed(text)))))
        return out

    def _to_parser(self, text: str) -> str:
        self._parser_input += text
        return text

    def _locate(self, text: str) -> tuple[int, int] | None:
        """The raw span of a text piece the parser gave back: the next place its input holds
        it (after a call: the last, so the call's own markup cannot match first)."""
        source = self._parser_input
        at = source.rfind(text, self._located) if self._after_call else source.find(text, self._located)
        if at < 0 or self._visible_from is None:
            return None
        self._located = at + len(text)
        start = self._visible_from + at - len(self.assistant_prefix)
        return (start, start + len(text)) if start >= 0 else None

    def _accept(self, pieces: list[Piece]) -> list[OutputPiece]:
        out: list[OutputPiece] = []
        for piece in pieces:
            if self._calls_full:
                break  # no more calls allowed: the rest of the output is dropped
            if isinstance(piece, TextPiece):
                if piece.text:
                    self.text.append(piece.text)
                    self.text_spans.append(self._locate(piece.text))
                    self._after_call = False
                    out.append(piece.text)
            elif isinstance(piece, ToolCallPiece):
                self._after_call = True
                call = pb.ToolCall(
                    id=piece.call.id,
                    name=piece.call.name,
                    arguments=piece.call.arguments,
                    kind=pb.TOOL_KIND_FUNCTION,
                )
                self.tool_calls.append(call)
                out.append(call)
        return out

    @property
    def visible_text(self) -> str:
        return "".join(self.text)

    @property
    def reasoning_text(self) -> str:
        return "".join(self.reasoning)

"""Generated text -> visible text and tool calls, with stop sequences. Pure, per request.

Order matters: stop sequences cut the raw text first (a stop ends generation wherever it
appears), then the tool-call parser separates markup from visible text.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vlmserve.engine.output.stop_sequences import StopSequenceMatcher
from vlmserve.engine.toolcalls.harmony import HarmonySplitter, starts_harmony
from vlmserve.engine.toolcalls.parsers import Piece, TextPiece, ToolCallDeltaPiece, ToolCallPiece
from vlmserve.engine.toolcalls.registry import make_parser
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = ["OutputAssembler", "OutputPiece", "Reasoning", "ThinkingSplitter", "prompt_leaves_thinking"]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True, slots=True)
class Reasoning:
    """Thinking text (between `<think>` and `</think>`): never part of the visible text."""

    text: str


OutputPiece = str | pb.ToolCall | pb.ToolCallDelta | Reasoning


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
    # Where the harmony reader's input starts in the raw output.
    _harmony_from: int = 0
    # Raw text fed so far; the runs of the last feed()/finish() start at these raw offsets.
    _fed: int = 0
    starts: list[int | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.thinking:
            self._may_open = False

    @property
    def in_reasoning(self) -> bool:
        return self._harmony.thinking if self._harmony is not None else self.thinking

    def feed(self, text: str) -> list[tuple[bool, str]]:
        self._fed += len(text)
        if self._harmony is not None:
            return self._from_harmony(self._harmony.feed(text))
        out: list[tuple[bool, str, int | None]] = []
        buffer, self._held = self._held + text, ""

        def start_of(buffer: str) -> int:
            """`buffer` is always the end of the raw text fed: where a run cut from it starts."""
            return self._fed - len(buffer)

        while buffer:
            if self.thinking:
                end = buffer.find(THINK_CLOSE)
                if end >= 0:
                    out.append((True, buffer[:end], start_of(buffer)))
                    buffer = buffer[end + len(THINK_CLOSE) :]
                    self.thinking, self._after_close = False, True
                    continue
                keep = _held_prefix(buffer, THINK_CLOSE)
                out.append((True, buffer[: len(buffer) - keep], start_of(buffer)))
                self._held = buffer[len(buffer) - keep :]
                break
            if self._may_open:
                harmony = starts_harmony(buffer)
                if harmony:
                    self._harmony, self._may_open = HarmonySplitter(), False
                    self._harmony_from = start_of(buffer)
                    return self._from_harmony(self._harmony.feed(buffer))
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
            out.append((False, buffer, start_of(buffer)))
            break
        return self._runs(out)

    def finish(self) -> list[tuple[bool, str]]:
        if self._harmony is not None:
            return self._from_harmony(self._harmony.finish())
        held, self._held = self._held, ""
        if not held or (self._after_close and not held.strip()):
            return self._runs([])
        return self._runs([(self.thinking, held, self._fed - len(held))])

    def _runs(self, out: list[tuple[bool, str, int | None]]) -> list[tuple[bool, str]]:
        kept = [run for run in out if run[1]]
        self.starts = [start for _, _, start in kept]
        return [(reasoning, text) for reasoning, text, _ in kept]

    def _from_harmony(self, runs: list[tuple[bool, str]]) -> list[tuple[bool, str]]:
        assert self._harmony is not None
        base = self._harmony_from
        self.starts = [None if start is None else base + start for start in self._harmony.starts]
        return runs


@dataclass
class OutputAssembler:
    stop: Sequence[str]
    tool_call_format: str
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
    # With `track_spans` (logprobs asked): where each `text` piece came from in the raw text fed,
    # as [start, end) offsets (a piece can join runs that were apart in the raw text; empty where
    # unknown), so logprobs.py can tell which tokens it shows. Without: empty lists.
    track_spans: bool = False
    text_spans: list[list[tuple[int, int]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stops = StopSequenceMatcher(self.stop)
        self._parser = make_parser(self.tool_call_format, tools=self.tools)
        self._thoughts = ThinkingSplitter(thinking=self.thinking)
        # Span tracking: the raw text fed; the visible runs (the stop matcher's input, one
        # stream) as (offset in that stream, raw offset or None); the parser's input so far (the
        # stop matcher's output, a prefix of the visible stream) and how far
        # its text pieces have been located in it.
        self._raw = ""
        self._runs: list[tuple[int, int | None]] = []
        self._visible_length = 0
        self._parser_input = ""
        self._located = 0
        self._after_call = False

    @property
    def stop_sequence(self) -> str | None:
        """The stop sequence that ended the output, if one did."""
        return self._stops.matched

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
        if self.track_spans:
            self._raw += text
        return self._split(self._thoughts.feed(text))

    def finish(self) -> list[OutputPiece]:
        """Generation ended: release held text; a call cut off stays the unfinished call it began."""
        out = [] if self.stopped else self._split(self._thoughts.finish())
        pieces: list[Piece] = []
        if not self.stopped:
            pieces.extend(self._parser.feed(self._to_parser(self._stops.flush())))
        pieces.extend(self._parser.finish())
        return out + self._accept(pieces)

    def _split(self, runs: list[tuple[bool, str]]) -> list[OutputPiece]:
        out: list[OutputPiece] = []
        for (is_reasoning, text), start in zip(runs, self._thoughts.starts, strict=True):
            if self.stopped:
                break
            if is_reasoning:
                self.reasoning.append(text)
                out.append(Reasoning(text))
            else:
                if self.track_spans:
                    self._runs.append((self._visible_length, start))
                    self._visible_length += len(text)
                out.extend(self._accept(self._parser.feed(self._to_parser(self._stops.feed(text)))))
        return out

    def _to_parser(self, text: str) -> str:
        if self.track_spans:
            self._parser_input += text
        return text

    def _locate(self, text: str) -> list[tuple[int, int]]:
        """The raw spans of a text piece the parser gave back. It is the next place the parser's
        input holds it (after a call: the last, so the call's own markup cannot match first);
        each part is checked against the raw text, so a wrong guess lists no token, never a
        wrong one."""
        source = self._parser_input
        at = source.rfind(text, self._located) if self._after_call else source.find(text, self._located)
        if at < 0:
            return []
        self._located = at + len(text)
        begin = at  # in the visible stream
        spans = []
        index = max(0, bisect.bisect_right(self._runs, begin, key=lambda run: run[0]) - 1)
        for run_index in range(index, len(self._runs)):
            run_begin, raw_start = self._runs[run_index]
            run_end = (
                self._runs[run_index + 1][0] if run_index + 1 < len(self._runs) else self._visible_length
            )
            low, high = max(begin, run_begin), min(begin + len(text), run_end)
            if run_begin >= begin + len(text):
                break
            if low >= high or raw_start is None:
                continue
            span = (raw_start + low - run_begin, raw_start + high - run_begin)
            if self._raw[span[0] : span[1]] == text[low - begin : high - begin]:
                spans.append(span)
        return spans

    def _accept(self, pieces: list[Piece]) -> list[OutputPiece]:
        out: list[OutputPiece] = []
        for piece in pieces:
            if self._calls_full:
                break  # no more calls allowed: the rest of the output is dropped
            if isinstance(piece, TextPiece):
                if piece.text:
                    self.text.append(piece.text)
                    self.text_spans.append(self._locate(piece.text) if self.track_spans else [])
                    self._after_call = False
                    out.append(piece.text)
            elif isinstance(piece, ToolCallDeltaPiece):
                out.append(pb.ToolCallDelta(id=piece.id, name=piece.name, arguments=piece.arguments))
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

"""Generated text -> visible text and tool calls, with stop sequences. Pure, per request.

Order matters: stop sequences cut the raw text first (a stop ends generation wherever it
appears), then the tool-call parser separates markup from visible text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from vlmserve.engine.v1 import engine_pb2 as pb

from .stop_sequences import StopSequenceMatcher
from .tool_parsers import Piece, TextPiece, ToolCallPiece, make_parser

__all__ = ["OutputAssembler", "OutputPiece"]

OutputPiece = str | pb.ToolCall


@dataclass
class OutputAssembler:
    stop: Sequence[str]
    tool_call_format: str
    # Markup the prompt already ends with (forced tool choice); parsed, never shown.
    assistant_prefix: str = ""
    parallel_tool_calls: bool = True
    # None: no limit. The grammar enforces it where the format has one; this is the backstop.
    max_tool_calls: int | None = None
    text: list[str] = field(default_factory=list)
    tool_calls: list[pb.ToolCall] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stops = StopSequenceMatcher(self.stop)
        self._parser = make_parser(self.tool_call_format)
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

    def feed(self, text: str) -> list[OutputPiece]:
        """Newly decoded text -> pieces to stream now."""
        if self.stopped:
            return []
        return self._accept(self._parser.feed(self._stops.feed(text)))

    def finish(self) -> list[OutputPiece]:
        """Generation ended: release held text and any unfinished markup (as text)."""
        pieces: list[Piece] = []
        if not self.stopped:
            pieces.extend(self._parser.feed(self._stops.flush()))
        pieces.extend(self._parser.finish())
        return self._accept(pieces)

    def _accept(self, pieces: list[Piece]) -> list[OutputPiece]:
        out: list[OutputPiece] = []
        for piece in pieces:
            if self._calls_full:
                break  # no more calls allowed: the rest of the output is dropped
            if isinstance(piece, TextPiece):
                if piece.text:
                    self.text.append(piece.text)
                    out.append(piece.text)
            elif isinstance(piece, ToolCallPiece):
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

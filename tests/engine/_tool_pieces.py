"""Tool-call parser pieces for tests: a whole output fed through a parser at once."""

from __future__ import annotations

from collections.abc import Sequence

from vlmserve.engine.toolcalls.parsers import Piece, TextPiece, ToolCallParser


def collect(parser: ToolCallParser, chunks: Sequence[str]) -> list[Piece]:
    """Feed all chunks then finish; adjacent text pieces merged."""
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

"""JSON as the store writes it (`json.dumps`'s text, default separators, ASCII), in pieces: a
30 MiB string is never escaped, encoded or measured whole, so the store holds no second copy of
a large input beside the request's own (docs/hardening.md, "Memory per request byte")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

# Strings longer than this are escaped a slice at a time.
SLICE_CHARS = 1 << 20
# Pieces are joined up to about this many characters before they are handed out.
_PIECE_CHARS = 1 << 20


def json_pieces(value: Any) -> Iterator[str]:
    """`json.dumps(value)`, in order, in pieces of at most a few MiB (the join is the text). JSON
    escapes each character by itself, so a string's slices add up to the string."""
    buffered: list[str] = []
    size = 0
    for piece in _pieces(value):
        buffered.append(piece)
        size += len(piece)
        if size >= _PIECE_CHARS:
            yield "".join(buffered)
            buffered, size = [], 0
    if buffered:
        yield "".join(buffered)


def json_size(value: Any) -> int:
    """`len(json.dumps(value))` without the whole text at once: a 30 MiB string would be
    encoded (and the text held next to the request's own copies) only to be counted."""
    return sum(len(piece) for piece in _pieces(value))


def _pieces(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        if len(value) <= SLICE_CHARS:
            yield json.dumps(value)
            return
        yield '"'
        for start in range(0, len(value), SLICE_CHARS):
            yield json.dumps(value[start : start + SLICE_CHARS])[1:-1]
        yield '"'
        return
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        yield "{"
        for index, (key, item) in enumerate(value.items()):
            if index:
                yield ", "
            yield from _pieces(key)
            yield ": "
            yield from _pieces(item)
        yield "}"
        return
    if isinstance(value, list | tuple):
        yield "["
        for index, item in enumerate(value):
            if index:
                yield ", "
            yield from _pieces(item)
        yield "]"
        return
    # Numbers, booleans, null, and dicts with keys json.dumps converts itself.
    yield json.dumps(value)

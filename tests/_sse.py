"""Lines of our event streams as they are on the wire.

httpx's `iter_lines()` splits on CR LF, CR and LF alike, so a stream framed with CR LF (which
strict parsers, the official Open Responses suite among them, read as no events at all) looks
fine through it. These readers split on LF only and fail on any CR: our streams are framed with
LF, and json.dumps escapes every CR inside a payload.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator

import httpx


def wire_lines(text: str) -> list[str]:
    """The lines of a whole stream body (the empty string after its final LF left out)."""
    assert "\r" not in text, f"CR on the wire: {text[:200]!r}"
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def _split(chunks: Iterable[str]) -> Iterator[str]:
    pending = ""
    for chunk in chunks:
        assert "\r" not in chunk, f"CR on the wire: {chunk[:200]!r}"
        pending += chunk
        *lines, pending = pending.split("\n")
        yield from lines
    if pending:
        yield pending


def iter_lines(response: httpx.Response) -> Iterator[str]:
    """`response.iter_lines()`, strictly LF-framed."""
    yield from _split(response.iter_text())


async def aiter_lines(response: httpx.Response) -> AsyncIterator[str]:
    """`response.aiter_lines()`, strictly LF-framed."""
    pending = ""
    async for chunk in response.aiter_text():
        assert "\r" not in chunk, f"CR on the wire: {chunk[:200]!r}"
        pending += chunk
        *lines, pending = pending.split("\n")
        for line in lines:
            yield line
    if pending:
        yield pending

"""Reading a JSON request body: bounded in size and depth, and every failure an OpenAI-shaped 4xx."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from starlette.types import Message

from vlmserve.facade.http.api_keys import owner_of
from vlmserve.facade.http.body_budget import BodyHold
from vlmserve.facade.http.errors import APIError
from vlmserve.facade.settings import Limits

# Deeper than any real request (tool schemas included); deeper values would make later
# recursive code (json.dumps, protobuf, the store) fail with RecursionError.
MAX_JSON_DEPTH = 100
# A `\uD800`-`\uDFFF` escape: JSON allows a lone surrogate, UTF-8 (protobuf, SQLite, our own
# JSON answers) does not. Only bodies containing one are searched for the bad string.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE_ESCAPE_TEXT = re.compile(r"\\u[dD][89a-fA-F]")
# Bodies below this are parsed on the event loop; larger ones (base64 images) in a thread.
_INLINE_PARSE_BYTES = 256 * 1024


def _refuse_constant(name: str) -> Any:
    # NaN and Infinity are not JSON; Python's parser would accept them.
    raise ValueError(name)


def too_large(max_bytes: int) -> APIError:
    return APIError(413, f"The request body is larger than {max_bytes} bytes.", code="request_too_large")


async def read_json(request: Request, *, limits: Limits, hold: BodyHold | None = None) -> Any:
    """The parsed body. The size limit is enforced while reading: a larger body is never buffered.
    With `hold`, the body's bytes are held in the facade's in-flight budget (body_budget.py) as
    they arrive, under the request's owner. The body must arrive within `limits.body_timeout_s`,
    and at `limits.min_body_bytes_per_s` or faster after `limits.body_rate_grace_s`."""
    max_bytes = limits.max_request_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise too_large(max_bytes)
    # One buffer grown in place (realloc of a large block is a remap, not a copy), not chunks
    # joined at the end (the body twice).
    raw = bytearray()
    async with metered_body(request, limits=limits, hold=hold, max_bytes=max_bytes) as body:
        async for chunk in body.stream():
            raw += chunk
    if not raw.strip():
        raise APIError(400, "The request body is empty; send a JSON object.", code="invalid_json")
    size = len(raw)
    # The bytes go as soon as they are text: the body is held at most twice while it is parsed
    # (its text, then the parsed value), never three times (bytes, text, value).
    text, check_strings = decode_body(raw)
    del raw
    bounds = JsonBounds.of(limits)
    if size < _INLINE_PARSE_BYTES:
        return parse_text(text, check_strings=check_strings, bounds=bounds)
    return await asyncio.to_thread(parse_text, text, check_strings=check_strings, bounds=bounds)


@asynccontextmanager
async def metered_body(
    request: Request,
    *,
    limits: Limits,
    hold: BodyHold | None,
    max_bytes: int,
    too_large_error: Callable[[int], APIError] = too_large,
) -> AsyncIterator[Request]:
    """`request` whose body, read inside the block (`stream()`, `form()`), is metered as it
    arrives: more than `max_bytes` is `too_large_error` (413), each chunk is held in `hold`
    (503 when the budget or the owner's share is full), and the whole body must arrive within
    the body timeout and, after a grace period, at the minimum body rate (else 408)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    size = 0
    if hold is not None:
        hold.owner = owner_of(request)

    def deadline() -> float:
        # Every byte buys 1/rate seconds more, up to the overall timeout.
        allowed = limits.body_rate_grace_s + size / limits.min_body_bytes_per_s
        return started + min(limits.body_timeout_s, allowed)

    timeout = asyncio.timeout_at(deadline())

    async def receive() -> Message:
        nonlocal size
        message = await request.receive()
        if message["type"] == "http.request":
            size += len(message.get("body", b""))
            if size > max_bytes:
                raise too_large_error(max_bytes)
            if hold is not None:
                hold.reserve(size)
            timeout.reschedule(deadline())
        return message

    try:
        async with timeout:
            yield Request(request.scope, receive)
    except TimeoutError:
        elapsed = loop.time() - started
        if elapsed < limits.body_timeout_s:
            message = (
                f"The request body arrived slower than {limits.min_body_bytes_per_s} bytes per second "
                f"({size} bytes in {elapsed:.1f} seconds)."
            )
        else:
            message = f"The request body did not arrive within {limits.body_timeout_s:g} seconds."
        raise APIError(408, message, code="request_timeout", headers={"Connection": "close"}) from None


@dataclass(frozen=True)
class JsonBounds:
    """What one body may hold: JSON objects in all (counted while parsing, so a body of many
    tiny objects is refused before they are all made) and parts (objects in arrays: messages,
    items, content parts and blocks, whatever the API), counted before any translation."""

    max_objects: int
    max_parts: int

    @classmethod
    def of(cls, limits: Limits) -> JsonBounds:
        return cls(limits.max_json_objects, limits.max_request_parts)


class _Dropped:
    """What an object past `max_objects` is parsed as: the body is refused, and until the parser
    is done each further object costs a reference, not a dict."""


_DROPPED = _Dropped()


def parse_message(text: str, *, limits: Limits) -> Any:
    """A JSON text that arrived as text (a WebSocket message) under the same rules and bounds as
    a request body."""
    check_strings = _SURROGATE_ESCAPE_TEXT.search(text) is not None
    return parse_text(text, check_strings=check_strings, bounds=JsonBounds.of(limits))


def decode_body(raw: bytes | bytearray) -> tuple[str, bool]:
    """The body as text (strict UTF-8 first: json.loads would guess UTF-16/32 and let encoded
    surrogates through), and whether its strings must be checked for lone surrogates."""
    check_strings = _SURROGATE_ESCAPE.search(raw) is not None
    try:
        return raw.decode("utf-8"), check_strings
    except UnicodeDecodeError:
        raise APIError(400, "The request body is not valid JSON.", code="invalid_json") from None


class _TooManyObjects(Exception):
    pass


def parse_text(text: str, *, check_strings: bool, bounds: JsonBounds) -> Any:
    kept = 0
    dropped = 0

    def counted(value: dict[str, Any]) -> object:
        # Called by the C parser for each object it has made (inner ones first). Past
        # `max_objects`, an object holding no other object or array (a text part, a block) is
        # dropped at once, so a body of many tiny parts (each ~200 bytes made from ~30 sent)
        # never has more than `max_objects` of them in memory; the objects holding them are
        # kept (up to as many again), so the walk below still finds the array that holds too
        # many parts and names it.
        nonlocal kept, dropped
        if kept >= bounds.max_objects and _is_leaf(value):
            dropped += 1
            return _DROPPED
        kept += 1
        if kept > 2 * bounds.max_objects:
            raise _TooManyObjects
        return value

    try:
        value = json.loads(text, parse_constant=_refuse_constant, object_hook=counted)
    except _TooManyObjects:
        raise _too_many_objects(bounds.max_objects) from None
    except (ValueError, RecursionError):
        # JSONDecodeError is a ValueError; its text is not echoed.
        raise APIError(400, "The request body is not valid JSON.", code="invalid_json") from None
    _check_structure(value, check_strings=check_strings, max_parts=bounds.max_parts)
    if kept + dropped > bounds.max_objects:
        raise _too_many_objects(bounds.max_objects)
    return value


def _is_leaf(value: dict[str, Any]) -> bool:
    return all(not isinstance(item, dict | list | _Dropped) for item in value.values())


def _too_many_objects(max_objects: int) -> APIError:
    return APIError(
        400,
        f"The request body holds more than {max_objects} JSON objects (this server's limit).",
        code="request_too_complex",
    )


# A node's place, made into a path only for an error: (parent place, key or index).
_Place = tuple[Any, str | int] | None


def _path(place: _Place) -> str:
    keys: list[str | int] = []
    while place is not None:
        place, key = place
        keys.append(key)
    path = ""
    for key in reversed(keys):
        path = f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else key)
    return path


def _check_structure(value: Any, *, check_strings: bool, max_parts: int) -> None:
    """Depth, parts (objects in arrays) and (when asked) lone surrogates, walked without
    recursion; `param` is the path. Paths are made only for an error: a body of many small
    parts costs a tuple per container here, not a string per node."""
    parts = 0
    stack: list[tuple[Any, _Place, int]] = [(value, None, 0)]
    while stack:
        current, place, depth = stack.pop()
        if isinstance(current, dict):
            if depth >= MAX_JSON_DEPTH:
                raise _too_deep(place)
            for key, item in current.items():
                if check_strings and not _is_utf8_safe(key):
                    raise _lone_surrogate(_path(place) or None)
                if isinstance(item, dict | list) or (check_strings and isinstance(item, str)):
                    stack.append((item, (place, key), depth + 1))
        elif isinstance(current, list):
            if depth >= MAX_JSON_DEPTH:
                raise _too_deep(place)
            for index, item in enumerate(current):
                if isinstance(item, dict | _Dropped):
                    parts += 1
                    if parts > max_parts:
                        raise _too_many_parts(_path(place), max_parts)
                if isinstance(item, dict | list) or (check_strings and isinstance(item, str)):
                    stack.append((item, (place, index), depth + 1))
        elif check_strings and isinstance(current, str) and not _is_utf8_safe(current):
            raise _lone_surrogate(_path(place))


def _too_deep(place: _Place) -> APIError:
    return APIError(
        400,
        f"The request body is nested more than {MAX_JSON_DEPTH} levels deep.",
        param=_shown(_path(place)) or None,
        code="invalid_json",
    )


def _too_many_parts(path: str, max_parts: int) -> APIError:
    where = _shown(path) or "the request body"
    return APIError(
        400,
        f"Invalid value for '{where}': a request holds at most {max_parts} messages, items, "
        "content parts and blocks together (this server's limit).",
        param=_shown(path) or None,
        code="too_many_parts",
    )


def _is_utf8_safe(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _lone_surrogate(path: str | None) -> APIError:
    where = f"'{_shown(path)}'" if path else "the request body"
    return APIError(
        400,
        f"Invalid value for {where}: the string contains an unpaired UTF-16 surrogate (\\uD800-\\uDFFF).",
        param=_shown(path) if path else None,
        code="invalid_value",
    )


def _shown(path: str | None) -> str:
    # Keys come from the client; keep the echoed path short.
    return (path or "")[:200]

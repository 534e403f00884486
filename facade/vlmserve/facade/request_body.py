"""Reading a JSON request body: bounded in size, and every failure an OpenAI-shaped 4xx."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import Request

from .errors import APIError


def _refuse_constant(name: str) -> Any:
    # NaN and Infinity are not JSON; Python's parser would accept them.
    raise ValueError(name)


def too_large(max_bytes: int) -> APIError:
    return APIError(413, f"The request body is larger than {max_bytes} bytes.", code="request_too_large")


async def read_json(request: Request, *, max_bytes: int) -> Any:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise too_large(max_bytes)
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        raise APIError(400, "The request body is empty; send a JSON object.", code="invalid_json")
    # Large bodies (base64 images) take a while to parse; keep the event loop free meanwhile.
    if size < 256 * 1024:
        return _parse_sync(raw)
    return await asyncio.to_thread(_parse_sync, raw)


def _parse_sync(raw: bytes) -> Any:
    try:
        return json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        # UnicodeDecodeError and JSONDecodeError are ValueErrors; their text is not echoed.
        raise APIError(400, "The request body is not valid JSON.", code="invalid_json") from None

"""The facade's own bounds on a request: headers (ASGI middleware, 431) and tools.

Body size is bounded where the body is read (`request_body`), image bytes and pixels by the
translation (`image_limits`), images and PDF pages per request by the translation's budget
(`vlmserve.responses._budget`, given `images_per_request`), `max_output_tokens` by the service;
these are the rest.
"""

from __future__ import annotations

import json

from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

from vlmserve.facade.http.errors import APIError
from vlmserve.facade.settings import Limits

REQUEST_HEADER_FIELDS_TOO_LARGE = 431


class HeaderLimits:
    """Refuses requests with too many headers, or too many header bytes, before any route runs
    (and paths holding control characters: 404).

    The HTTP server bounds what it buffers too (uvicorn's h11 `h11_max_incomplete_event_size`,
    set from `max_header_bytes` by the CLI); this check also holds behind other servers.
    """

    def __init__(self, app: ASGIApp, *, max_headers: int, max_header_bytes: int) -> None:
        self.app = app
        self.max_headers = max_headers
        self.max_header_bytes = max_header_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            error = self._check(scope["headers"]) or _check_path(scope["path"])
            if error is not None:
                await error.to_response()(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _check(self, headers: list[tuple[bytes, bytes]]) -> APIError | None:
        if len(headers) > self.max_headers:
            return APIError(
                REQUEST_HEADER_FIELDS_TOO_LARGE,
                f"The request has more than {self.max_headers} headers.",
                code="request_header_fields_too_large",
            )
        if sum(len(name) + len(value) for name, value in headers) > self.max_header_bytes:
            return APIError(
                REQUEST_HEADER_FIELDS_TOO_LARGE,
                f"The request headers are larger than {self.max_header_bytes} bytes.",
                code="request_header_fields_too_large",
            )
        return None


def _check_path(path: str) -> APIError | None:
    """A path whose decoded form holds a control character names nothing here: 404. Starlette
    matches routes with `^...$`, and `$` also matches before a final newline, so
    `/v1/models/tiny%0A` reached the route as `tiny` (200) where the same name in a body is a 404:
    a name is found by one rule, wherever it is given."""
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in path):
        return APIError(404, "Not found: the path holds a control character.", code="not_found")
    return None


def check_tools(tools: object, limits: Limits) -> None:
    """At most `max_tools` tools (a namespace's tools each count), each at most `max_tool_bytes`
    as JSON. `tools` as sent, or typed (another API's tools, translated). Shapes are the
    translation's business: anything that is not a list is left to it."""
    if not isinstance(tools, list):
        return
    count = 0
    for index, typed in enumerate(tools):
        # Measured as the JSON it stands for (a typed tool: the fields it was given).
        tool = (
            typed.model_dump(mode="json", by_alias=True, exclude_unset=True, serialize_as_any=True)
            if isinstance(typed, BaseModel)
            else typed
        )
        inner = tool.get("tools") if isinstance(tool, dict) and tool.get("type") == "namespace" else None
        count += len(inner) if isinstance(inner, list) else 1
        if count > limits.max_tools:
            raise APIError(
                400,
                f"Invalid value for 'tools': at most {limits.max_tools} tools are accepted.",
                param="tools",
                code="array_above_max_length",
            )
        size = len(json.dumps(tool, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
        if size > limits.max_tool_bytes:
            raise APIError(
                400,
                f"Invalid value for 'tools[{index}]': a tool may be at most {limits.max_tool_bytes} "
                "bytes of JSON.",
                param=f"tools[{index}]",
                code="invalid_value",
            )

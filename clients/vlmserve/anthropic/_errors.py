"""Errors as Anthropic sends them: `{"type": "error", "error": {"type", "message"}}`, the type and
status chosen from the status (and code) the rest of the server decided."""

from __future__ import annotations

from typing import Any

# A full engine queue, or a facade busy reading other large bodies: Anthropic's "overloaded"
# (529, which its SDKs retry).
OVERLOADED_CODES = frozenset({"engine_overloaded", "server_busy"})
OVERLOADED_STATUS = 529

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    OVERLOADED_STATUS: "overloaded_error",
}


def anthropic_status(status: int, code: str | None) -> int:
    return OVERLOADED_STATUS if code in OVERLOADED_CODES else status


def anthropic_error_type(status: int | None, code: str | None) -> str:
    if code in OVERLOADED_CODES:
        return "overloaded_error"
    if status is None:
        return "api_error"
    return _TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def error_body(status: int, code: str | None, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": anthropic_error_type(status, code), "message": message}}

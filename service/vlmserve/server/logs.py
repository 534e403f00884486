"""Log set-up shared by the engine, the facade and the launcher: text or one JSON object per line.

Every record gets the ids of the request it belongs to, taken from context variables the
transport binds (`bind`): `request_id` (the facade's per-HTTP-request id, the engine's request
id — which the facade sets to the response id) and `response_id`, plus `trace_id` / `span_id`
of the current OpenTelemetry span when tracing is on. contextvars follow asyncio tasks and
`asyncio.to_thread`, so lines logged anywhere while serving a request carry its ids without
being passed them. A record may also carry them as `extra=` (the engine's generation thread
serves many requests at once and names the one it logs about).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Literal

from opentelemetry import trace

LogFormat = Literal["text", "json"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Renamed so the JSON reads like other services' logs (and `message`, not `msg`).
_JSON_FIELDS = {"asctime": "time", "levelname": "level", "name": "logger"}

request_id_var: ContextVar[str | None] = ContextVar("vlmserve_request_id", default=None)
response_id_var: ContextVar[str | None] = ContextVar("vlmserve_response_id", default=None)


@contextmanager
def bind(*, request_id: str | None = None, response_id: str | None = None) -> Iterator[None]:
    """Within the block (and the tasks and threads it starts), records carry these ids."""
    tokens = []
    if request_id is not None:
        tokens.append((request_id_var, request_id_var.set(request_id)))
    if response_id is not None:
        tokens.append((response_id_var, response_id_var.set(response_id)))
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def bind_response(response_id: str) -> None:
    """From here to the end of the current task: records carry `response_id`. For a handler
    that learns the response id part-way through; the task's context ends with the request."""
    response_id_var.set(response_id)


class ContextIds(logging.Filter):
    """Puts the request's ids on each record; ids given as `extra=` win. Absent ids are left
    off rather than written as null, so the JSON stays short for lines outside any request."""

    def filter(self, record: logging.LogRecord) -> bool:
        ids = {"request_id": request_id_var.get(), "response_id": response_id_var.get()}
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            ids["trace_id"] = format(span.trace_id, "032x")
            ids["span_id"] = format(span.span_id, "016x")
        for name, value in ids.items():
            if value is not None and getattr(record, name, None) is None:
                setattr(record, name, value)
        return True


def json_formatter() -> logging.Formatter:
    # Imported here: the client library (which shares this package) does not depend on it.
    from pythonjsonlogger.json import JsonFormatter

    return JsonFormatter(
        "{asctime}{levelname}{name}{message}",
        style="{",
        rename_fields=_JSON_FIELDS,
        timestamp=False,
        datefmt="%Y-%m-%dT%H:%M:%S%z",
    )


def configure_logging(level: str, log_format: LogFormat = "text") -> None:
    """One handler on the root logger (stderr). uvicorn's loggers must be left without their
    own handlers (`log_config=None`) so their lines go through it too."""
    handler = logging.StreamHandler()
    handler.addFilter(ContextIds())
    handler.setFormatter(json_formatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())

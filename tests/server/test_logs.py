"""vlmserve.server.logs: JSON lines and the request ids every record carries."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider

from vlmserve.server.logs import ContextIds, bind, bind_response, json_formatter, request_id_var


@pytest.fixture
def json_lines() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(ContextIds())
    handler.setFormatter(json_formatter())
    logger = logging.getLogger("tests.logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield logger, stream
    finally:
        logger.removeHandler(handler)


def records(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_line_outside_any_request_has_no_ids(json_lines: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = json_lines
    logger.warning("hello %s", "world")
    (line,) = records(stream)
    assert line["message"] == "hello world"
    assert line["level"] == "WARNING"
    assert line["logger"] == "tests.logs"
    assert "time" in line
    assert not {"request_id", "response_id", "trace_id"} & line.keys()


def test_bound_ids_are_on_every_line_then_unbound(json_lines: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = json_lines
    with bind(request_id="req_1"):
        logger.info("first")
        with bind(response_id="resp_1"):
            logger.info("second")
        logger.info("third")
    logger.info("after")
    first, second, third, after = records(stream)
    assert first["request_id"] == "req_1" and "response_id" not in first
    assert (second["request_id"], second["response_id"]) == ("req_1", "resp_1")
    assert third["request_id"] == "req_1" and "response_id" not in third
    assert "request_id" not in after
    assert request_id_var.get() is None


def test_an_id_given_as_extra_wins(json_lines: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = json_lines
    with bind(request_id="req_outer"):
        logger.info("finished", extra={"request_id": "req_named"})
    assert records(stream)[0]["request_id"] == "req_named"


def test_bind_response_lasts_for_the_task(json_lines: tuple[logging.Logger, io.StringIO]) -> None:
    import contextvars

    logger, stream = json_lines

    def handler() -> None:
        bind_response("resp_later")
        logger.info("inside")

    contextvars.copy_context().run(handler)
    logger.info("outside")
    inside, outside = records(stream)
    assert inside["response_id"] == "resp_later"
    assert "response_id" not in outside


def test_the_current_span_is_named(json_lines: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = json_lines
    tracer = TracerProvider().get_tracer("tests")
    with tracer.start_as_current_span("work") as span:
        logger.info("traced")
    line = records(stream)[0]
    context = span.get_span_context()
    assert line["trace_id"] == format(context.trace_id, "032x")
    assert line["span_id"] == format(context.span_id, "016x")


def test_exceptions_stay_inside_the_one_line(json_lines: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = json_lines
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        logger.exception("failed")
    (line,) = records(stream)  # one JSON object, however many lines the traceback has
    assert "ValueError: bad" in str(line["exc_info"])

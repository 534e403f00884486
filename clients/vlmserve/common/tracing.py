"""OpenTelemetry traces: the W3C trace context crosses the facade -> engine gRPC hop in call metadata.

Spans go through the OpenTelemetry API only; without `configure_tracing` (no OTLP endpoint set,
the default) the API's no-op tracer makes them free and nothing is exported or injected.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind

TRACER_NAME = "vlmserve"


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


def configure_tracing(endpoint: str, service_name: str) -> None:
    """Export spans over OTLP/HTTP to `endpoint` (e.g. http://127.0.0.1:4318/v1/traces)."""
    # Imported here: the SDK and exporter are only needed when an endpoint is set.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    trace.set_tracer_provider(provider)


def client_span(method: str) -> trace.Span:
    """A CLIENT span for one engine call, child of the current span; the caller ends it."""
    return tracer().start_span(f"vlmserve.engine.v1.EngineService/{method}", kind=SpanKind.CLIENT)


def inject_metadata(metadata: Sequence[tuple[str, str]], span: trace.Span) -> tuple[tuple[str, str], ...]:
    """`metadata` plus `span`'s W3C trace context (traceparent/tracestate), for an outgoing call."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return (*metadata, *carrier.items())


def extract_context(metadata: Iterable[tuple[str, str | bytes]] | None) -> otel_context.Context:
    """The caller's trace context from incoming gRPC metadata (an empty context if none came)."""
    carrier = {key: value for key, value in metadata or () if isinstance(value, str)}
    return propagate.extract(carrier)


def _epoch_ns(perf_seconds: float) -> int:
    """A time.perf_counter() reading as wall-clock nanoseconds (spans carry epoch times)."""
    return time.time_ns() - int((time.perf_counter() - perf_seconds) * 1e9)


def record_span(
    name: str,
    parent: otel_context.Context | None,
    start: float,
    end: float,
    attributes: dict[str, str | int | float] | None = None,
) -> None:
    """Record a finished span from perf_counter readings taken elsewhere (the generation thread)."""
    span = tracer().start_span(
        name, context=parent, kind=SpanKind.INTERNAL, attributes=attributes, start_time=_epoch_ns(start)
    )
    span.end(end_time=_epoch_ns(end))


__all__ = [
    "SpanKind",
    "client_span",
    "configure_tracing",
    "extract_context",
    "inject_metadata",
    "record_span",
    "tracer",
]

"""OpenTelemetry spans across the client -> engine gRPC hop (W3C trace context in call metadata)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import httpx
import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests._services import start_engine
from tests.facade.helpers import in_process
from vlmserve.client import AsyncEngineClient, EngineClient
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc
from vlmserve.facade import FacadeSettings, Store, create_app

from .conftest import InProcessEngine
from .test_engine_grpc import request

pytestmark = pytest.mark.needs_model

PHASES = ("engine.prepare", "engine.queue", "engine.prefill", "engine.decode")


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    """The process's tracer provider (set once per process) exporting into memory."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@pytest.fixture
def spans(exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    exporter.clear()
    yield exporter
    exporter.clear()


def _finished(exporter: InMemorySpanExporter, trace_id: int, names: set[str]) -> dict[str, ReadableSpan]:
    """This trace's spans by name, once all of `names` ended (phase spans end on the generation thread)."""
    deadline = time.monotonic() + 10
    while True:
        found = {
            s.name: s for s in exporter.get_finished_spans() if s.context and s.context.trace_id == trace_id
        }
        if names <= found.keys() or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def _parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def _descends_from(exporter: InMemorySpanExporter, span: ReadableSpan, ancestor_id: int) -> bool:
    """Whether `ancestor_id` is above `span` (waits for spans in between that end later)."""
    deadline = time.monotonic() + 10
    parent = _parent_id(span)
    while parent is not None and parent != ancestor_id:
        by_id = {s.context.span_id: s for s in exporter.get_finished_spans() if s.context is not None}
        if parent in by_id:
            parent = _parent_id(by_id[parent])
        elif time.monotonic() > deadline:
            return False
        else:
            time.sleep(0.02)
    return parent == ancestor_id


def test_engine_spans_are_children_of_the_callers_span(
    idle_engine: InProcessEngine, spans: InMemorySpanExporter
) -> None:
    async def call() -> tuple[int, int]:
        with trace.get_tracer("test").start_as_current_span("caller") as caller:
            async with AsyncEngineClient(idle_engine.address) as client:
                result = await client.generate_unary(request(request_id="traced-1", max_tokens=4))
        assert result.usage.output_tokens > 0
        context = caller.get_span_context()
        return context.trace_id, context.span_id

    trace_id, caller_id = idle_engine.run(call())
    server_name = "vlmserve.engine.v1.EngineService/GenerateUnary"
    found = _finished(spans, trace_id, {"caller", server_name, *PHASES})
    assert set(PHASES) | {"caller", server_name} <= found.keys(), sorted(found)
    client_span = next(s for s in found.values() if s.kind is trace.SpanKind.CLIENT and s.name == server_name)
    server_span = next(
        s for s in spans.get_finished_spans() if s.kind is trace.SpanKind.SERVER and s.name == server_name
    )
    # One trace from the caller through the gRPC hop to the generation thread's phases.
    assert _parent_id(client_span) == caller_id
    assert server_span.context is not None and server_span.context.trace_id == trace_id
    assert client_span.context is not None and _parent_id(server_span) == client_span.context.span_id
    assert server_span.parent is not None and server_span.parent.is_remote
    assert server_span.attributes is not None and server_span.attributes["vlmserve.request_id"] == "traced-1"
    for phase in PHASES:
        assert _parent_id(found[phase]) == server_span.context.span_id, phase
    queue, prefill, decode = found["engine.queue"], found["engine.prefill"], found["engine.decode"]
    assert queue.end_time is not None and prefill.start_time is not None
    assert prefill.end_time is not None and decode.start_time is not None
    assert queue.end_time <= prefill.start_time + 1_000_000  # perf_counter -> epoch conversion jitter
    assert prefill.end_time <= decode.start_time + 1_000_000
    assert decode.attributes is not None and decode.attributes["vlmserve.output_tokens"] >= 1


@pytest.mark.parametrize("method", ["generate", "generate_unary"])
def test_the_blocking_client_carries_the_callers_trace(
    idle_engine: InProcessEngine, spans: InMemorySpanExporter, method: str
) -> None:
    """`EngineClient` (scripts, threaded services) links the engine's spans to its caller's, as the
    asyncio client does."""
    server_name = "vlmserve.engine.v1.EngineService/" + (
        "Generate" if method == "generate" else "GenerateUnary"
    )
    tracer = trace.get_tracer("test")
    with (
        tracer.start_as_current_span("blocking caller") as caller,
        EngineClient(idle_engine.address) as client,
    ):
        if method == "generate":
            answers = list(client.generate(request(request_id=f"sync-{method}", max_tokens=2)))
            assert answers[-1].HasField("complete")
        else:
            client.generate_unary(request(request_id=f"sync-{method}", max_tokens=2))
    context = caller.get_span_context()
    found = _finished(spans, context.trace_id, {server_name, *PHASES})
    client_span = next(s for s in spans.get_finished_spans() if s.kind is trace.SpanKind.CLIENT)
    server_span = next(s for s in spans.get_finished_spans() if s.kind is trace.SpanKind.SERVER)
    assert _parent_id(client_span) == context.span_id
    assert client_span.context is not None and _parent_id(server_span) == client_span.context.span_id
    assert set(PHASES) <= found.keys()


def test_the_trace_id_crosses_in_grpc_metadata(
    idle_engine: InProcessEngine, spans: InMemorySpanExporter
) -> None:
    """A bare gRPC caller (no OpenTelemetry) that sends a W3C traceparent joins its trace."""
    trace_id = 0x0AF7651916CD43DD8448EB211C80319C
    parent_id = 0xB7AD6B7169203331
    traceparent = f"00-{trace_id:032x}-{parent_id:016x}-01"
    with grpc.insecure_channel(idle_engine.address) as channel:
        stub = pb_grpc.EngineServiceStub(channel)
        stub.GenerateUnary(
            pb.GenerateUnaryRequest(request=request(max_tokens=2)),
            metadata=(("traceparent", traceparent),),
            timeout=60,
        )
    found = _finished(spans, trace_id, {"vlmserve.engine.v1.EngineService/GenerateUnary", *PHASES})
    server_span = found["vlmserve.engine.v1.EngineService/GenerateUnary"]
    assert _parent_id(server_span) == parent_id
    assert set(PHASES) <= found.keys()


def test_without_a_traceparent_the_engine_starts_its_own_trace(
    idle_engine: InProcessEngine, spans: InMemorySpanExporter
) -> None:
    with grpc.insecure_channel(idle_engine.address) as channel:
        pb_grpc.EngineServiceStub(channel).GenerateUnary(
            pb.GenerateUnaryRequest(request=request(request_id="untraced", max_tokens=2)), timeout=60
        )
    idle_engine.report("untraced")
    server_span = next(
        s
        for s in spans.get_finished_spans()
        if s.attributes is not None and s.attributes.get("vlmserve.request_id") == "untraced"
    )
    assert server_span.parent is None


def test_one_trace_from_the_facade_request_to_the_engine_phases(
    idle_engine: InProcessEngine, spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    """A Responses request through the facade (in-process) to the real engine: one trace, linked."""
    trace_id = 0x4BF92F3577B34DA6A3CE929D0E0E4736
    traceparent = f"00-{trace_id:032x}-00f067aa0ba902b7-01"

    async def post() -> httpx.Response:
        client = AsyncEngineClient(idle_engine.address)
        store = Store.sqlite(tmp_path / "facade.sqlite3")
        app = create_app(FacadeSettings(store_path=tmp_path / "facade.sqlite3"), engine=client, store=store)
        try:
            async with in_process(app) as http:
                return await http.post(
                    "/v1/responses",
                    json={"model": "default", "input": "Hello", "max_output_tokens": 4},
                    headers={"traceparent": traceparent},
                )
        finally:
            await client.close()
            store.close()

    response = idle_engine.run(post())
    assert response.status_code == 200, response.text
    client_name = "vlmserve.engine.v1.EngineService/Generate"
    found = _finished(spans, trace_id, {"POST /v1/responses", *PHASES})
    http_span = found["POST /v1/responses"]
    assert _parent_id(http_span) == 0x00F067AA0BA902B7
    assert http_span.attributes is not None and http_span.attributes["http.response.status_code"] == 200
    calls = [
        s for s in spans.get_finished_spans() if s.name == client_name and s.context.trace_id == trace_id
    ]  # type: ignore[union-attr]
    client_span = next(s for s in calls if s.kind is trace.SpanKind.CLIENT)
    server_span = next(s for s in calls if s.kind is trace.SpanKind.SERVER)
    # FastAPI's own telemetry records the request span (and its endpoint/dependency spans in between).
    assert http_span.context is not None and _descends_from(spans, client_span, http_span.context.span_id)
    assert client_span.context is not None and _parent_id(server_span) == client_span.context.span_id
    assert server_span.context is not None
    for phase in PHASES:
        assert _parent_id(found[phase]) == server_span.context.span_id, phase


class _OtlpReceiver(ThreadingHTTPServer):
    """A loopback OTLP/HTTP traces endpoint keeping what it is sent."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append(ExportTraceServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()
                self.wfile.write(ExportTraceServiceResponse().SerializeToString())

            def log_message(self, format: str, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    def spans(self) -> list[tuple[str, str, bytes, bytes]]:
        """(service name, span name, trace id, parent span id) of every span received."""
        found = []
        for export in self.requests:
            for resource_spans in export.resource_spans:
                service = next(
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                )
                for scope_spans in resource_spans.scope_spans:
                    found += [(service, s.name, s.trace_id, s.parent_span_id) for s in scope_spans.spans]
        return found


@pytest.mark.slow
def test_the_engine_command_exports_spans_over_otlp(tmp_path: Path) -> None:
    receiver = _OtlpReceiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{receiver.server_address[1]}/v1/traces"
    engine = start_engine(tmp_path, extra=("--otlp-endpoint", endpoint))
    trace_id, parent_id = bytes(range(1, 17)), bytes(range(1, 9))
    try:
        with grpc.insecure_channel(engine.address) as channel:
            pb_grpc.EngineServiceStub(channel).GenerateUnary(
                pb.GenerateUnaryRequest(request=request(max_tokens=2)),
                metadata=(("traceparent", f"00-{trace_id.hex()}-{parent_id.hex()}-01"),),
                timeout=60,
            )
    finally:
        engine.stop()  # a clean exit flushes the batch span processor
        receiver.shutdown()
    received = receiver.spans()
    server = [s for s in received if s[1] == "vlmserve.engine.v1.EngineService/GenerateUnary"]
    assert server == [("vlmserve-engine", server[0][1], trace_id, parent_id)], received
    assert {name for _, name, tid, _ in received if tid == trace_id} >= set(PHASES)

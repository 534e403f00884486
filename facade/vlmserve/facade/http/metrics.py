"""Prometheus metrics of the facade (prometheus-client), served at `GET /metrics`.

HTTP requests are counted by an ASGI middleware under their route template (`/v1/responses/{response_id}`,
never the raw path, so ids cannot blow up the label set; unmatched paths are `unmatched`), their method
(a standard one, else `other`) and final status; responses by final
status, with their tokens, images and time to first output. Each app has its own registry (tests
build many apps in one process). `/metrics` sits behind the API keys like every other route but
`/healthz`: give Prometheus a key (`authorization` in its scrape config).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as ASGIMessage

from vlmserve.common.wire_encode import OutgoingRequest

__all__ = ["FacadeMetrics", "HttpMetrics", "metrics_endpoint"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class _RunningCollector(Collector):
    def __init__(self, running: Callable[[], int]) -> None:
        self._running = running

    def collect(self) -> Iterator[Any]:
        yield GaugeMetricFamily(
            "vlmserve_facade_running_responses", "responses being generated now", value=self._running()
        )


class FacadeMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.http_requests = Counter(
            "vlmserve_facade_http_requests",
            "HTTP requests by method, route template and status code",
            ["method", "route", "status"],
            registry=r,
        )
        self.http_duration = Histogram(
            "vlmserve_facade_http_request_duration_seconds",
            "HTTP request to the end of its answer (a stream's whole length)",
            ["method", "route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.responses = Counter(
            "vlmserve_facade_responses",
            "generated responses by final status (completed, incomplete, failed, cancelled)",
            ["status"],
            registry=r,
        )
        self.input_tokens = Counter("vlmserve_facade_input_tokens", "input tokens of responses", registry=r)
        self.output_tokens = Counter(
            "vlmserve_facade_output_tokens", "output tokens of responses", registry=r
        )
        self.images = Counter("vlmserve_facade_images", "images sent to the engine", registry=r)
        self.image_bytes = Counter(
            "vlmserve_facade_image_bytes", "encoded bytes of images sent to the engine", registry=r
        )
        self.time_to_first_output = Histogram(
            "vlmserve_facade_time_to_first_output_seconds",
            "engine call start to the first output (text or tool call) of a response",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

    def watch_running(self, running: Callable[[], int]) -> None:
        self.registry.register(_RunningCollector(running))

    def count_request(self, request: OutgoingRequest) -> None:
        images = list(request.images())
        self.images.inc(len(images))
        self.image_bytes.inc(sum(len(image.data) for image in images))


# Every label's values are bounded: the method comes from the client (h11 accepts any token),
# and 3,000 made-up methods once grew /metrics from 49 KB to 11.8 MB, for good.
_KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def bounded_method(method: str) -> str:
    """The method as a label: one of the standard ones, else "other"."""
    return method if method in _KNOWN_METHODS else "other"


class HttpMetrics:
    """ASGI middleware: count each HTTP request under its route template and final status."""

    def __init__(self, app: ASGIApp, metrics: FacadeMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # an exception before any answer reaches the server as a 500

        async def sending(message: ASGIMessage) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            # The router put the matched route in the scope; unmatched paths share one label.
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            method = bounded_method(scope["method"])
            self.metrics.http_requests.labels(method, route, str(status)).inc()
            self.metrics.http_duration.labels(method, route).observe(time.perf_counter() - started)


def metrics_endpoint(metrics: FacadeMetrics) -> Callable[[Request], Any]:
    async def serve_metrics(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return serve_metrics

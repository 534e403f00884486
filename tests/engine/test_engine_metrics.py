"""Prometheus metrics of the engine, scraped over HTTP from the real in-process engine: each
figure moves by what the requests did (tokens, images and bytes, cache hits, latencies)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from tests._prometheus import metric_samples, moved
from tests._services import free_port, start_engine
from vlmserve.engine.metrics import serve_metrics
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc

from .conftest import InProcessEngine
from .test_engine_grpc import image_part, png, text_part
from .test_prefix_cache import conversation, unary


@pytest.fixture(scope="module")
def metrics_url(engine: InProcessEngine) -> Iterator[str]:
    server, port = serve_metrics(engine.server.generator.metrics, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{port}/metrics"
    server.shutdown()
    server.server_close()


def scrape(url: str) -> dict[str, float]:
    """Every sample as 'name{label="value",...}' -> value."""
    response = httpx.get(url, timeout=10)
    assert response.status_code == 200
    return metric_samples(response.text)


def test_a_generation_moves_every_figure(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub, metrics_url: str
) -> None:
    image = png((64, 64), seed=71)
    request = pb.GenerateRequest(
        messages=[pb.Message(role=pb.ROLE_USER, parts=[image_part(image), text_part("Describe it.")])],
        sampling=pb.SamplingParams(max_tokens=5, temperature=0.0),
        partition_key="metrics-test",
    )
    before = scrape(metrics_url)
    first = unary(stub, request)
    again = unary(stub, request)  # the same image: a vision-cache hit
    after = scrape(metrics_url)

    assert moved(before, after, 'vlmserve_engine_requests_total{kind="generate",outcome="length"}') == 2
    assert moved(before, after, "vlmserve_engine_prompt_tokens_total") == (
        first.usage.input_tokens + again.usage.input_tokens
    )
    assert moved(before, after, "vlmserve_engine_output_tokens_total") == 10
    assert moved(before, after, "vlmserve_engine_images_total") == 2
    assert moved(before, after, "vlmserve_engine_image_bytes_total") == 2 * len(image)
    assert moved(before, after, "vlmserve_engine_vision_cache_misses_total") == 1
    assert moved(before, after, "vlmserve_engine_vision_cache_hits_total") == 1
    assert moved(before, after, "vlmserve_engine_time_to_first_token_seconds_count") == 2
    # 5 tokens each: 4 gaps between consecutive tokens per request.
    assert moved(before, after, "vlmserve_engine_inter_token_latency_seconds_count") == 8
    # One observation per decode step: up to 4 per request (fewer when drafts are accepted).
    assert 2 <= moved(before, after, "vlmserve_engine_decode_batch_size_count") <= 8
    assert moved(before, after, "vlmserve_engine_time_to_first_token_seconds_sum") > 0
    assert after["vlmserve_engine_queue_depth"] == 0
    assert after["vlmserve_engine_active_requests"] == 0


def test_prefix_cache_hits_are_counted(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub, metrics_url: str
) -> None:
    before = scrape(metrics_url)
    unary(stub, conversation("First question?", partition="metrics-prefix"))
    warm = unary(stub, conversation("First question?", "An answer.", "Next?", partition="metrics-prefix"))
    after = scrape(metrics_url)
    assert warm.usage.cached_tokens > 0
    assert moved(before, after, "vlmserve_engine_prefix_cache_lookups_total") == 2
    assert moved(before, after, "vlmserve_engine_prefix_cache_hits_total") == 1
    assert moved(before, after, "vlmserve_engine_cached_prompt_tokens_total") == warm.usage.cached_tokens


def test_prefixes_shared_in_flight_are_counted_apart_from_prefix_cache_hits(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub, metrics_url: str
) -> None:
    """A request that takes its prompt's start from another request still decoding counts those
    tokens as cached and as shared in flight, not as a prefix-cache hit (its hit rate would lie)."""
    before = scrape(metrics_url)
    running = conversation("A long first question about the shelves?", partition="metrics-shared")
    running.sampling.max_tokens = 400
    stream = stub.Generate(running, timeout=60)
    assert next(stream).HasField("chunk"), "it is decoding"
    newcomer = unary(stub, conversation("A long first question about the boxes?", partition="metrics-shared"))
    first = next(event.complete for event in stream if event.HasField("complete"))
    after = scrape(metrics_url)
    assert first.usage.output_tokens == 400, "it was still decoding when the newcomer finished"
    assert first.usage.cached_tokens == 0 and newcomer.usage.cached_tokens > 16
    assert moved(before, after, "vlmserve_engine_shared_prefix_tokens_total") == newcomer.usage.cached_tokens
    assert moved(before, after, "vlmserve_engine_cached_prompt_tokens_total") == newcomer.usage.cached_tokens
    assert moved(before, after, "vlmserve_engine_prefix_cache_lookups_total") == 2
    assert moved(before, after, "vlmserve_engine_prefix_cache_hits_total") == 0


def test_queue_depth_and_batch_size_under_load(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub, metrics_url: str
) -> None:
    """Two requests at once decode as one batch (the test engine holds two); a third waits."""
    before = scrape(metrics_url)
    seen_depths: list[float] = []
    done = threading.Event()

    registry = idle_engine.server.generator.metrics.registry

    def watch() -> None:
        # The registry read in-process (what /metrics serialises): an HTTP scrape per sample was
        # slower than both requests together on a loaded machine, and saw only the idle engine.
        while not done.is_set():
            seen_depths.append(registry.get_sample_value("vlmserve_engine_active_requests") or 0.0)
            done.wait(0.001)

    def ask(seed: int) -> None:
        request = pb.GenerateRequest(
            messages=[pb.Message(role=pb.ROLE_USER, parts=[text_part(f"Count to {seed}.")])],
            sampling=pb.SamplingParams(max_tokens=40, temperature=0.0),
        )
        unary(stub, request)

    watcher = threading.Thread(target=watch)
    watcher.start()
    askers = [threading.Thread(target=ask, args=(seed,)) for seed in (1, 2)]
    for thread in askers:
        thread.start()
    for thread in askers:
        thread.join(60)
    done.set()
    watcher.join(10)
    after = scrape(metrics_url)
    assert max(seen_depths) >= 1
    # Some decode step advanced both requests together.
    assert moved(before, after, 'vlmserve_engine_decode_batch_size_bucket{le="1.0"}') < moved(
        before, after, "vlmserve_engine_decode_batch_size_count"
    )


@pytest.mark.slow
@pytest.mark.needs_model
def test_the_engine_command_serves_metrics_on_its_own_port(tmp_path: Path) -> None:
    port = free_port()
    engine = start_engine(tmp_path, extra=("--metrics-port", str(port)))
    try:
        with grpc.insecure_channel(engine.address) as channel:
            stub = pb_grpc.EngineServiceStub(channel)
            before = scrape(f"http://127.0.0.1:{port}/metrics")
            request = pb.GenerateRequest(
                messages=[pb.Message(role=pb.ROLE_USER, parts=[text_part("Hello?")])],
                sampling=pb.SamplingParams(max_tokens=3, temperature=0.0),
            )
            unary(stub, request)
            after = scrape(f"http://127.0.0.1:{port}/metrics")
        assert moved(before, after, "vlmserve_engine_output_tokens_total") == 3
    finally:
        engine.stop()

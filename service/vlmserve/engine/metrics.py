"""Prometheus metrics of one engine (prometheus-client), served on their own HTTP port.

Events are counted where they happen (the generation thread retires a job, runs a decode step);
state that already exists elsewhere (queue depth, requests in flight, the vision cache's own
counters) is read at scrape time by a collector, so there is no second copy of it to keep right.
Each engine has its own registry: several engines in one process (tests) never share numbers.

The HTTP endpoint is off unless `--metrics-port` is set: the engine's one mandatory port is gRPC,
and an extra listener should be asked for (see docs/observability.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["EngineMetrics", "EngineState", "MediaMetrics", "serve_metrics"]

log = logging.getLogger(__name__)

# Seconds a model load may take: a tiny fixture on CPU to a large checkpoint off a slow disk.
_LOAD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# Seconds; from a few ms (a cached prompt on a GPU) to minutes (a long prompt on CPU).
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True, slots=True)
class EngineState:
    """What the collector reads at scrape time (any thread; plain ints)."""

    queued: int
    active: int
    vision_cache_hits: int
    vision_cache_encoded: int
    prefix_cache_hits: dict[str, int]  # by tier: memory, disk
    prefix_cache_bytes: dict[str, int]  # by tier
    memory_reserved: int = 0  # estimates of the requests in flight (memory_budget.py)
    memory_budget: int = 0
    memory_refused: int = 0
    # The prefix cache's disk tier (loop/prefix_disk.py): None when there is none.
    prefix_disk_enabled: bool | None = None
    prefix_disk_pending_bytes: int = 0


class _StateCollector(Collector):
    def __init__(self, read: Callable[[], EngineState]) -> None:
        self._read = read

    def collect(self) -> Iterator[Any]:
        state = self._read()
        yield GaugeMetricFamily(
            "vlmserve_engine_queue_depth",
            "requests admitted or being prepared, waiting for a generation slot",
            value=state.queued,
        )
        yield GaugeMetricFamily(
            "vlmserve_engine_active_requests",
            "requests holding a generation slot (preparing, prefilling or decoding)",
            value=state.active,
        )
        yield CounterMetricFamily(
            "vlmserve_engine_vision_cache_hits",
            "images whose features came from the vision-feature cache",
            value=state.vision_cache_hits,
        )
        yield CounterMetricFamily(
            "vlmserve_engine_vision_cache_misses",
            "images run through the vision tower (not in the vision-feature cache)",
            value=state.vision_cache_encoded,
        )
        yield GaugeMetricFamily(
            "vlmserve_engine_memory_reserved_bytes",
            "memory estimates (KV for prompt + max tokens, images) of the requests in flight",
            value=state.memory_reserved,
        )
        yield GaugeMetricFamily(
            "vlmserve_engine_memory_budget_bytes",
            "the budget those estimates are kept under (--memory-budget-mib)",
            value=state.memory_budget,
        )
        yield CounterMetricFamily(
            "vlmserve_engine_memory_refused_requests",
            "requests refused at admission because their estimate exceeds the whole memory budget",
            value=state.memory_refused,
        )
        hits = CounterMetricFamily(
            "vlmserve_engine_prefix_cache_tier_hits",
            "prefix-cache hits by the tier the entry came from (memory, or disk: loaded back)",
            labels=["tier"],
        )
        for tier, count in sorted(state.prefix_cache_hits.items()):
            hits.add_metric([tier], count)
        yield hits
        stored = GaugeMetricFamily(
            "vlmserve_engine_prefix_cache_bytes", "bytes of prefix-cache entries by tier", labels=["tier"]
        )
        for tier, count in sorted(state.prefix_cache_bytes.items()):
            stored.add_metric([tier], count)
        yield stored
        if state.prefix_disk_enabled is not None:
            yield GaugeMetricFamily(
                "vlmserve_engine_prefix_cache_disk_enabled",
                "1 while the prefix cache's disk tier is on; 0 once a write or folder error (a full disk) "
                "turned it off (memory only until the engine restarts)",
                value=int(state.prefix_disk_enabled),
            )
            yield GaugeMetricFamily(
                "vlmserve_engine_prefix_cache_disk_pending_bytes",
                "bytes of evicted prefix-cache entries held in memory until the disk tier's writer is done",
                value=state.prefix_disk_pending_bytes,
            )


class MediaMetrics:
    """Video and audio clips (engine/media/): what was decoded, and what was refused and why."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.clips = Counter(
            "vlmserve_engine_media_clips",
            "clips decoded, by kind (video, audio)",
            ["kind"],
            registry=registry,
        )
        self.frames = Counter(
            "vlmserve_engine_video_frames",
            "video frames decoded (the sampled frames handed on)",
            registry=registry,
        )
        self.audio_seconds = Counter(
            "vlmserve_engine_audio_seconds", "seconds of audio decoded", registry=registry
        )
        self.refused = Counter(
            "vlmserve_engine_media_refused_clips",
            "clips refused, by kind and reason (the limit broken: bytes, duration, source_pixels, frames, "
            "pixels, sample_rate, channels, timeout, memory; or damaged, media_type, image, sampling, empty, "
            "file_id)",
            ["kind", "reason"],
            registry=registry,
        )


class EngineMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "vlmserve_engine_requests",
            "finished engine jobs by kind (generate, count_tokens) and outcome (finish reason, or error)",
            ["kind", "outcome"],
            registry=r,
        )
        self.refused = Counter(
            "vlmserve_engine_refused_requests",
            "requests refused at admission because the queue was full",
            registry=r,
        )
        self.prompt_tokens = Counter(
            "vlmserve_engine_prompt_tokens", "prompt tokens of generate requests", registry=r
        )
        self.cached_tokens = Counter(
            "vlmserve_engine_cached_prompt_tokens",
            "prompt tokens not prefilled: taken from the prefix cache or from another request in flight",
            registry=r,
        )
        self.shared_prefix_tokens = Counter(
            "vlmserve_engine_shared_prefix_tokens",
            "prompt tokens taken from another request in flight (part of cached_prompt_tokens)",
            registry=r,
        )
        self.output_tokens = Counter("vlmserve_engine_output_tokens", "generated tokens", registry=r)
        self.prefix_lookups = Counter(
            "vlmserve_engine_prefix_cache_lookups",
            "generate requests that looked up the prefix cache (it is enabled for this model)",
            registry=r,
        )
        self.prefix_hits = Counter(
            "vlmserve_engine_prefix_cache_hits",
            "generate requests that reused a cached prefix",
            registry=r,
        )
        self.prefix_disk_errors = Counter(
            "vlmserve_engine_prefix_cache_disk_errors",
            "disk-tier files skipped as corrupt, truncated or foreign (rejected), or the tier turned off "
            "after a write or folder error such as a full disk (disabled)",
            ["kind"],
            registry=r,
        )
        # Speculative decoding (speculation/): accepted tokens per verify = accepted / drafting rows + 1.
        self.speculative_drafted = Counter(
            "vlmserve_engine_speculative_drafted_tokens",
            "draft tokens verified, by source (grammar fast-forward, prompt lookup, the draft model)",
            ["source"],
            registry=r,
        )
        self.speculative_accepted = Counter(
            "vlmserve_engine_speculative_accepted_tokens",
            "draft tokens the target model accepted (each saved a forward), by source",
            ["source"],
            registry=r,
        )
        self.speculative_rows = Counter(
            "vlmserve_engine_speculative_verified_rows",
            "rows that had drafts verified in a forward (each took its accepted drafts and one more token), "
            "by source",
            ["source"],
            registry=r,
        )
        self.decode_forwards = Counter(
            "vlmserve_engine_decode_forwards",
            "batched decode forwards while speculation is on (output tokens / forwards: tokens per forward)",
            ["kind"],
            registry=r,
        )
        self.images = Counter("vlmserve_engine_images", "images in generate requests", registry=r)
        self.image_bytes = Counter(
            "vlmserve_engine_image_bytes", "encoded bytes of images in generate requests", registry=r
        )
        self.media = MediaMetrics(r)
        self.time_to_first_token = Histogram(
            "vlmserve_engine_time_to_first_token_seconds",
            "admission to first generated token (queue, preparation wait and prefill)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inter_token = Histogram(
            "vlmserve_engine_inter_token_latency_seconds",
            "time between consecutive generated tokens of one request",
            buckets=_TOKEN_GAP_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "vlmserve_engine_decode_batch_size",
            "requests advanced by one batched decode step",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )

        # The model lifecycle (model_lifecycle.py): --load lazy and --idle-unload-seconds.
        self.model_loads = Counter(
            "vlmserve_engine_model_loads",
            "times the model's weights were read into memory (at start, or by a request after an unload)",
            registry=r,
        )
        self.model_unloads = Counter(
            "vlmserve_engine_model_unloads",
            "times the model's weights and caches were freed after idling (--idle-unload-seconds)",
            registry=r,
        )
        self.model_load_seconds = Histogram(
            "vlmserve_engine_model_load_seconds",
            "time to read the model's weights into memory (requests waiting meanwhile)",
            buckets=_LOAD_BUCKETS,
            registry=r,
        )
        self._weights_loaded = Gauge(
            "vlmserve_engine_weights_loaded",
            "1 while the model's weights are in memory, 0 while they are not (lazy start, idle unload)",
            registry=r,
        )

    def watch_weights(self, loaded: Callable[[], bool]) -> None:
        """Report whether the weights are in memory (read at each scrape)."""
        self._weights_loaded.set_function(lambda: 1.0 if loaded() else 0.0)

    def watch(self, read: Callable[[], EngineState]) -> None:
        """Report the engine's live state (read at each scrape)."""
        self.registry.register(_StateCollector(read))


def serve_metrics(metrics: EngineMetrics, host: str, port: int) -> tuple[Any, int]:
    """Serve /metrics over HTTP in a daemon thread; returns the server and the bound port."""
    server, _thread = start_http_server(port, addr=host, registry=metrics.registry)
    bound = int(server.server_address[1])
    log.info("metrics on http://%s:%d/metrics", host, bound)
    return server, bound

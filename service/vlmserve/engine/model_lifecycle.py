"""The model's weights over the engine's life: loaded at start (`--load eager`) or by the first
request (`--load lazy`), freed after `--idle-unload-seconds` without work, loaded again by the
next request.

What request preparation needs (tokenizer, processor, chat template, grammar tokenizer, model
info) is loaded at start and stays: only the weights, and the caches computed with them, come
and go. In MLX terms the unloaded model is a *lazy* one: mlx-vlm's loader with `lazy=True` builds
the module tree over arrays not yet read from the safetensors files (a few KB), and evaluating
its parameters reads the weights. Unloading puts a fresh lazy model in place of the evaluated
one (whose arrays are then unreferenced and freed) and returns MLX's buffer cache to the system.

The generation thread calls everything here (MLX state is thread-local); `state` and
`loaded_at` are plain values that GetModelInfo and the metrics read from other threads.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vlmserve.engine.metrics import EngineMetrics
from vlmserve.engine.model import LoadedModel
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = ["LoadWhen", "MemoryUse", "ModelLifecycle", "memory_use"]

log = logging.getLogger(__name__)

# --load choices.
LoadWhen = Literal["eager", "lazy"]


@dataclass(frozen=True, slots=True)
class MemoryUse:
    """The process's resident memory and what MLX's allocator holds (arrays; its buffer cache)."""

    rss_bytes: int
    mlx_active_bytes: int
    mlx_cache_bytes: int

    def describe(self) -> str:
        mib = 1 << 20
        return (
            f"RSS {self.rss_bytes / mib:.1f} MiB, MLX active {self.mlx_active_bytes / mib:.1f} MiB,"
            f" MLX cache {self.mlx_cache_bytes / mib:.1f} MiB"
        )


def memory_use() -> MemoryUse:
    import mlx.core as mx

    return MemoryUse(_rss_bytes(), int(mx.get_active_memory()), int(mx.get_cache_memory()))


def _rss_bytes() -> int:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):  # not Linux: the peak, in bytes on macOS
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    import os

    return pages * os.sysconf("SC_PAGE_SIZE")


class ModelLifecycle:
    """Whether the weights are in memory, and the moves between in and out.

    `open_model(lazy)` loads the model (its weights evaluated, or lazy); `fresh_weights()` makes a
    new lazy model object of the same weights (what unloading puts in place); `drop_caches` empties
    what was computed with the weights (prefix KV, vision features).
    """

    def __init__(
        self,
        *,
        open_model: Callable[[bool], LoadedModel],
        fresh_weights: Callable[[], object],
        drop_caches: Callable[[], None],
        metrics: EngineMetrics,
        lazy: bool = False,
        idle_unload_s: float | None = None,
    ) -> None:
        self._open_model = open_model
        self._fresh_weights = fresh_weights
        self._drop_caches = drop_caches
        self._metrics = metrics
        self.lazy = lazy
        self.idle_unload_s = idle_unload_s
        self._lock = threading.Lock()
        self._state = pb.WEIGHTS_STATE_UNLOADED
        self._loaded_at = 0.0
        self._last_work = time.monotonic()
        self.loads = 0
        self.unloads = 0
        # After the last unload (tests, docs/deployment.md's figures).
        self.last_unload: tuple[MemoryUse, MemoryUse] | None = None
        metrics.watch_weights(lambda: self.state == pb.WEIGHTS_STATE_LOADED)

    @property
    def state(self) -> pb.WeightsState.ValueType:
        with self._lock:
            return self._state

    @property
    def loaded_at(self) -> float:
        """Unix seconds when the weights were last loaded; 0 while they are not in memory."""
        with self._lock:
            return self._loaded_at if self._state == pb.WEIGHTS_STATE_LOADED else 0.0

    @property
    def resident(self) -> bool:
        return self.state == pb.WEIGHTS_STATE_LOADED

    def _set(self, state: pb.WeightsState.ValueType) -> None:
        with self._lock:
            self._state = state
            if state == pb.WEIGHTS_STATE_LOADED:
                self._loaded_at = time.time()

    def open(self) -> LoadedModel:
        """At start: the model, with its weights read unless `--load lazy`."""
        started = time.perf_counter()
        loaded = self._open_model(self.lazy)
        if self.lazy:
            log.info("weights not loaded (--load lazy): the first request loads them")
        else:
            self._loaded(started)
        self.worked()
        return loaded

    def ensure_resident(self, loaded: LoadedModel) -> bool:
        """Read the weights if they are not in memory (the requests in the queue wait meanwhile);
        True when this call loaded them (the caller rebuilds what holds the old model)."""
        if self.resident:
            return False
        import mlx.core as mx

        self._set(pb.WEIGHTS_STATE_LOADING)
        log.info("loading weights of %s", loaded.info.model_id)
        started = time.perf_counter()
        try:
            mx.eval(loaded.model.parameters())
        except BaseException:
            # Still lazy: the next request tries again.
            self._set(pb.WEIGHTS_STATE_UNLOADED)
            raise
        self._loaded(started)
        return True

    def _loaded(self, started: float) -> None:
        seconds = time.perf_counter() - started
        self._set(pb.WEIGHTS_STATE_LOADED)
        self.loads += 1
        self._metrics.model_loads.inc()
        self._metrics.model_load_seconds.observe(seconds)
        log.info("weights loaded in %.2fs (%s)", seconds, memory_use().describe())

    def worked(self) -> None:
        """Note activity now (a job admitted, a step run): the idle clock starts again."""
        self._last_work = time.monotonic()

    def idle_wait(self) -> float | None:
        """How long an idle generation thread may block before the weights are due to go
        (None: never; they are not in memory or no unload is configured)."""
        if self.idle_unload_s is None or not self.resident:
            return None
        return max(0.0, self._last_work + self.idle_unload_s - time.monotonic())

    def unload_due(self) -> bool:
        """Whether the weights are in memory and have been idle for `idle_unload_s`."""
        wait = self.idle_wait()
        return wait is not None and wait <= 0

    def unload(self, loaded: LoadedModel) -> None:
        """Free the weights and what was computed with them. Nothing may be in flight, and the
        caller holds nothing that holds the model (a decode batch holds its language model)."""
        import mlx.core as mx

        before = memory_use()
        started = time.perf_counter()
        self._drop_caches()
        loaded.model = self._fresh_weights()
        gc.collect()
        mx.clear_cache()
        after = memory_use()
        self._set(pb.WEIGHTS_STATE_UNLOADED)
        self.unloads += 1
        self.last_unload = (before, after)
        self._metrics.model_unloads.inc()
        log.info(
            "weights unloaded after %.0fs idle, in %.2fs: %s -> %s",
            self.idle_unload_s or 0,
            time.perf_counter() - started,
            before.describe(),
            after.describe(),
        )

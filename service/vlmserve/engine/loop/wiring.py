"""The engine's parts for one loaded model, built in one place (`build_parts`, generation thread).

From the settings: the model's lifecycle (how it is read, when its weights go). From the
settings and the loaded model: the KV layout (`--kv-bits`), the drafter model
(`--draft-model`), admission's memory budget, the prefix cache and its disk tier, the vision
cache, the request preparer (and, for a model that takes clips, the clip decoding workers,
started now so the first clip does not wait for them), and the step runner's factory with
speculative decoding's verifier per decode batch. generator.py only runs them; what they decide
is theirs.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlmserve.engine.config import EngineConfig
from vlmserve.engine.kv.layout import KVLayout, layout_for, new_prompt_cache
from vlmserve.engine.kv.sizing import bytes_per_token, kv_shape
from vlmserve.engine.loop.decode import ActiveGeneration
from vlmserve.engine.loop.memory_budget import MemoryBudget, default_budget_bytes, device_memory_bytes
from vlmserve.engine.loop.prefix_cache import PrefixCache
from vlmserve.engine.loop.prefix_disk import PrefixDiskTier, disk_namespace
from vlmserve.engine.loop.runner import StepRunner
from vlmserve.engine.loop.verifier import Verifier
from vlmserve.engine.loop.vision_cache import VisionFeatureCache
from vlmserve.engine.loop.vision_disk import VisionDiskTier
from vlmserve.engine.loop.vision_memory import vision_cost, vision_width
from vlmserve.engine.media import start_decoders
from vlmserve.engine.metrics import EngineMetrics
from vlmserve.engine.model import LoadedModel, fresh_weights, load_model
from vlmserve.engine.model_lifecycle import ModelLifecycle
from vlmserve.engine.prep.preparer import RequestPreparer
from vlmserve.engine.speculation.drafter import Speculator
from vlmserve.engine.speculation.model_drafter import AnyDrafter, load_model_drafter

__all__ = ["EngineParts", "build_parts", "model_lifecycle", "persist_caches", "persist_prefix_cache"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class EngineParts:
    """What serves requests on one loaded model (the generation thread's, but the preparer,
    which the preparation workers use)."""

    loaded: LoadedModel
    memory: MemoryBudget
    prefix_cache: PrefixCache
    vision_cache: VisionFeatureCache
    preparer: RequestPreparer
    # A step runner on these parts (serving, and the warm-up's own).
    new_runner: Callable[[], StepRunner]

    def drop_caches(self) -> None:
        """What was computed with the weights goes with them (a disk tier keeps its entries)."""
        self.prefix_cache.release_memory()
        self.vision_cache.clear()


def build_parts(config: EngineConfig, loaded: LoadedModel, metrics: EngineMetrics) -> EngineParts:
    """The parts for `loaded` (its KV layout is set here); a drafter model that cannot serve it
    fails the build, with why."""
    loaded.kv_layout = _kv_layout(config, loaded)
    drafter = _model_drafter(config, loaded)
    prefix_cache = PrefixCache(
        min_tokens=config.prefix_cache_min_tokens,
        max_bytes=config.prefix_cache_mib << 20,
        disk=_prefix_disk_tier(config, loaded, lambda kind: metrics.prefix_disk_errors.labels(kind).inc()),
        layout=loaded.kv_layout,
        new_cache=lambda: new_prompt_cache(loaded.model.language_model, loaded.kv_layout),
    )
    vision_cache = VisionFeatureCache(
        config.vision_cache_mib << 20,
        namespace=loaded.info.cache_namespace,
        disk=_vision_disk_tier(config, loaded, lambda kind: metrics.prefix_disk_errors.labels(kind).inc()),
    )
    preparer = RequestPreparer(
        loaded,
        max_request_pixels=config.max_request_pixels,
        decode_slots=config.image_decode_slots,
        media_limits=config.media_limits,
    )
    if preparer.takes_clips:  # an image-only model spends no memory on decoding workers
        start_decoders(config.media_limits)

    def new_verifier(language_model: Any) -> Verifier[ActiveGeneration] | None:
        return _verifier(config, loaded, drafter, language_model)

    def new_runner() -> StepRunner:
        return StepRunner(
            loaded,
            step_tokens=config.step_tokens,
            prefill_chunk_tokens=config.prefill_chunk_tokens,
            shared_prefix_min_tokens=config.shared_prefix_min_tokens,
            group_prefill=_plain_kv_layers(loaded),
            prefix_cache=prefix_cache,
            vision_cache=vision_cache,
            new_verifier=new_verifier,
        )

    return EngineParts(
        loaded, _memory_budget(config, loaded), prefix_cache, vision_cache, preparer, new_runner
    )


def model_lifecycle(
    config: EngineConfig, metrics: EngineMetrics, *, drop_caches: Callable[[], None]
) -> ModelLifecycle:
    """Whether the weights are in memory (`--load lazy`, `--idle-unload-seconds`), and how they
    are read: the model and its weights from `config.model`."""

    def open_model(lazy: bool) -> LoadedModel:
        return load_model(
            config.model,
            trust_remote_code=config.trust_remote_code,
            dtype=config.dtype,
            max_output_tokens=config.max_output_tokens,
            image_limits=config.image_limits,
            max_images_per_request=config.max_images_per_request,
            distributed=config.distributed,
            lazy=lazy,
        )

    return ModelLifecycle(
        open_model=open_model,
        fresh_weights=functools.partial(
            fresh_weights, config.model, trust_remote_code=config.trust_remote_code, dtype=config.dtype
        ),
        drop_caches=drop_caches,
        metrics=metrics,
        lazy=config.load == "lazy",
        idle_unload_s=config.idle_unload_seconds,
    )


def _plain_kv_layers(loaded: LoadedModel) -> bool:
    """Whether every layer keeps a plain KV cache, the only kind the prefix cache can cut and
    share (a sliding-window or recurrent layer's state is not a prefix of token positions)."""
    from mlx_vlm.models.cache import KVCache, make_prompt_cache

    return all(type(layer) is KVCache for layer in make_prompt_cache(loaded.model.language_model))


def _kv_layout(config: EngineConfig, loaded: LoadedModel) -> KVLayout:
    bits = config.kv_bits
    if bits is None:
        return KVLayout()
    if not _plain_kv_layers(loaded):
        log.warning(
            "--kv-bits %d ignored: this model's cache layers (sliding-window, chunked or recurrent) are "
            "not plain KV layers mlx-vlm can quantize; its KV stays at full precision",
            bits,
        )
        return KVLayout()
    language_model = loaded.model.language_model
    try:
        layout = layout_for(bits, config.kv_group_size, kv_shape(language_model)[1], config.kv_quant_scheme)
    except ValueError as error:  # MLX quantizes groups of 32, 64 or 128 values only
        log.warning("--kv-bits %d ignored: %s; its KV stays at full precision", bits, error)
        return KVLayout()
    log.info("KV cache: %s", layout.describe)
    return layout


def _memory_budget(config: EngineConfig, loaded: LoadedModel) -> MemoryBudget:
    from mlx.utils import tree_flatten

    parameters: list[Any] = list(tree_flatten(loaded.model.parameters()))
    model_bytes = sum(int(value.nbytes) for _, value in parameters)
    dtype_bytes = int(parameters[0][1].itemsize) if parameters else 4
    if config.memory_budget_mib > 0:
        budget = config.memory_budget_mib << 20
    else:
        budget = default_budget_bytes(device_memory_bytes(), model_bytes)
    per_token = bytes_per_token(loaded.model.language_model, loaded.kv_layout, dtype_bytes)
    hidden, vision_dtype_bytes = vision_width(loaded.model)
    vision = vision_cost(str(loaded.model.config.model_type), hidden, vision_dtype_bytes) if hidden else None
    image_token = getattr(loaded.model.config, "image_token_id", None)
    if not isinstance(image_token, int):
        image_token = getattr(loaded.model.config, "image_token_index", None)
    log.info(
        "memory budget for requests in flight: %.0f MiB (KV %d bytes per token; vision transient %s)",
        budget / (1 << 20),
        per_token,
        f"{vision.transient([1000]) / (1 << 20):.1f} MiB per 1,000-token image" if vision else "not counted",
    )
    return MemoryBudget(
        budget_bytes=budget,
        kv_bytes_per_token=per_token,
        vision=vision,
        image_token_id=image_token if isinstance(image_token, int) else None,
    )


def _prefix_disk_tier(
    config: EngineConfig, loaded: LoadedModel, on_error: Callable[[str], None]
) -> PrefixDiskTier | None:
    if config.prefix_cache_dir is None:
        return None
    return PrefixDiskTier(
        Path(config.prefix_cache_dir),
        namespace=disk_namespace(config.model, loaded),
        max_bytes=config.prefix_cache_disk_mib << 20,
        on_error=on_error,
    )


def _vision_disk_tier(
    config: EngineConfig, loaded: LoadedModel, on_error: Callable[[str], None]
) -> VisionDiskTier | None:
    """Vision features on disk beside the prefix cache's entries (`--prefix-cache-dir`), in a
    folder of their own, bounded by the same `--prefix-cache-disk-mib`."""
    if config.prefix_cache_dir is None or config.vision_cache_mib <= 0:
        return None
    return VisionDiskTier(
        Path(config.prefix_cache_dir),
        namespace=disk_namespace(config.model, loaded),
        max_bytes=config.prefix_cache_disk_mib << 20,
        on_error=on_error,
    )


def _model_drafter(config: EngineConfig, loaded: LoadedModel) -> AnyDrafter | None:
    """`--draft-model` for this load of the model (bound to its weights)."""
    if config.draft_model is None or config.speculative in ("off", "lookup"):
        return None
    return load_model_drafter(config.draft_model, loaded.model)


def _verifier(
    config: EngineConfig, loaded: LoadedModel, drafter: AnyDrafter | None, language_model: Any
) -> Verifier[ActiveGeneration] | None:
    """Speculative decoding for a decode batch, unless it is off (or the ranks of a distributed
    model would have to agree on every row's drafts: not built)."""
    if config.speculative == "off" or config.distributed != "off":
        return None
    if drafter is not None:
        drafter.bind(loaded.model)  # the weights may have been read again since (a no-op if not)
    speculator = Speculator(
        max_draft=config.speculative_max_draft,
        position_cost=config.speculative_position_cost,
        lookup=config.speculative != "draft",
        model_drafter=drafter if config.speculative != "lookup" else None,
    )
    return Verifier(language_model, speculator)


def persist_caches(parts: EngineParts) -> None:
    """At shutdown: the prefix cache's entries and the vision features still queued, to disk."""
    persist_prefix_cache(parts.prefix_cache)
    if parts.vision_cache.disk is not None:
        try:
            parts.vision_cache.disk.close()
        except Exception:  # stopping anyway: a failed write only loses those features
            log.warning("vision features not written at shutdown", exc_info=True)


def persist_prefix_cache(cache: PrefixCache) -> None:
    """At shutdown: the prefix cache's entries to its disk tier (a restart finds them)."""
    if cache.disk is None:
        return
    started = time.perf_counter()
    try:
        cache.persist()
    except Exception:  # the engine is stopping anyway: a failed write only loses the cache
        log.warning("prefix cache not written at shutdown", exc_info=True)
        return
    log.info(
        "prefix cache written: %d entries, %.1f MiB on disk, in %.2fs",
        len(cache.disk),
        cache.disk.bytes / (1 << 20),
        time.perf_counter() - started,
    )

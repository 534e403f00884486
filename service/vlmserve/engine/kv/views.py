"""A request's KV as views of other arrays (a batch row, a prefix of a cache), and own copies.

MLX arrays are immutable: a view shares the source's arrays, and a cache made of views grows
into buffers of its own, so the source is never written through it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from vlmserve.engine.kv.layout import CacheLayer, KVLayout, KVPart, PromptCache
from vlmserve.engine.kv.turboquant import turboquant_module

if TYPE_CHECKING:
    import mlx.core as mx

__all__ = ["is_plain", "layer_arrays", "map_parts", "own_copy", "row_views", "views"]


def map_parts(part: KVPart, fn: Callable[[mx.array], mx.array]) -> KVPart:
    """`fn` over one layer's keys (or values): one array, or each array of a quantized tuple,
    keeping the tuple's type (turboquant's state is a NamedTuple its attention dispatches on)."""
    if isinstance(part, tuple):
        mapped = [fn(p) for p in part]
        return type(part)(*mapped) if hasattr(part, "_fields") else tuple(mapped)
    return fn(part)


def _slice(part: KVPart, rows: slice, start: int, stop: int) -> KVPart:
    # The token axis is 2 in every array of every layout (turboquant's norms are 3-D).
    return map_parts(part, lambda p: p[rows, :, start:stop])


def row_views(
    batch_caches: Sequence[CacheLayer], index: int, pad: int, tokens: int
) -> list[tuple[KVPart, KVPart]]:
    """The first `tokens` positions of batch row `index` (after its `pad` left padding), per
    layer (keys, values), as lazy views."""
    rows = slice(index, index + 1)
    return [
        (_slice(layer.keys, rows, pad, pad + tokens), _slice(layer.values, rows, pad, pad + tokens))
        for layer in batch_caches
    ]


def views(layers: Sequence[tuple[KVPart, KVPart]], tokens: int, layout: KVLayout) -> PromptCache:
    """A one-row prompt cache holding the first `tokens` positions of `layers`' (keys, values),
    sharing their arrays: MLX arrays are immutable, and the new cache grows into buffers of its
    own, so the source is never written through it."""
    from mlx_vlm.models.cache import KVCache, QuantizedKVCache

    cache: PromptCache = []
    for keys, values in layers:
        layer: CacheLayer
        if layout.turbo:
            layer = _turbo_layer(keys, values, tokens, layout)
            cache.append(layer)
            continue
        if isinstance(keys, tuple):
            layer = QuantizedKVCache(group_size=layout.group_size, bits=layout.bits or 8)
        else:
            layer = KVCache()  # type: ignore[no-untyped-call]
        everything = slice(None)
        layer.keys = _slice(keys, everything, 0, tokens)
        layer.values = _slice(values, everything, 0, tokens)
        layer.offset = tokens
        cache.append(layer)
    return cache


def _turbo_layer(keys: KVPart, values: KVPart, tokens: int, layout: KVLayout) -> CacheLayer:
    """A one-row turboquant layer over stored state (a NamedTuple, or the plain tuple the disk
    tier gives back); its codecs are rebuilt on the first update, identical (same seed)."""
    tq = turboquant_module()
    layer = tq.TurboQuantKVCache(bits=layout.bits or 4)
    everything = slice(None)
    layer.keys = tq.TurboQuantMSEState(*_slice(tuple(keys), everything, 0, tokens))
    layer.values = tq.TurboQuantMSEState(*_slice(tuple(values), everything, 0, tokens))
    layer.offset = tokens
    return layer


def is_plain(layer: CacheLayer) -> bool:
    """A layer whose keys and values are exactly its positions so far (full or quantized), so
    any prefix of them is the cache of a prefix of the prompt."""
    from mlx_vlm.models.cache import KVCache, QuantizedKVCache
    from mlx_vlm.turboquant import TurboQuantKVCache

    # Any other cache class (it has update_and_fetch) keeps a state that is not a prefix of
    # positions; bare (keys, values) holders are plain.
    return type(layer) in (KVCache, QuantizedKVCache, TurboQuantKVCache) or not hasattr(
        layer, "update_and_fetch"
    )


def layer_arrays(layer: CacheLayer, tokens: int) -> tuple[KVPart, KVPart] | None:
    """A one-row cache layer's (keys, values) for its first `tokens` positions; None when the
    layer is not the plain (or quantized) per-layer KV this module knows."""
    if not is_plain(layer):
        return None
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    if keys is None or values is None or getattr(layer, "offset", -1) < tokens:
        return None
    everything = slice(None)
    return _slice(keys, everything, 0, tokens), _slice(values, everything, 0, tokens)


def own_copy(cache: PromptCache, tokens: int) -> None:
    """Make each layer's keys and values its own evaluated arrays of exactly `tokens` positions.

    A row extracted from the batch is a lazy slice of the batch's KV arrays, and a row's own
    cache a view of buffers allocated in steps: kept as they are, they keep those whole arrays
    (every row of the batch, every allocated position) alive for as long as the entry lives."""
    import mlx.core as mx

    arrays: list[mx.array] = []
    for layer in cache:
        pair = layer_arrays(layer, tokens)
        if pair is None:
            continue  # not a plain KV layer: copied whole (kv/snapshots.py), or refused
        copied = [map_parts(part, mx.contiguous) for part in pair]
        layer.keys, layer.values = copied
        if hasattr(layer, "_cached_state"):  # turboquant caches its sliced state by offset
            layer._cached_state, layer._cached_state_offset = None, -1
        for part in copied:
            arrays += list(part) if isinstance(part, tuple) else [part]
    mx.eval(arrays)

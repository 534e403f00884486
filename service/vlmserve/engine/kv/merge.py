"""One layer's batch cache from several requests' one-row caches: mlx-vlm's full-precision
`KVCache.merge`, and ours for its quantized layers (uniform and turboquant), which have none."""

from __future__ import annotations

from collections.abc import Sequence

from vlmserve.engine.kv.layout import CacheLayer, KVPart
from vlmserve.engine.kv.turboquant import turbo_batch_class, turboquant_module

__all__ = ["merge_rows", "mergeable"]


def mergeable(layer: CacheLayer) -> bool:
    """Whether a one-row cache layer can join a batch cache (mlx-vlm's `merge`, or ours)."""
    from mlx_vlm.models.cache import QuantizedKVCache
    from mlx_vlm.turboquant import TurboQuantKVCache

    return isinstance(layer, QuantizedKVCache | TurboQuantKVCache) or callable(
        getattr(type(layer), "merge", None)
    )


def merge_rows(rows: Sequence[CacheLayer]) -> CacheLayer:
    """One layer's batch cache from several requests' one-row caches (left-padded to one length)."""
    from mlx_vlm.models.cache import QuantizedKVCache
    from mlx_vlm.turboquant import TurboQuantKVCache

    if isinstance(rows[0], TurboQuantKVCache):
        return _merge_turbo(rows)
    if not isinstance(rows[0], QuantizedKVCache):
        return type(rows[0]).merge(list(rows))
    return _merge_quantized(rows)


def _merge_turbo(rows: Sequence[CacheLayer]) -> CacheLayer:
    import mlx.core as mx

    tq = turboquant_module()
    _concat_state_batch, _map_state = tq._concat_state_batch, tq._map_state
    _pad_state_tokens, _slice_state = tq._pad_state_tokens, tq._slice_state

    lengths = [int(row.offset) for row in rows]
    longest = max(lengths)
    first = rows[0]
    batch: CacheLayer = turbo_batch_class()([longest - n for n in lengths], bits=first.bits, seed=first.seed)
    template = next((row for row in rows if row.keys is not None and row.offset > 0), None)
    if template is None:
        return batch  # nothing stored yet: the first update allocates
    batch.key_codec, batch.value_codec = template.key_codec, template.value_codec
    keys: KVPart | None = None
    values: KVPart | None = None
    for row, n in zip(rows, lengths, strict=True):
        source, m = (template, int(template.offset)) if n == 0 else (row, n)
        row_keys = _pad_state_tokens(_slice_state(source.keys, m), longest - m, 0)
        row_values = _pad_state_tokens(_slice_state(source.values, m), longest - m, 0)
        if n == 0:  # a row with nothing yet: all padding
            row_keys = _map_state(row_keys, lambda a, _: mx.zeros_like(a))
            row_values = _map_state(row_values, lambda a, _: mx.zeros_like(a))
        keys = row_keys if keys is None else _concat_state_batch(keys, row_keys)
        values = row_values if values is None else _concat_state_batch(values, row_values)
    batch.keys, batch.values = keys, values
    batch.offset = mx.array(lengths)
    batch._idx = longest
    batch._refresh_fused_attention_eligibility()
    return batch


def _merge_quantized(rows: Sequence[CacheLayer]) -> CacheLayer:
    import mlx.core as mx
    from mlx_vlm.models.cache import BatchQuantizedKVCache

    lengths = [int(row.offset) for row in rows]
    longest = max(lengths)
    first = rows[0]
    batch: CacheLayer = BatchQuantizedKVCache(
        [longest - n for n in lengths], group_size=first.group_size, bits=first.bits
    )
    template = next((row for row in rows if row.keys is not None and row.offset > 0), None)
    if template is None:
        return batch  # nothing stored yet: the first update allocates
    parts_k, parts_v = [], []
    for row, n in zip(rows, lengths, strict=True):
        pad = [(0, 0), (0, 0), (longest - n, 0), (0, 0)]
        if n == 0:
            parts_k.append(
                tuple(mx.zeros((1, *k.shape[1:2], longest, k.shape[3]), k.dtype) for k in template.keys)
            )
            parts_v.append(
                tuple(mx.zeros((1, *v.shape[1:2], longest, v.shape[3]), v.dtype) for v in template.values)
            )
            continue
        parts_k.append(tuple(mx.pad(k[..., :n, :], pad) for k in row.keys))
        parts_v.append(tuple(mx.pad(v[..., :n, :], pad) for v in row.values))
    batch.keys = tuple(mx.concatenate(list(group), axis=0) for group in zip(*parts_k, strict=True))
    batch.values = tuple(mx.concatenate(list(group), axis=0) for group in zip(*parts_v, strict=True))
    batch.offset = mx.array(lengths)
    batch._idx = longest
    return batch

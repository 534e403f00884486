"""A speculative verify forward on the batch's KV, and the rollback of its rejected positions.

Speculative decoding's rollback (speculation/rollback.py) drops a verify forward's rejected
positions through `roll_back_batch`, whatever the layout — full precision, uniform, turboquant,
and sliding-window layers (`BatchRotatingKVCache`, also once wrapped) — and builds each verify
forward inside `verify_forward`, which makes its logits the ones of the steps it replaces
(docs/performance.md, "Speculative decoding").
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Any

from vlmserve.engine.kv.layout import CacheLayer
from vlmserve.engine.kv.turboquant import turbo_batch_class
from vlmserve.engine.kv.views import map_parts

__all__ = ["roll_back_batch", "trimmable_batch", "verify_forward"]


@contextlib.contextmanager
def verify_forward(caches: Sequence[CacheLayer]) -> Iterator[None]:
    """While a speculative verify forward (several positions per row) is built on `caches`:

    - turboquant batch layers attend each query position as a one-position decode step
      (`turboquant.py`, `_TurboBatch.prefill_attention`), so its logits are the ones the steps
      it replaces give;
    - a sliding-window layer whose buffer has rotated is put back in temporal order first
      (mlx-vlm's own `_temporal_order`, which its concatenating update starts with anyway):
      `BatchRotatingKVCache.make_mask` runs before the update and reads the rotated write index
      as the length, so it would mask each row's padding one position off (seen: a row with
      padding left in its window read a stale position, 5e-2 in its logits)."""
    from mlx_vlm.models.cache import BatchRotatingKVCache

    windowed: list[CacheLayer] = [layer for layer in caches if isinstance(layer, BatchRotatingKVCache)]
    for layer in windowed:
        if layer.rotated:
            layer._temporal_order()
    turbo: list[CacheLayer] = [layer for layer in caches if type(layer) is turbo_batch_class()]
    for layer in turbo:
        layer._one_position_queries = True
    try:
        yield
    finally:
        for layer in turbo:
            layer._one_position_queries = False


def trimmable_batch(layer: CacheLayer) -> bool:
    """A batch attention layer whose last positions a speculative verify can drop again
    (`roll_back_batch`): one whose rows' positions are its columns up to one write index, each
    vector stored on its own (full precision, uniform groups along the head dimension,
    turboquant per-vector codes), or a sliding-window one (`BatchRotatingKVCache`, see
    `_roll_back_windowed`)."""
    return type(layer) in _trimmable_types()


@functools.cache
def _trimmable_types() -> frozenset[type]:
    """The layer classes `trimmable_batch` accepts, found once: the verifier asks of every layer
    at every step (an import and a class built per layer cost ~0.8 us: 40 us a step at 48 layers)."""
    from mlx_vlm.models.cache import BatchKVCache, BatchQuantizedKVCache, BatchRotatingKVCache

    return frozenset((BatchKVCache, BatchQuantizedKVCache, BatchRotatingKVCache, turbo_batch_class()))


def roll_back_batch(layer: CacheLayer, common: int, rest: Sequence[int]) -> None:
    """Drop the last `common + rest[i]` positions of each row i of a `trimmable_batch` layer,
    after a verify forward of more than one position.

    mlx-vlm's pieces, whatever the layout: `trim(common)` (the write index and every row's offset
    move back; the columns stay allocated and are overwritten next), then the right-padded
    prefill's `prepare(right_padding=rest)` + `finalize()` (each row's kept positions rolled to
    the end, the rolled-over columns become its left padding, which the mask hides; ours for
    turboquant, `turboquant.py`). Last, the padding columns every row now has are dropped as views
    (mlx-vlm's `filter` drops them too, but by a gather: a copy of the whole cache each step)."""
    from mlx_vlm.models.cache import BatchRotatingKVCache

    if isinstance(layer, BatchRotatingKVCache):
        _roll_back_windowed(layer, common, rest)
        return
    if common:
        layer.trim(common)
    if not any(rest):
        return
    layer.prepare(right_padding=list(rest))
    layer.finalize()
    shift = min(int(layer.left_padding.min().item()), layer._idx)
    if shift <= 0:
        return
    if layer.keys is not None:
        layer.keys = map_parts(layer.keys, lambda p: p[:, :, shift:])
        layer.values = map_parts(layer.values, lambda p: p[:, :, shift:])
    layer._idx -= shift
    layer.left_padding = layer.left_padding - shift
    refresh = getattr(layer, "_refresh_fused_attention_eligibility", None)
    if refresh is not None:  # turboquant's host-side guard reads the left padding
        refresh()


def _roll_back_windowed(layer: CacheLayer, common: int, rest: Sequence[int]) -> None:
    """The rollback of a sliding-window batch layer (window W = `max_size`), also once it has
    wrapped — which mlx-vlm's `is_trimmable` refuses, as a rotated buffer's tail is not its
    last positions. A forward of several positions takes mlx-vlm's concatenating update, which
    first puts the buffer back in temporal order and keeps the last W - 1 positions before the
    new ones: every one the next token can see. So after a verify the layer is a plain run of
    columns again, and dropping its last `common` (its own `trim`, then slicing the buffer to
    the write index, so no dropped column is read as a window position) leaves exactly the
    state a forward of the kept positions would have left. Rows that keep fewer are rolled to
    the end as mlx-vlm's right-padded prefill does (`finalize`'s roll, its left padding grown
    by the same amount; a negative left padding, a row whose padding has left the window, counts
    from 0): each still holds at least W - 1 positions before its kept ones."""
    import mlx.core as mx
    from mlx_vlm.models.cache import dynamic_roll

    if common:
        layer.trim(common)
    layer.keys = layer.keys[..., : layer._idx, :]
    layer.values = layer.values[..., : layer._idx, :]
    if not any(rest):
        return
    shifts = mx.array(list(rest))
    roll: Any = dynamic_roll  # (untyped)
    layer.keys = roll(layer.keys, shifts[:, None], axis=2)
    layer.values = roll(layer.values, shifts[:, None], axis=2)
    layer.left_padding = mx.maximum(layer.left_padding, 0) + shifts
    layer.offset = layer.offset - shifts

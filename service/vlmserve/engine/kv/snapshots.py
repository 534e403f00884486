"""A cache's state at one position for the layers no prefix can be cut from — recurrent (Gated
DeltaNet / Mamba `ArraysCache`), sliding-window (`RotatingKVCache`), chunked (`ChunkedKVCache`) —
for the prefix cache to keep at the boundaries a later prompt may share. Plain KV layers are not
copied: their keys and values are cut to the same position instead (views.py)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING

from vlmserve.engine.kv.layout import CacheLayer, PromptCache
from vlmserve.engine.kv.views import is_plain

if TYPE_CHECKING:
    import mlx.core as mx

__all__ = [
    "BoundaryState",
    "boundary_nbytes",
    "boundary_state",
    "cuttable",
    "is_recurrent",
    "with_boundary_state",
]

# Per layer: an own, evaluated copy of a layer no prefix can be cut from, in its state at the
# boundary (a recurrent layer's conv window and state matrix, of a fixed size; a sliding window's
# or a chunk's keys and values, bounded by the window), or None for a plain KV layer.
BoundaryState = list["CacheLayer | None"]


def is_recurrent(layer: CacheLayer) -> bool:
    from mlx_vlm.models.cache import ArraysCache

    return isinstance(layer, ArraysCache)


def cuttable(layer: CacheLayer) -> bool:
    """A plain KV layer (views.py `is_plain`), whose first n positions are a shorter prompt's
    cache; a recurrent layer has no positions at all."""
    return is_plain(layer) and not is_recurrent(layer)


def boundary_state(cache: Sequence[CacheLayer], row: int | None = None) -> BoundaryState | None:
    """Copies of the layers of `cache` (of batch row `row`, or a one-row cache) that are not plain
    KV, as they are now: a later update replaces or rewrites the live layer's arrays, never these,
    and a copy keeps no batch buffer alive. None when every layer is plain, or when one holds
    something other than arrays and plain values."""
    import mlx.core as mx

    if all(cuttable(layer) for layer in cache):
        return None
    state: BoundaryState = []
    arrays: list[mx.array] = []
    for layer in cache:
        if cuttable(layer):
            state.append(None)
            continue
        saved = _copy_layer(_window_only(layer.extract(row) if row is not None else layer))
        if saved is None:
            return None
        state.append(saved)
        arrays += _arrays_of(saved)
    mx.eval(arrays)
    return state


def _window_only(layer: CacheLayer) -> CacheLayer:
    """A sliding-window layer right after a multi-token update holds the window and all of that
    update's positions (mlx-vlm's `RotatingKVCache` keeps max_size - 1 + n in temporal order until
    its next update trims it); only its last `max_size` positions (and the `keep` first) are ever
    read again: its next update keeps the last max_size (one token) or max_size - 1 (several)
    before writing, and a batch merge takes the last `size()`. So a boundary keeps just those, in
    the state the next one-token update would leave before writing (a prompt-end snapshot of a
    2,048-token chunk with a 1,024 window is a third of the size). Any other layer: as it is."""
    import mlx.core as mx
    from mlx_vlm.models.cache import RotatingKVCache

    if type(layer) is not RotatingKVCache or layer.keys is None:
        return layer
    held, window, keep = int(layer.keys.shape[2]), int(layer.max_size), int(layer.keep)
    if layer._idx != held or held <= window or layer.offset < held:
        return layer  # not a temporal-order buffer longer than its window
    trimmed = copy.copy(layer)
    for name in ("keys", "values"):
        array = getattr(layer, name)
        parts = [array[..., :keep, :], array[..., held - (window - keep) :, :]] if keep else None
        setattr(trimmed, name, mx.concatenate(parts, axis=2) if parts else array[..., held - window :, :])
    trimmed._idx = window
    return trimmed


def boundary_nbytes(state: BoundaryState) -> int:
    return sum(int(array.nbytes) for layer in state if layer is not None for array in _arrays_of(layer))


def with_boundary_state(cut: Sequence[CacheLayer | None], state: BoundaryState) -> PromptCache:
    """A live cache: the plain layers of `cut` (already cut to the state's position) and fresh
    layers from `state` for the others (new array objects: a layer that writes in place never
    writes into the kept state)."""
    out: PromptCache = []
    for layer, saved in zip(cut, state, strict=True):
        restored = layer if saved is None else _copy_layer(saved)
        assert restored is not None, "a kept layer copies"
        out.append(restored)
    return out


def _copy_layer(layer: CacheLayer) -> CacheLayer | None:
    import copy

    import mlx.core as mx

    def own(value: mx.array) -> mx.array:
        return mx.contiguous(mx.array(value))

    copied = copy.copy(layer)
    for name, value in vars(layer).items():
        if isinstance(value, mx.array):
            setattr(copied, name, own(value))
        elif isinstance(value, tuple | list) and all(v is None or isinstance(v, mx.array) for v in value):
            # a quantized part's tuple; a recurrent layer's list of states (None until its first update)
            setattr(copied, name, type(value)(None if v is None else own(v) for v in value))
        elif not (value is None or isinstance(value, int | float | str | bool)):
            return None
    return copied


def _arrays_of(layer: CacheLayer) -> list[mx.array]:
    import mlx.core as mx

    out: list[mx.array] = []
    for value in vars(layer).values():
        if isinstance(value, mx.array):
            out.append(value)
        elif isinstance(value, tuple | list):
            out += [v for v in value if isinstance(v, mx.array)]
    return out

"""Exact copies of a one-row cache's layers, whatever their kind (sliding-window, chunked, ...),
for the prefix cache to keep where no prefix of a cache is a shorter prompt's cache."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vlmserve.engine.kv.layout import CacheLayer, PromptCache

if TYPE_CHECKING:
    import mlx.core as mx

__all__ = [
    "RecurrentState",
    "has_recurrent_layers",
    "is_recurrent",
    "recurrent_nbytes",
    "recurrent_state",
    "restore",
    "snapshot",
    "snapshot_nbytes",
    "with_recurrent_state",
]

# A cache's recurrent layers' state at one position (Gated DeltaNet / Mamba `ArraysCache`: a
# conv window and a state matrix per layer, of a size that does not grow with the tokens), per
# layer: that layer's class and arrays, or None for a layer that is not recurrent (attention: its
# keys and values are cut to the same position instead). Arrays are one row, evaluated, owned.
RecurrentState = list["tuple[type[Any], tuple[mx.array | None, ...]] | None"]


def snapshot(cache: Sequence[CacheLayer]) -> PromptCache | None:
    """Own copies of a one-row cache's layers in their exact state, whatever their kind
    (sliding-window `RotatingKVCache`, chunked `ChunkedKVCache`, ...): such a state continues
    exactly from where it is, but no prefix of it is a shorter prompt's state. None when a
    layer holds something other than arrays and plain values."""
    import mlx.core as mx

    copies, arrays = [], []
    for layer in cache:
        copied = _copy_layer(layer)
        if copied is None:
            return None
        copies.append(copied)
        arrays += [v for v in _arrays_of(copied)]
    mx.eval(arrays)
    return copies


def restore(saved: Sequence[CacheLayer]) -> PromptCache:
    """A live cache from a snapshot (new array objects: a layer that writes in place never
    writes into the snapshot)."""
    restored = [_copy_layer(layer) for layer in saved]
    assert all(layer is not None for layer in restored)
    return restored


def snapshot_nbytes(saved: Sequence[CacheLayer]) -> int:
    return sum(int(array.nbytes) for layer in saved for array in _arrays_of(layer))


def _copy_layer(layer: CacheLayer) -> CacheLayer | None:
    import copy

    import mlx.core as mx

    copied = copy.copy(layer)
    for name, value in vars(layer).items():
        if isinstance(value, mx.array):
            setattr(copied, name, mx.contiguous(mx.array(value)))
        elif isinstance(value, tuple) and all(isinstance(v, mx.array) for v in value):
            setattr(copied, name, tuple(mx.contiguous(mx.array(v)) for v in value))
        elif not (value is None or isinstance(value, int | float | str | bool)):
            return None
    return copied


def _arrays_of(layer: CacheLayer) -> list[mx.array]:
    import mlx.core as mx

    out: list[mx.array] = []
    for value in vars(layer).values():
        if isinstance(value, mx.array):
            out.append(value)
        elif isinstance(value, tuple):
            out += [v for v in value if isinstance(v, mx.array)]
    return out


def is_recurrent(layer: CacheLayer) -> bool:
    from mlx_vlm.models.cache import ArraysCache

    return isinstance(layer, ArraysCache)


def has_recurrent_layers(cache: Sequence[CacheLayer]) -> bool:
    return any(is_recurrent(layer) for layer in cache)


def recurrent_state(cache: Sequence[CacheLayer], row: int | None = None) -> RecurrentState | None:
    """The recurrent layers' state now (of batch row `row`, or of a one-row cache), as own
    evaluated copies: a later update replaces a layer's arrays (never writes into these), and a
    copy keeps no batch buffer alive. None when the cache has no recurrent layer."""
    import mlx.core as mx

    if not has_recurrent_layers(cache):
        return None
    state: RecurrentState = []
    arrays: list[mx.array] = []
    for layer in cache:
        if not is_recurrent(layer):
            state.append(None)
            continue
        parts = []
        for array in layer.cache:
            if array is not None:
                array = mx.contiguous(array if row is None else array[row : row + 1])
                arrays.append(array)
            parts.append(array)
        state.append((type(layer), tuple(parts)))
    mx.eval(arrays)
    return state


def recurrent_nbytes(state: RecurrentState) -> int:
    return sum(int(a.nbytes) for layer in state if layer is not None for a in layer[1] if a is not None)


def with_recurrent_state(cache: PromptCache, state: RecurrentState) -> PromptCache:
    """`cache` (attention layers already cut to the state's position) with its recurrent layers
    set to `state`: fresh layers over new array objects, so nothing the restored cache does reaches
    the kept state."""
    import mlx.core as mx

    out: PromptCache = []
    for layer, kept in zip(cache, state, strict=True):
        if kept is None:
            out.append(layer)
            continue
        kind: Any = kept[0]
        parts = kept[1]
        restored = kind.__new__(kind)  # ArraysCache's __new__ sets its bookkeeping; no size needed
        restored.cache = [None if a is None else mx.array(a) for a in parts]
        out.append(restored)
    return out

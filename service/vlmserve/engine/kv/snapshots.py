"""Exact copies of a one-row cache's layers, whatever their kind (sliding-window, chunked, ...),
for the prefix cache to keep where no prefix of a cache is a shorter prompt's cache."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from vlmserve.engine.kv.layout import CacheLayer, PromptCache

if TYPE_CHECKING:
    import mlx.core as mx

__all__ = ["restore", "snapshot", "snapshot_nbytes"]


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

"""Rolling back rejected draft positions in mlx-vlm's batch KV cache, row by row.

A verify forward appends the same number of positions to every row (its width), but each row
keeps only its last token and accepted drafts: the rest (rejected drafts, the padding of rows with
fewer drafts) must go. `BatchKVCache` has one write index for all rows, so: trim the positions no
row keeps (its own `trim`), then move each row's kept positions to the end, as mlx-vlm's own
right-padded prefill does (`prepare(right_padding=...)` + `finalize()`: a roll, and the rolled-over
positions become left padding, which the mask hides), and drop padding columns every row has.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["can_roll_back", "roll_back_rows"]


def can_roll_back(caches: Sequence[Any]) -> bool:
    """Whether every layer is a plain `BatchKVCache` (sliding-window, quantized and recurrent
    layers keep other state: those models verify no drafts)."""
    from mlx_vlm.models.cache import BatchKVCache

    return bool(caches) and all(type(layer) is BatchKVCache for layer in caches)


def roll_back_rows(caches: Sequence[Any], rejected: Sequence[int]) -> None:
    """Drop each row's last `rejected[i]` positions."""
    common = min(rejected)
    rest = [count - common for count in rejected]
    for layer in caches:
        if common:
            layer.trim(common)
        if any(rest):
            layer.prepare(right_padding=rest)
            layer.finalize()
            shift = min(int(layer.left_padding.min().item()), layer._idx)
            if shift > 0:  # padding every row has: drop it, as BatchKVCache.filter does
                layer.keys = layer.keys[..., shift:, :]
                layer.values = layer.values[..., shift:, :]
                layer._idx -= shift
                layer.left_padding = layer.left_padding - shift

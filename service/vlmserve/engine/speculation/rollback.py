"""Rolling back rejected draft positions in mlx-vlm's batch caches, row by row.

A verify forward appends the same number of positions to every row (its width), but each row
keeps only its last token and accepted drafts: the rest (rejected drafts, the padding of rows with
fewer drafts) must go.

- Attention layers (`BatchKVCache`, and quantized: `BatchQuantizedKVCache`, turboquant's batch
  cache) have one write index for all rows, so: trim the positions no row keeps (their own
  `trim`), then move each row's kept positions to the end, as mlx-vlm's own right-padded prefill
  does (`prepare(right_padding=...)` + `finalize()`: a roll, and the rolled-over positions become
  left padding, which the mask hides), and drop padding columns every row has
  (kv/rollback.py `roll_back_batch`, the one place that knows the layouts). Exact for quantized
  layouts too: each vector is quantized on its own (groups along the head dimension, turboquant's
  per-vector norm and codes), so the kept positions' stored values do not depend on the dropped.
  Sliding-window layers (`BatchRotatingKVCache`) too, wrapped or not: a forward of several
  positions leaves them in temporal order with every position the next token can see
  (kv/rollback.py `_roll_back_windowed`).
- Recurrent layers (Qwen3.5's Gated DeltaNet state and its convolution window, mlx-vlm's
  `ArraysCache`) cannot be trimmed: their state after a position is not recoverable from the
  state after the last one. mlx-vlm's speculative cache transaction (`speculative/cache_state.py`)
  records every position's state during the forward and keeps each row's own prefix on commit
  (`RecurrentVerify`).
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Sequence
from typing import Any

from vlmserve.engine.kv.rollback import roll_back_batch, trimmable_batch

__all__ = ["RecurrentVerify", "begin_verify", "can_roll_back", "roll_back_rows", "verify_forward_kwargs"]


def _recorded(layer: Any) -> bool:
    """A layer whose per-position states mlx-vlm's transaction records (recurrent state)."""
    kind: type = type(layer)
    return _recorded_type(kind)


@functools.cache
def _recorded_type(kind: type) -> bool:
    """Whether a layer class has mlx-vlm's speculation transaction (asked once per class: the
    verifier asks of every layer at every step)."""
    return callable(getattr(kind, "start_speculation", None)) and callable(
        getattr(kind, "commit_speculation", None)
    )


def can_roll_back(caches: Sequence[Any]) -> bool:
    """Whether every layer is a trimmable batch attention layer (full precision, quantized or
    sliding-window) or a recorded recurrent layer: otherwise (Llama 4's chunked attention, rows
    that keep their own caches) the model verifies no drafts."""
    return bool(caches) and all(trimmable_batch(layer) or _recorded(layer) for layer in caches)


def verify_forward_kwargs(language_model: Any, capture_layer_ids: Sequence[int] = ()) -> dict[str, Any]:
    """Extra arguments of a verify forward: the last hidden states (a drafter model reads them),
    after those of `capture_layer_ids` (a DFlash drafter's target layers), for a target that
    speaks mlx-vlm's speculative protocol (`speculative_verify_hidden`).
    Asking for them also keeps Qwen3.5's forward on its batched path: without, a ragged batch
    runs row by row on extracted caches and swaps the batch's cache objects, which a transaction
    started on them would not see."""
    if callable(getattr(language_model, "speculative_verify_hidden", None)):
        return {"return_hidden": True, "capture_layer_ids": list(capture_layer_ids)}
    return {}


class RecurrentVerify:
    """mlx-vlm's speculative transaction over a batch's recurrent layers for one verify forward
    of `width` positions, and the rows (their batch keys) it was started with.

    Rows that leave before their tokens are judged (they finished on an earlier token) leave the
    attention layers at once, but the recurrent layers only at `commit`: the recorded states are
    per batch row, so the transaction must end on the rows it began with."""

    def __init__(self, caches: Sequence[Any], width: int, rows: Sequence[Hashable]) -> None:
        from mlx_vlm.speculative.cache_state import start_speculative_cache

        self.layers = [layer for layer in caches if not trimmable_batch(layer)]
        self._ids = {id(layer) for layer in self.layers}
        self._rows = list(rows)
        self._transaction = start_speculative_cache(self.layers, width)
        self.width = width

    def holds(self, layer: Any) -> bool:
        return id(layer) in self._ids

    def commit(self, rows: Sequence[Hashable], kept: Sequence[int]) -> None:
        """Keep each remaining row's first `kept[i]` positions; drop the rows that left."""
        import mlx.core as mx

        by_row = dict(zip(rows, kept, strict=True))
        self._transaction.commit([by_row.get(row, 1) for row in self._rows])
        if len(rows) < len(self._rows):
            survivors = mx.array([i for i, row in enumerate(self._rows) if row in by_row], dtype=mx.int32)
            for layer in self.layers:
                layer.filter(survivors)

    def abort(self) -> None:
        self._transaction.abort()


def begin_verify(caches: Sequence[Any], width: int, rows: Sequence[Hashable]) -> RecurrentVerify | None:
    """Start recording the recurrent layers' states for a forward of `width` positions (None when
    every layer is plain attention, or nothing can be rejected)."""
    if width <= 1 or all(trimmable_batch(layer) for layer in caches):
        return None
    return RecurrentVerify(caches, width, rows)


def roll_back_rows(caches: Sequence[Any], rejected: Sequence[int]) -> None:
    """Drop each row's last `rejected[i]` positions from the attention layers."""
    if not any(rejected):
        return  # (a one-position step left a sliding-window layer's buffer rotated: untouched)
    common = min(rejected)
    rest = [count - common for count in rejected]
    for layer in caches:
        if trimmable_batch(layer):
            roll_back_batch(layer, common, rest)

"""mlx-vlm's turboquant batch cache with what our batching needs of it.

mlx-vlm's `BatchTurboQuantKVCache` lacks the right-padded group prefill its full-precision and
uniform batch caches have (`prepare(right_padding)` / `finalize`), and attends a verify
forward's several positions differently from the one-position steps they stand for;
`turbo_batch_class` is the subclass that adds both. mlx-vlm is imported lazily, on first use.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

__all__ = ["turbo_batch_class", "turboquant_module"]


def turboquant_module() -> Any:
    """mlx-vlm's turboquant module, untyped: its state helpers (`_slice_state`, `_map_state`,
    `_pad_state_tokens`, `_concat_state_batch`) know its state tuples' layouts."""
    import mlx_vlm.turboquant

    return mlx_vlm.turboquant


@functools.cache
def turbo_batch_class() -> type:
    """mlx-vlm's batch turboquant cache with the right-padded group prefill its full-precision
    and uniform batch caches have (`prepare(right_padding)` / `finalize`: roll each row's
    real positions to the end, the padding becomes left padding the mask hides). Built on first
    use: mlx-vlm is imported lazily here."""
    import mlx.core as mx
    from mlx_vlm.models.cache import dynamic_roll
    from mlx_vlm.turboquant import BatchTurboQuantKVCache

    tq = turboquant_module()

    class _TurboBatch(BatchTurboQuantKVCache):
        _right_padding: mx.array | None = None
        # Set around a speculative verify forward (`verify_forward`).
        _one_position_queries = False

        def prefill_attention(
            self,
            queries: mx.array,
            keys_state: tuple[mx.array, ...] | None = None,
            values_state: tuple[mx.array, ...] | None = None,
            scale: float = 1.0,
            mask: mx.array | None = None,
        ) -> mx.array | None:
            """Several query positions on a single unpadded row (mlx-vlm's fused-kernel case;
            any other batch dequantizes for every query length alike). In a verify forward,
            each position is attended as the one-position decode step it stands for would
            (`decode_attention` over the keys up to it, the same mask): mlx-vlm's multi-query
            path rounds differently, and quantizing the next layer's keys amplifies that
            (seen: 8e-3 in the logits of the 4-bit fixture), so a seeded row would draw other
            tokens than without speculation."""
            if not self._one_position_queries:
                return super().prefill_attention(queries, keys_state, values_state, scale, mask)
            layer: Any = self  # mlx-vlm's mixin is untyped
            if keys_state is None or values_state is None:
                keys_state, values_state = layer._attention_states()
            keys_state, values_state = layer._unwrap(keys_state), layer._unwrap(values_state)
            width, total = int(queries.shape[-2]), tq._state_length(keys_state)
            outputs = []
            for position in range(width):
                end = total - width + position + 1
                outputs.append(
                    self.decode_attention(
                        queries[:, :, position : position + 1],
                        keys_state=tq._slice_state(keys_state, end),
                        values_state=tq._slice_state(values_state, end),
                        scale=scale,
                        mask=mask[..., position : position + 1, :end] if isinstance(mask, mx.array) else mask,
                    )
                )
            return mx.concatenate(outputs, axis=2)

        def prepare(self, *, right_padding: Sequence[int] | None = None, **_: Any) -> None:
            if right_padding is not None and max(right_padding) > 0:
                self._right_padding = mx.array(list(right_padding))

        def finalize(self) -> None:
            padding, self._right_padding = self._right_padding, None
            if padding is None or self.keys is None:
                return
            shifts = padding[:, None]

            def roll(array: mx.array, ndim: int) -> mx.array:
                return dynamic_roll(array, shifts, axis=2)

            self.keys = tq._map_state(tq._slice_state(self.keys, self._idx), roll)
            self.values = tq._map_state(tq._slice_state(self.values, self._idx), roll)
            self.offset = self.offset - padding
            self.left_padding = self.left_padding + padding
            self._refresh_fused_attention_eligibility()

    return _TurboBatch

"""The KV cache's layout, in one place: full precision or quantized (`--kv-bits`).

Every piece of the loop that makes, joins, slices, copies or measures a request's KV cache goes
through these functions, so the prefill, the decode batch, prompts shared in flight, the prefix
cache and its disk tier all hold the same layout. A layer's keys (and values) are one array
[rows, kv heads, tokens, head dim] at full precision, or, quantized, mlx-vlm's tuple of packed
uint32 data with per-group scales and biases (`mx.quantize`), each [rows, heads, tokens, ...].

Quantized caches are mlx-vlm's own: `QuantizedKVCache` per request and `BatchQuantizedKVCache`
for the batch (its `extend`, `filter`, `extract`, `prepare(right_padding)`/`finalize` and
`trim` are what our batching uses), with mlx-vlm's quantized attention. What mlx-vlm lacks for
our batching is the one-row → batch `merge` its full-precision `KVCache` has (our requests
prefill alone or in groups, then join a running batch): `merge_rows` adds it here. A request's
KV is quantized from its first prefill chunk on, whatever path it takes, so a request gives the
same tokens alone, batched or from a cached prefix.

The turboquant scheme (`--kv-quant-scheme turboquant`) is mlx-vlm's `TurboQuantKVCache` /
`BatchTurboQuantKVCache` (rotated vectors, a codebook index per value and one float16 norm per
vector: no groups, so any head width). Its state is a `TurboQuantMSEState` (norms [rows, heads,
tokens], indices [rows, heads, tokens, words]); its codecs are a function of the head width, the
bits and a fixed seed, so every copy of a request's KV decodes the same way. mlx-vlm's batch
cache lacks the one-row merge and the right-padded group prefill (`prepare(right_padding)` /
`finalize`) our loop uses; `_TurboBatch` adds them here.

Speculative decoding's rollback (speculation/rollback.py) drops a verify forward's rejected
positions through `roll_back_batch`, whatever the layout — full precision, uniform, turboquant,
and sliding-window layers (`BatchRotatingKVCache`, also once wrapped) — and builds each verify
forward inside `verify_forward`, which makes its logits the ones of the steps it replaces
(docs/performance.md, "Speculative decoding").

Generation thread only.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "KVLayout",
    "is_plain",
    "kv_nbytes",
    "layer_arrays",
    "merge_rows",
    "mergeable",
    "new_prompt_cache",
    "own_copy",
    "restore",
    "roll_back_batch",
    "row_views",
    "snapshot",
    "snapshot_nbytes",
    "trimmable_batch",
    "verify_forward",
    "views",
]

KV_BITS_CHOICES = (4, 8)


UNIFORM = "uniform"
TURBOQUANT = "turboquant"
KV_QUANT_SCHEMES = (UNIFORM, TURBOQUANT)


@dataclass(frozen=True)
class KVLayout:
    """How a model's KV is stored: full precision (`bits` None), quantized in groups
    (`uniform`, mx.quantize) or turboquant (codebook indices and a norm per vector)."""

    bits: int | None = None
    group_size: int = 64
    scheme: str = UNIFORM

    @property
    def quantized(self) -> bool:
        return self.bits is not None

    @property
    def turbo(self) -> bool:
        return self.bits is not None and self.scheme == TURBOQUANT

    @property
    def describe(self) -> str:
        if self.bits is None:
            return "full precision"
        if self.turbo:
            return f"{self.bits}-bit turboquant"
        return f"{self.bits}-bit, groups of {self.group_size}"


def layout_for(bits: int | None, group_size: int, head_dim: int, scheme: str = UNIFORM) -> KVLayout:
    """The layout `--kv-bits` asks for on a model with `head_dim`: quantization groups must
    divide the head dimension, so a model with small heads uses the largest group that does
    (turboquant has no groups)."""
    if bits is None:
        return KVLayout()
    if bits not in KV_BITS_CHOICES:
        raise ValueError(f"--kv-bits must be one of {KV_BITS_CHOICES}, not {bits}")
    if scheme not in KV_QUANT_SCHEMES:
        raise ValueError(f"--kv-quant-scheme must be one of {KV_QUANT_SCHEMES}, not {scheme!r}")
    if scheme == TURBOQUANT:
        return KVLayout(bits, group_size, TURBOQUANT)
    for size in (group_size, 64, 32):
        if size <= head_dim and head_dim % size == 0:
            return KVLayout(bits, size)
    raise ValueError(f"KV quantization needs a head dimension divisible by 32; this model's is {head_dim}")


def new_prompt_cache(language_model: Any, layout: KVLayout) -> list[Any]:
    """An empty cache for one request (mlx-vlm's own layers; quantized ones when asked)."""
    from mlx_vlm.models.cache import QuantizedKVCache, make_prompt_cache

    if layout.bits is None:
        return make_prompt_cache(language_model)
    if layout.turbo:
        from mlx_vlm.turboquant import TurboQuantKVCache

        return [TurboQuantKVCache(bits=layout.bits) for _ in language_model.layers]
    return [QuantizedKVCache(group_size=layout.group_size, bits=layout.bits) for _ in language_model.layers]


def mergeable(layer: Any) -> bool:
    """Whether a one-row cache layer can join a batch cache (mlx-vlm's `merge`, or ours)."""
    from mlx_vlm.models.cache import QuantizedKVCache
    from mlx_vlm.turboquant import TurboQuantKVCache

    return isinstance(layer, QuantizedKVCache | TurboQuantKVCache) or callable(
        getattr(type(layer), "merge", None)
    )


def merge_rows(rows: Sequence[Any]) -> Any:
    """One layer's batch cache from several requests' one-row caches (left-padded to one length)."""
    from mlx_vlm.models.cache import QuantizedKVCache
    from mlx_vlm.turboquant import TurboQuantKVCache

    if isinstance(rows[0], TurboQuantKVCache):
        return _merge_turbo(rows)
    if not isinstance(rows[0], QuantizedKVCache):
        return type(rows[0]).merge(list(rows))
    return _merge_quantized(rows)


@functools.cache
def _turbo_batch_class() -> type:
    """mlx-vlm's batch turboquant cache with the right-padded group prefill its full-precision
    and uniform batch caches have (`prepare(right_padding)` / `finalize`: roll each row's
    real positions to the end, the padding becomes left padding the mask hides). Built on first
    use: mlx-vlm is imported lazily here."""
    import mlx.core as mx
    from mlx_vlm.models.cache import dynamic_roll
    from mlx_vlm.turboquant import BatchTurboQuantKVCache

    tq = _turboquant()

    class _TurboBatch(BatchTurboQuantKVCache):
        _right_padding: Any = None
        # Set around a speculative verify forward (`verify_forward`).
        _one_position_queries = False

        def prefill_attention(
            self,
            queries: Any,
            keys_state: Any = None,
            values_state: Any = None,
            scale: float = 1.0,
            mask: Any = None,
        ) -> Any:
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

            def roll(array: Any, ndim: int) -> Any:
                return dynamic_roll(array, shifts, axis=2)

            self.keys = tq._map_state(tq._slice_state(self.keys, self._idx), roll)
            self.values = tq._map_state(tq._slice_state(self.values, self._idx), roll)
            self.offset = self.offset - padding
            self.left_padding = self.left_padding + padding
            self._refresh_fused_attention_eligibility()

    return _TurboBatch


@contextlib.contextmanager
def verify_forward(caches: Sequence[Any]) -> Iterator[None]:
    """While a speculative verify forward (several positions per row) is built on `caches`:

    - turboquant batch layers attend each query position as a one-position decode step
      (`_TurboBatch.prefill_attention`), so its logits are the ones the steps it replaces give;
    - a sliding-window layer whose buffer has rotated is put back in temporal order first
      (mlx-vlm's own `_temporal_order`, which its concatenating update starts with anyway):
      `BatchRotatingKVCache.make_mask` runs before the update and reads the rotated write index
      as the length, so it would mask each row's padding one position off (seen: a row with
      padding left in its window read a stale position, 5e-2 in its logits)."""
    from mlx_vlm.models.cache import BatchRotatingKVCache

    windowed: list[Any] = [layer for layer in caches if isinstance(layer, BatchRotatingKVCache)]
    for layer in windowed:
        if layer.rotated:
            layer._temporal_order()
    turbo: list[Any] = [layer for layer in caches if type(layer) is _turbo_batch_class()]
    for layer in turbo:
        layer._one_position_queries = True
    try:
        yield
    finally:
        for layer in turbo:
            layer._one_position_queries = False


def _turboquant() -> Any:
    """mlx-vlm's turboquant module, untyped: its state helpers (`_slice_state`, `_map_state`,
    `_pad_state_tokens`, `_concat_state_batch`) know its state tuples' layouts."""
    import mlx_vlm.turboquant

    return mlx_vlm.turboquant


def _merge_turbo(rows: Sequence[Any]) -> Any:
    import mlx.core as mx

    tq = _turboquant()
    _concat_state_batch, _map_state = tq._concat_state_batch, tq._map_state
    _pad_state_tokens, _slice_state = tq._pad_state_tokens, tq._slice_state

    lengths = [int(row.offset) for row in rows]
    longest = max(lengths)
    first = rows[0]
    batch: Any = _turbo_batch_class()([longest - n for n in lengths], bits=first.bits, seed=first.seed)
    template = next((row for row in rows if row.keys is not None and row.offset > 0), None)
    if template is None:
        return batch  # nothing stored yet: the first update allocates
    batch.key_codec, batch.value_codec = template.key_codec, template.value_codec
    keys: Any = None
    values: Any = None
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


def _merge_quantized(rows: Sequence[Any]) -> Any:
    import mlx.core as mx
    from mlx_vlm.models.cache import BatchQuantizedKVCache

    lengths = [int(row.offset) for row in rows]
    longest = max(lengths)
    first = rows[0]
    batch: Any = BatchQuantizedKVCache(
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


def trimmable_batch(layer: Any) -> bool:
    """A batch attention layer whose last positions a speculative verify can drop again
    (`roll_back_batch`): one whose rows' positions are its columns up to one write index, each
    vector stored on its own (full precision, uniform groups along the head dimension,
    turboquant per-vector codes), or a sliding-window one (`BatchRotatingKVCache`, see
    `_roll_back_windowed`)."""
    from mlx_vlm.models.cache import BatchKVCache, BatchQuantizedKVCache, BatchRotatingKVCache

    return type(layer) in (BatchKVCache, BatchQuantizedKVCache, BatchRotatingKVCache) or (
        type(layer) is _turbo_batch_class()
    )


def roll_back_batch(layer: Any, common: int, rest: Sequence[int]) -> None:
    """Drop the last `common + rest[i]` positions of each row i of a `trimmable_batch` layer,
    after a verify forward of more than one position.

    mlx-vlm's pieces, whatever the layout: `trim(common)` (the write index and every row's offset
    move back; the columns stay allocated and are overwritten next), then the right-padded
    prefill's `prepare(right_padding=rest)` + `finalize()` (each row's kept positions rolled to
    the end, the rolled-over columns become its left padding, which the mask hides; ours for
    turboquant, `_TurboBatch`). Last, the padding columns every row now has are dropped as views
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
        layer.keys = _map_parts(layer.keys, lambda p: p[:, :, shift:])
        layer.values = _map_parts(layer.values, lambda p: p[:, :, shift:])
    layer._idx -= shift
    layer.left_padding = layer.left_padding - shift
    refresh = getattr(layer, "_refresh_fused_attention_eligibility", None)
    if refresh is not None:  # turboquant's host-side guard reads the left padding
        refresh()


def _roll_back_windowed(layer: Any, common: int, rest: Sequence[int]) -> None:
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


def _map_parts(part: Any, fn: Any) -> Any:
    """`fn` over one layer's keys (or values): one array, or each array of a quantized tuple,
    keeping the tuple's type (turboquant's state is a NamedTuple its attention dispatches on)."""
    if isinstance(part, tuple):
        mapped = [fn(p) for p in part]
        return type(part)(*mapped) if hasattr(part, "_fields") else tuple(mapped)
    return fn(part)


def _slice(part: Any, rows: slice, start: int, stop: int) -> Any:
    # The token axis is 2 in every array of every layout (turboquant's norms are 3-D).
    return _map_parts(part, lambda p: p[rows, :, start:stop])


def row_views(batch_caches: Sequence[Any], index: int, pad: int, tokens: int) -> list[tuple[Any, Any]]:
    """The first `tokens` positions of batch row `index` (after its `pad` left padding), per
    layer (keys, values), as lazy views."""
    rows = slice(index, index + 1)
    return [
        (_slice(layer.keys, rows, pad, pad + tokens), _slice(layer.values, rows, pad, pad + tokens))
        for layer in batch_caches
    ]


def views(layers: Sequence[tuple[Any, Any]], tokens: int, layout: KVLayout) -> list[Any]:
    """A one-row prompt cache holding the first `tokens` positions of `layers`' (keys, values),
    sharing their arrays: MLX arrays are immutable, and the new cache grows into buffers of its
    own, so the source is never written through it."""
    from mlx_vlm.models.cache import KVCache, QuantizedKVCache

    cache = []
    for keys, values in layers:
        layer: Any
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


def _turbo_layer(keys: Any, values: Any, tokens: int, layout: KVLayout) -> Any:
    """A one-row turboquant layer over stored state (a NamedTuple, or the plain tuple the disk
    tier gives back); its codecs are rebuilt on the first update, identical (same seed)."""
    tq = _turboquant()
    layer = tq.TurboQuantKVCache(bits=layout.bits or 4)
    everything = slice(None)
    layer.keys = tq.TurboQuantMSEState(*_slice(tuple(keys), everything, 0, tokens))
    layer.values = tq.TurboQuantMSEState(*_slice(tuple(values), everything, 0, tokens))
    layer.offset = tokens
    return layer


def is_plain(layer: Any) -> bool:
    """A layer whose keys and values are exactly its positions so far (full or quantized), so
    any prefix of them is the cache of a prefix of the prompt."""
    from mlx_vlm.models.cache import KVCache, QuantizedKVCache
    from mlx_vlm.turboquant import TurboQuantKVCache

    # Any other cache class (it has update_and_fetch) keeps a state that is not a prefix of
    # positions; bare (keys, values) holders are plain.
    return type(layer) in (KVCache, QuantizedKVCache, TurboQuantKVCache) or not hasattr(
        layer, "update_and_fetch"
    )


def snapshot(cache: Sequence[Any]) -> list[Any] | None:
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


def restore(saved: Sequence[Any]) -> list[Any]:
    """A live cache from a snapshot (new array objects: a layer that writes in place never
    writes into the snapshot)."""
    restored = [_copy_layer(layer) for layer in saved]
    assert all(layer is not None for layer in restored)
    return restored


def snapshot_nbytes(saved: Sequence[Any]) -> int:
    return sum(int(array.nbytes) for layer in saved for array in _arrays_of(layer))


def _copy_layer(layer: Any) -> Any | None:
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


def _arrays_of(layer: Any) -> list[Any]:
    import mlx.core as mx

    out: list[Any] = []
    for value in vars(layer).values():
        if isinstance(value, mx.array):
            out.append(value)
        elif isinstance(value, tuple):
            out += [v for v in value if isinstance(v, mx.array)]
    return out


def layer_arrays(layer: Any, tokens: int) -> tuple[Any, Any] | None:
    """A one-row cache layer's (keys, values) for its first `tokens` positions; None when the
    layer is not the plain (or quantized) per-layer KV this module knows."""
    if not is_plain(layer):
        return None
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    if keys is None or values is None or getattr(layer, "offset", -1) < tokens:
        return None
    everything = slice(None)
    return _slice(keys, everything, 0, tokens), _slice(values, everything, 0, tokens)


def own_copy(cache: list[Any], tokens: int) -> None:
    """Make each layer's keys and values its own evaluated arrays of exactly `tokens` positions.

    A row extracted from the batch is a lazy slice of the batch's KV arrays, and a row's own
    cache a view of buffers allocated in steps: kept as they are, they keep those whole arrays
    (every row of the batch, every allocated position) alive for as long as the entry lives."""
    import mlx.core as mx

    arrays: list[Any] = []
    for layer in cache:
        pair = layer_arrays(layer, tokens)
        if pair is None:
            return  # not a plain KV layer: the prefix cache refuses it anyway
        copied = [_map_parts(part, mx.contiguous) for part in pair]
        layer.keys, layer.values = copied
        if hasattr(layer, "_cached_state"):  # turboquant caches its sliced state by offset
            layer._cached_state, layer._cached_state_offset = None, -1
        for part in copied:
            arrays += list(part) if isinstance(part, tuple) else [part]
    mx.eval(arrays)


def kv_nbytes(part: Any) -> int:
    """Bytes of one layer's keys or values (all parts of a quantized tuple)."""
    if isinstance(part, tuple):
        return sum(int(p.nbytes) for p in part)
    return int(part.nbytes)


def bytes_per_token(language_model: Any, layout: KVLayout, dtype_bytes: int) -> int:
    """KV bytes one token takes in every layer (keys + values), at `layout`'s precision."""
    heads, head_dim = kv_shape(language_model)
    layers = len(language_model.layers)
    if not layout.quantized or layout.bits is None:
        per_vector = head_dim * dtype_bytes
    elif layout.turbo:
        # codebook indices packed in 32-bit words + one float16 norm
        per_vector = -(-head_dim * layout.bits // 32) * 4 + 2
    else:
        # packed data + one scale and one bias per group
        per_vector = head_dim * layout.bits // 8 + 2 * (head_dim // layout.group_size) * dtype_bytes
    return 2 * layers * heads * per_vector


def kv_shape(language_model: Any) -> tuple[int, int]:
    """(KV heads, head dimension) of a language model: from its first layer's attention module
    (mlx-vlm's families name them `n_kv_heads` / `head_dim`), else from its text config."""
    layer = language_model.layers[0]
    for name in ("self_attn", "attention", "attn"):
        attention = getattr(layer, name, None)
        head_dim = getattr(attention, "head_dim", None)
        kv_heads = getattr(attention, "n_kv_heads", None) or getattr(attention, "num_key_value_heads", None)
        if head_dim and kv_heads:
            return int(kv_heads), int(head_dim)
    config = getattr(language_model, "args", None) or getattr(language_model, "config", None)
    config = getattr(config, "text_config", None) or config
    heads = int(getattr(config, "num_attention_heads", 1) or 1)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    return kv_heads, int(getattr(config, "head_dim", None) or int(getattr(config, "hidden_size", 0)) // heads)

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

Generation thread only.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    "row_views",
    "snapshot",
    "snapshot_nbytes",
    "views",
]

KV_BITS_CHOICES = (4, 8)


@dataclass(frozen=True)
class KVLayout:
    """How a model's KV is stored: full precision (`bits` None) or quantized in groups."""

    bits: int | None = None
    group_size: int = 64

    @property
    def quantized(self) -> bool:
        return self.bits is not None

    @property
    def describe(self) -> str:
        return "full precision" if self.bits is None else f"{self.bits}-bit, groups of {self.group_size}"


def layout_for(bits: int | None, group_size: int, head_dim: int) -> KVLayout:
    """The layout `--kv-bits` asks for on a model with `head_dim`: quantization groups must
    divide the head dimension, so a model with small heads uses the largest group that does."""
    if bits is None:
        return KVLayout()
    if bits not in KV_BITS_CHOICES:
        raise ValueError(f"--kv-bits must be one of {KV_BITS_CHOICES}, not {bits}")
    for size in (group_size, 64, 32):
        if size <= head_dim and head_dim % size == 0:
            return KVLayout(bits, size)
    raise ValueError(f"KV quantization needs a head dimension divisible by 32; this model's is {head_dim}")


def new_prompt_cache(language_model: Any, layout: KVLayout) -> list[Any]:
    """An empty cache for one request (mlx-vlm's own layers; quantized ones when asked)."""
    from mlx_vlm.models.cache import QuantizedKVCache, make_prompt_cache

    if layout.bits is None:
        return make_prompt_cache(language_model)
    return [QuantizedKVCache(group_size=layout.group_size, bits=layout.bits) for _ in language_model.layers]


def mergeable(layer: Any) -> bool:
    """Whether a one-row cache layer can join a batch cache (mlx-vlm's `merge`, or ours)."""
    from mlx_vlm.models.cache import QuantizedKVCache

    return isinstance(layer, QuantizedKVCache) or callable(getattr(type(layer), "merge", None))


def merge_rows(rows: Sequence[Any]) -> Any:
    """One layer's batch cache from several requests' one-row caches (left-padded to one length)."""
    from mlx_vlm.models.cache import QuantizedKVCache

    if not isinstance(rows[0], QuantizedKVCache):
        return type(rows[0]).merge(list(rows))
    return _merge_quantized(rows)


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


def _slice(part: Any, rows: slice, start: int, stop: int) -> Any:
    if isinstance(part, tuple):
        return tuple(p[rows, :, start:stop] for p in part)
    return part[rows, :, start:stop]


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


def is_plain(layer: Any) -> bool:
    """A layer whose keys and values are exactly its positions so far (full or quantized), so
    any prefix of them is the cache of a prefix of the prompt."""
    from mlx_vlm.models.cache import KVCache, QuantizedKVCache

    # Any other cache class (it has update_and_fetch) keeps a state that is not a prefix of
    # positions; bare (keys, values) holders are plain.
    return type(layer) in (KVCache, QuantizedKVCache) or not hasattr(layer, "update_and_fetch")


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
        copied = [
            tuple(mx.contiguous(p) for p in part) if isinstance(part, tuple) else mx.contiguous(part)
            for part in pair
        ]
        layer.keys, layer.values = copied
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

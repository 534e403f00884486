"""How a model's KV is stored (`--kv-bits`, `--kv-quant-scheme`) and a request's empty cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

if TYPE_CHECKING:
    import mlx.core as mx

__all__ = [
    "TURBOQUANT",
    "UNIFORM",
    "CacheLayer",
    "KVBits",
    "KVLayout",
    "KVPart",
    "KVQuantScheme",
    "PromptCache",
    "layout_for",
    "new_prompt_cache",
]

# One layer's keys (or values), [rows, kv heads, tokens, ...]: one array at full precision;
# quantized, a tuple of arrays (uniform: packed data, scales and biases; turboquant: its state
# NamedTuple of norms and codebook indices).
KVPart: TypeAlias = "mx.array | tuple[mx.array, ...]"
# One layer of a cache: one of mlx-vlm's cache classes (full precision, quantized, turboquant,
# sliding-window, chunked, recurrent; a request's or a batch's). They share no typed interface
# (their keys, values and offsets are set in untyped constructors), so a layer stays untyped.
CacheLayer: TypeAlias = Any
# A request's (or a batch's) cache: one layer per language-model layer.
PromptCache: TypeAlias = list[CacheLayer]

# `--kv-bits` and `--kv-quant-scheme` (EngineConfig): the settings refuse any other value.
KVBits: TypeAlias = Literal[4, 8]
KVQuantScheme: TypeAlias = Literal["uniform", "turboquant"]
UNIFORM: KVQuantScheme = "uniform"
TURBOQUANT: KVQuantScheme = "turboquant"


@dataclass(frozen=True)
class KVLayout:
    """How a model's KV is stored: full precision (`bits` None), quantized in groups
    (`uniform`, mx.quantize) or turboquant (codebook indices and a norm per vector)."""

    bits: int | None = None
    group_size: int = 64
    scheme: KVQuantScheme = UNIFORM

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


def layout_for(
    bits: KVBits | None, group_size: int, head_dim: int, scheme: KVQuantScheme = UNIFORM
) -> KVLayout:
    """The layout `--kv-bits` asks for on a model with `head_dim`: quantization groups must
    divide the head dimension, so a model with small heads uses the largest group that does
    (turboquant has no groups)."""
    if bits is None:
        return KVLayout()
    if scheme == TURBOQUANT:
        return KVLayout(bits, group_size, TURBOQUANT)
    for size in (group_size, 64, 32):
        if size <= head_dim and head_dim % size == 0:
            return KVLayout(bits, size)
    raise ValueError(f"KV quantization needs a head dimension divisible by 32; this model's is {head_dim}")


def new_prompt_cache(language_model: Any, layout: KVLayout) -> PromptCache:
    """An empty cache for one request (mlx-vlm's own layers; quantized ones when asked)."""
    from mlx_vlm.models.cache import QuantizedKVCache, make_prompt_cache

    if layout.bits is None:
        return make_prompt_cache(language_model)
    if layout.turbo:
        from mlx_vlm.turboquant import TurboQuantKVCache

        return [TurboQuantKVCache(bits=layout.bits) for _ in language_model.layers]
    return [QuantizedKVCache(group_size=layout.group_size, bits=layout.bits) for _ in language_model.layers]

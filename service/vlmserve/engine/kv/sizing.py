"""What a request's KV takes: bytes stored, and bytes per token at a layout's precision."""

from __future__ import annotations

from typing import Any

from vlmserve.engine.kv.layout import KVLayout, KVPart

__all__ = ["bytes_per_token", "kv_nbytes", "kv_shape"]


def kv_nbytes(part: KVPart) -> int:
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

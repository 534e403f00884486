"""Vision features by image content hash, bounded in bytes (generation thread only).

Agents resend their whole history every turn, images included; re-running the vision tower on
each is the bulk of an image request's prefill. mlx-vlm's `VisionFeatureCache` is an LRU keyed
by path or pixel hash and bounded by entry count; it caches what one `get_input_embeddings`
call saw (all of a request's images together), so a turn that adds one screenshot to four old
ones would miss. This one wraps it per image (the key is the request's partition and the content
hash request preparation computed) and bounds it in bytes, since one large image's features
outweigh many small ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlx_vlm.vision_cache import VisionFeatureCache as _MlxVlmVisionFeatureCache

__all__ = ["VisionFeatureCache", "encode_images"]


def _nbytes(features: Any) -> int:
    return int(features.nbytes)


class VisionFeatureCache(_MlxVlmVisionFeatureCache):
    def __init__(self, max_bytes: int, *, namespace: str = "") -> None:
        super().__init__(max_size=1 << 30)  # bounded by bytes below, not by count
        self.max_bytes = max_bytes
        # The model (ModelInfo.cache_namespace): part of every key, beside the image's hash.
        self.namespace = namespace
        self.bytes = 0
        # Vision-tower runs (one per image encoded): tests and metrics.
        self.encoded = 0
        self.hits = 0

    def _make_key(self, image_source: Any) -> str:
        return f"{self.namespace}\0{super()._make_key(image_source)}"

    def put(self, image_source: Any, features: Any) -> None:
        size = _nbytes(features)
        if self.max_bytes <= 0 or size > self.max_bytes:
            return
        key = self._make_key(image_source)
        old = self._cache.pop(key, None)
        if old is not None:
            self.bytes -= _nbytes(old)
        while self._cache and self.bytes + size > self.max_bytes:
            _, evicted = self._cache.popitem(last=False)
            self.bytes -= _nbytes(evicted)
        self._cache[key] = features
        self.bytes += size

    def clear(self) -> None:
        super().clear()
        self.bytes = 0


# Models whose vision tower takes (all images' patch rows, grids), encodes each image on its own
# (attention within an image only), returns one array, and whose `get_input_embeddings` uses
# `cached_image_features` exactly as it would its own output. Qwen3-VL is not one: its tower
# also returns deepstack features, which the cached path drops.
_PER_IMAGE_MODEL_TYPES = frozenset({"qwen2_vl", "qwen2_5_vl"})


def _qwen_style(model: Any, kwargs: dict[str, Any]) -> bool:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    return model_type in _PER_IMAGE_MODEL_TYPES and kwargs.get("image_grid_thw") is not None


def encode_images(
    model: Any,
    cache: VisionFeatureCache,
    pixel_values: Any,
    kwargs: dict[str, Any],
    hashes: Sequence[str],
    *,
    partition: str,
    covered: Sequence[int] = (),
) -> Any | None:
    """Features of all images, in order, each image encoded once; None when not supported here.

    Entries are the request's partition's (its API key's), as in the prefix cache: a hit is
    faster, so a shared cache told one key which images another had just sent.

    Qwen2-VL-style inputs concatenate every image's patch rows; image i owns
    prod(image_grid_thw[i]) rows, and its features are prod(grid) / merge² rows.
    `covered[i]` > 0: image i lies inside a reused prefix, its features are never read (the KV
    of its positions comes from the cache), so zeros of that many rows stand in for them.
    """
    import mlx.core as mx

    if not _qwen_style(model, kwargs) or len(hashes) == 0:
        return None
    grids = kwargs["image_grid_thw"]
    if int(grids.shape[0]) != len(hashes):
        return None
    rows = [int(t * h * w) for t, h, w in grids.tolist()]
    if sum(rows) != int(pixel_values.shape[0]):
        return None
    dtype = model.vision_tower.patch_embed.proj.weight.dtype
    features: list[Any] = []
    start = 0
    for index, (content_hash, count) in enumerate(zip(hashes, rows, strict=True)):
        key = f"{partition}\0{content_hash}"
        if index < len(covered) and covered[index] > 0 and features:
            features.append(mx.zeros((covered[index], features[0].shape[-1]), dtype=features[0].dtype))
            start += count
            continue
        if index < len(covered) and covered[index] > 0 and (hidden := _feature_width(model)) is not None:
            features.append(mx.zeros((covered[index], hidden), dtype=dtype))
            start += count
            continue
        found = cache.get(key)
        if found is None:
            found = model.vision_tower(
                pixel_values[start : start + count].astype(dtype),
                grids[index : index + 1],
                output_hidden_states=False,
            )
            mx.eval(found)
            cache.encoded += 1
            cache.put(key, found)
        else:
            cache.hits += 1
        features.append(found)
        start += count
    return mx.concatenate(features, axis=0) if len(features) > 1 else features[0]


def _feature_width(model: Any) -> int | None:
    """The vision tower's output width (the language model's hidden size, after the merger)."""
    text = getattr(getattr(model, "config", None), "text_config", None)
    width = getattr(text, "hidden_size", None)
    return int(width) if isinstance(width, int) else None

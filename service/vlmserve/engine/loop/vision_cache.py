"""Vision features by image content hash, bounded in bytes (generation thread only), with a
disk tier (vision_disk.py) where the prefix cache has one.

Agents resend their whole history every turn, images included; re-running the vision tower on
each is the bulk of an image request's prefill. mlx-vlm's `VisionFeatureCache` is an LRU keyed
by path or pixel hash and bounded by entry count; it caches what one `get_input_embeddings`
call saw (all of a request's images together), so a turn that adds one screenshot to four old
ones would miss. This one wraps it per image (the key is the request's partition and the content
hash request preparation computed) and bounds it in bytes, since one large image's features
outweigh many small ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mlx_vlm.vision_cache import VisionFeatureCache as _MlxVlmVisionFeatureCache

from vlmserve.engine.loop.vision_disk import VisionDiskTier

__all__ = ["FamilyImages", "VisionFeatureCache", "embed_with_deepstack", "encode_images"]


def _nbytes(features: Any) -> int:
    return int(features.nbytes)


class VisionFeatureCache(_MlxVlmVisionFeatureCache):
    def __init__(self, max_bytes: int, *, namespace: str = "", disk: VisionDiskTier | None = None) -> None:
        super().__init__(max_size=1 << 30)  # bounded by bytes below, not by count
        self.max_bytes = max_bytes
        # The model (ModelInfo.cache_namespace): part of every key, beside the image's hash.
        self.namespace = namespace
        self.bytes = 0
        # Vision-tower runs (one per image encoded): tests and metrics.
        self.encoded = 0
        self.hits = 0
        # Features kept across restarts (vision_disk.py): read on a miss, written when encoded.
        self.disk = disk

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


@dataclass(frozen=True, slots=True)
class FamilyImages:
    """A request's images as one family's vision tower takes them, one image at a time: `encode`
    gives the features of the images at these indices (what `get_input_embeddings` would have
    computed for them; run together where the family's own call runs them together),
    `stand_in` zeros for an image whose features are never read (n tokens, like `like` or the
    family's width), `join` all images' features as `cached_image_features`."""

    count: int
    encode: Callable[[list[int]], list[Any]]
    stand_in: Callable[[int], Any]
    join: Callable[[list[Any]], Any]
    # Whether the prompt's placeholder runs are one per image (so `covered` can be trusted):
    # not where an image's placeholders come in rows (Mistral 3's breaks between them).
    one_run_per_image: bool = True


def encode_images(
    model: Any,
    cache: VisionFeatureCache,
    pixel_values: Any,
    kwargs: dict[str, Any],
    hashes: Sequence[str],
    *,
    partition: str,
    covered: Sequence[int] = (),
    images: FamilyImages | None = None,
) -> Any | None:
    """Features of all images, in order, each image encoded once; None when not supported here.

    Entries are the request's partition's (its API key's), as in the prefix cache: a hit is
    faster, so a shared cache told one key which images another had just sent. A key is also
    the model's (`namespace`) and the image's content hash, which covers the processing that
    shaped its pixels: the same bytes at another detail are other bytes to the processor, so
    request preparation hashes the image as processed (prep/).

    `covered[i]` > 0: image i lies inside a reused prefix, its features are never read (the KV
    of its positions comes from the cache), so zeros of that many tokens stand in for them.
    """
    import mlx.core as mx

    if len(hashes) == 0:
        return None
    images = images or _family_images(model, pixel_values, kwargs)
    if images is None or images.count != len(hashes):
        return None
    if not images.one_run_per_image:
        covered = ()
    features: list[Any] = [None] * len(hashes)
    misses = []
    for index, content_hash in enumerate(hashes):
        if index < len(covered) and covered[index] > 0:
            continue
        found = cache.get(f"{partition}\0{content_hash}")
        if (
            found is None
            and cache.disk is not None
            and (found := cache.disk.get(partition, content_hash)) is not None
        ):
            cache.put(f"{partition}\0{content_hash}", found)
        if found is None:
            misses.append(index)
        else:
            cache.hits += 1
            features[index] = found
    if misses:
        encoded = images.encode(misses)
        mx.eval(encoded)
        cache.encoded += len(misses)
        for index, found in zip(misses, encoded, strict=True):
            cache.put(f"{partition}\0{hashes[index]}", found)
            if cache.disk is not None:
                cache.disk.put(partition, hashes[index], found)
            features[index] = found
    for index, found in enumerate(features):
        if found is None:
            features[index] = images.stand_in(covered[index])
    return images.join(features)


# Qwen3-VL: its tower returns deepstack features beside the merged ones (fed to the first decoder
# layers at the image positions), and mlx-vlm's cached-features path drops them, so its
# embeddings are assembled here from both, kept per image as one array [1 + levels, tokens, width].
_DEEPSTACK = frozenset({"qwen3_vl", "qwen3_vl_moe"})


def embed_with_deepstack(
    model: Any,
    cache: VisionFeatureCache,
    input_ids: Any,
    pixel_values: Any,
    kwargs: dict[str, Any],
    hashes: Sequence[str],
    *,
    partition: str,
    covered: Sequence[int] = (),
) -> Any | None:
    """Qwen3-VL's input embeddings (mlx-vlm's `InputEmbeddingsFeatures`) with each image's
    features and deepstack features through the cache, computed as mlx-vlm's
    `get_input_embeddings` computes them; None for any other model or inputs (videos)."""
    import mlx.core as mx
    from mlx_vlm.models.base import InputEmbeddingsFeatures

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    grids = kwargs.get("image_grid_thw")
    if model_type not in _DEEPSTACK or grids is None or kwargs.get("pixel_values_videos") is not None:
        return None
    images = _qwen_style(model, model_type, pixel_values, grids)
    if images is None:
        return None
    config = model.config
    stacked = encode_images(
        model, cache, pixel_values, kwargs, hashes, partition=partition, covered=covered, images=images
    )
    if stacked is None:
        return None
    embeds = model.language_model.model.embed_tokens(input_ids)
    image_mask = input_ids == config.image_token_index
    embeds = _masked_scatter(embeds, mx.broadcast_to(image_mask[..., None], embeds.shape), stacked[0])
    # Images only (no video): mlx-vlm's merge of image and video deepstack is the image levels.
    deepstack = [stacked[level] for level in range(1, stacked.shape[0])]
    mx.eval(deepstack)
    position_ids, rope_deltas = model.language_model.get_rope_index(
        input_ids, grids, None, kwargs.get("mask")
    )
    return InputEmbeddingsFeatures(
        inputs_embeds=embeds,
        visual_pos_masks=image_mask | (input_ids == config.video_token_index),
        deepstack_visual_embeds=deepstack,  # type: ignore[arg-type]  # a list of levels, as mlx-vlm passes it
        position_ids=position_ids,
        rope_deltas=rope_deltas,
    )


def _masked_scatter(target: Any, mask: Any, source: Any) -> Any:
    from mlx_vlm.models.qwen3_vl import qwen3_vl

    return qwen3_vl.masked_scatter(target, mask, source)


def _family_images(model: Any, pixel_values: Any, kwargs: dict[str, Any]) -> FamilyImages | None:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in _QWEN_STYLE and kwargs.get("image_grid_thw") is not None:
        return _qwen_style(model, model_type, pixel_values, kwargs["image_grid_thw"])
    if model_type == "gemma3" and getattr(pixel_values, "ndim", 0) == 4:
        return _gemma3(model, pixel_values)
    if model_type == "gemma4" and kwargs.get("image_position_ids") is None:
        return _gemma4(model, pixel_values)
    if model_type == "llava" and getattr(pixel_values, "ndim", 0) == 4:
        return _llava(model, pixel_values)
    if (
        model_type == "mistral3"
        and getattr(pixel_values, "ndim", 0) == 4
        and kwargs.get("image_sizes") is not None
    ):
        return _mistral3(model, pixel_values, kwargs["image_sizes"])
    return None


# Qwen-style inputs concatenate every image's patch rows; image i owns prod(image_grid_thw[i])
# rows. Each image is encoded alone, as the tower itself does (attention within an image only),
# and its features are one run of rows. Qwen3-VL is not one of these: its tower also returns
# deepstack features, which mlx-vlm's cached path drops (Qwen3.5's tower returns none it uses).
# GLM-4V (4.1V, 4.5V, 4.6V) takes the same inputs and the same cached-features path.
_QWEN_STYLE = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_5", "qwen3_5_moe", "glm4v", "glm4v_moe"})


def _qwen_style(model: Any, model_type: str, pixel_values: Any, grids: Any) -> FamilyImages | None:
    import mlx.core as mx

    rows = [int(t * h * w) for t, h, w in grids.tolist()]
    if sum(rows) != int(pixel_values.shape[0]):
        return None
    starts = [sum(rows[:index]) for index in range(len(rows))]
    dtype = model.vision_tower.patch_embed.proj.weight.dtype
    returns_pair = model_type in ("qwen3_5", "qwen3_5_moe")  # (features, deepstack it ignores)
    deepstack = model_type in _DEEPSTACK  # (features, deepstack levels), kept stacked

    def encode(indices: list[int]) -> list[Any]:
        out = []
        for index in indices:
            pixels = pixel_values[starts[index] : starts[index] + rows[index]].astype(dtype)
            if deepstack:
                found, levels = model.vision_tower(pixels, grids[index : index + 1])
                found = mx.stack([found, *levels])
            elif returns_pair:
                found, _ = model.vision_tower(pixels, grids[index : index + 1])
            else:
                found = model.vision_tower(pixels, grids[index : index + 1], output_hidden_states=False)
            out.append(found)
        return out

    if deepstack:
        levels = 1 + len(model.vision_tower.deepstack_visual_indexes)
        return FamilyImages(
            len(rows),
            encode,
            lambda tokens: mx.zeros((levels, tokens, _feature_width(model)), dtype=dtype),
            lambda features: mx.concatenate(features, axis=1) if len(features) > 1 else features[0],
        )
    return FamilyImages(
        len(rows),
        encode,
        lambda tokens: mx.zeros((tokens, _feature_width(model)), dtype=dtype),
        lambda features: mx.concatenate(features, axis=0) if len(features) > 1 else features[0],
    )


def _gemma3(model: Any, pixel_values: Any) -> FamilyImages:
    """Gemma 3: images of one size [n, 3, H, W]; features [n, tokens, width], after the
    projector. The images still to encode run together, as mlx-vlm's own call runs them (so a
    request with none cached computes exactly what mlx-vlm computes)."""
    import mlx.core as mx

    dtype = model.language_model.model.embed_tokens.weight.dtype

    def encode(indices: list[int]) -> list[Any]:
        pixels = _rows(pixel_values, indices).transpose(0, 2, 3, 1).astype(dtype)
        hidden, _, _ = model.vision_tower(pixels, output_hidden_states=True)
        projected = model.multi_modal_projector(hidden)
        return [projected[row : row + 1] for row in range(len(indices))]

    return FamilyImages(
        int(pixel_values.shape[0]),
        encode,
        lambda tokens: mx.zeros((1, tokens, _feature_width(model)), dtype=dtype),
        lambda features: mx.concatenate(features, axis=0),
    )


def _gemma4(model: Any, pixel_values: Any) -> FamilyImages | None:
    """Gemma 4: images of different sizes as a list (each runs alone, as in mlx-vlm), of one size
    as [n, 3, H, W] (those still to encode run together, as mlx-vlm runs them: one run of their
    tokens, an equal share each); features [1, tokens, width] after `embed_vision`."""
    import mlx.core as mx

    if not isinstance(pixel_values, list) and getattr(pixel_values, "ndim", 0) != 4:
        return None
    dtype = model.language_model.model.embed_tokens.weight.dtype
    width = _feature_width(model)

    def encode(indices: list[int]) -> list[Any]:
        if isinstance(pixel_values, list):
            return [model.encode_image(_one(pixel_values[index])) for index in indices]
        joined = model.encode_image(_rows(pixel_values, indices))
        share = int(joined.shape[1]) // len(indices)
        return [joined[:, row * share : (row + 1) * share] for row in range(len(indices))]

    return FamilyImages(
        len(pixel_values) if isinstance(pixel_values, list) else int(pixel_values.shape[0]),
        encode,
        lambda tokens: mx.zeros((1, tokens, width), dtype=dtype),
        lambda features: mx.concatenate(features, axis=1),
    )


def _llava(model: Any, pixel_values: Any) -> FamilyImages:
    """LLaVA 1.5: images of one size [n, 3, H, W]; features [n, tokens, width]: the chosen
    layer(s) of the CLIP tower without its class token, through the projector (mlx-vlm's own
    steps, which its cached path skips). The images still to encode run together, as in mlx-vlm."""
    import mlx.core as mx

    layer = model.vision_feature_layer
    default = model.vision_feature_select_strategy == "default"

    def encode(indices: list[int]) -> list[Any]:
        *_, hidden_states = model.vision_tower(
            _rows(pixel_values, indices).transpose(0, 2, 3, 1), output_hidden_states=True
        )
        chosen = [hidden_states[index] for index in ([layer] if isinstance(layer, int) else layer)]
        if default:
            chosen = [states[:, 1:] for states in chosen]
        projected = model.multi_modal_projector(
            chosen[0] if isinstance(layer, int) else mx.concatenate(chosen, axis=-1)
        )
        return [projected[row : row + 1] for row in range(len(indices))]

    return FamilyImages(
        int(pixel_values.shape[0]),
        encode,
        lambda tokens: mx.zeros(
            (1, tokens, _feature_width(model)), dtype=model.language_model.model.embed_tokens.weight.dtype
        ),
        lambda features: mx.concatenate(features, axis=0),
    )


def _mistral3(model: Any, pixel_values: Any, image_sizes: Any) -> FamilyImages:
    """Mistral 3 (Pixtral): images padded to one size [n, 3, H, W] with their own sizes; features
    one run of rows [tokens, width] for all images, (h / patch / merge) x (w / patch / merge) an
    image, after the patch merger and projector (mlx-vlm's steps, which its cached path skips).
    The images still to encode run together, as in mlx-vlm. An image's placeholders come in rows,
    so no image is taken as covered by a reused prefix (their features are all computed)."""
    import mlx.core as mx

    step = model.config.vision_config.patch_size * model.config.spatial_merge_size
    counts = [(int(h) // step) * (int(w) // step) for h, w in image_sizes.tolist()]

    def encode(indices: list[int]) -> list[Any]:
        sizes = _rows(image_sizes, indices)
        *_, hidden_states = model.vision_tower(
            _rows(pixel_values, indices).transpose(0, 2, 3, 1), output_hidden_states=True, image_sizes=sizes
        )
        chosen = hidden_states[model.vision_feature_layer]
        if chosen.ndim == 3 and chosen.shape[0] == 1:
            chosen = chosen.squeeze(0)
        projected = model.multi_modal_projector(chosen, sizes)
        projected = projected.squeeze(0) if projected.ndim == 3 else projected
        ends = [sum(counts[i] for i in indices[: j + 1]) for j in range(len(indices))]
        if int(projected.shape[0]) != ends[-1]:
            raise ValueError("Mistral 3's features do not split by its image sizes")
        return [projected[end - counts[i] : end] for end, i in zip(ends, indices, strict=True)]

    return FamilyImages(
        len(counts),
        encode,
        lambda tokens: mx.zeros((tokens, _feature_width(model))),  # never: no image is covered
        lambda features: mx.concatenate(features, axis=0),
        one_run_per_image=False,
    )


def _rows(array: Any, indices: list[int]) -> Any:
    """These rows of a batch (the batch itself when all of them, as mlx-vlm passes it)."""
    import mlx.core as mx

    return array if indices == list(range(int(array.shape[0]))) else array[mx.array(indices)]


def _one(image: Any) -> Any:
    import mlx.core as mx

    image = image if isinstance(image, mx.array) else mx.array(image)
    return image[None] if image.ndim == 3 else image


def _feature_width(model: Any) -> int:
    """The features' width: the language model's hidden size (after any projector)."""
    text = getattr(getattr(model, "config", None), "text_config", None)
    width = getattr(text, "hidden_size", None)
    if not isinstance(width, int):
        raise ValueError("the model's text config has no hidden size")
    return width

"""Tiled images through the vision cache (vision_cache.py): Idefics3 / SmolVLM and Llama 4.

Their processors cut each image into tiles (Idefics3: a grid of crops and a global view; Llama 4:
a grid of crops) and hand the model one batch of every image's tiles, with no per-image count. The
prompt says it: the processor writes one run of placeholders per tile, in the tiles' order, inside
the image's block (Idefics3: the block ends with the run after `<global-img>`; Llama 4: between
`<|image_start|>` and `<|image_end|>`). So an image's tiles are read off the prompt, its features
are those tiles' features, and its key is its content hash with the processing that shaped it:
its block's tokens (the tile grid), the tiles' size and, for Idefics3, each tile's unpadded area
(`pixel_attention_mask`; padding shows in the features).

An image's features are mlx-vlm's own input embeddings of a prompt holding only its tiles'
placeholders (`get_input_embeddings` on those tiles): mlx-vlm's steps, not a copy of them. The
images still to encode run together, as mlx-vlm runs a request's tiles together, so a request with
nothing cached computes exactly what mlx-vlm computes.

mlx-vlm 0.7.10's Llama 4 image processor keeps no pixels for the global view its prompt writes
(an image of several tiles has one placeholder run more than it has tiles), and its embedding
gathers features by placeholder count, so the global view's placeholders read the next image's
features (past the last image, whatever the gather returns). The features are assembled here as
mlx-vlm assembles them, so the output is mlx-vlm's either way; an image's tile count is whichever
of "one per run" (transformers' processor, which keeps the global view) and "one per run but the
global view" adds up to the tiles the processor made.

An image whose whole block lies inside a reused prefix is covered: its features are never read
(the KV of its positions comes from the prefix cache), so zeros stand in for them and its tiles are
neither encoded nor looked up.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vlmserve.engine.loop.vision_cache import FamilyImages, VisionFeatureCache, encode_images
from vlmserve.engine.prep.clip_inputs import token_runs

__all__ = ["embed_tiled", "tiled_blocks"]

TILED = frozenset({"idefics3", "llama4"})


@dataclass(frozen=True, slots=True)
class _Tiled:
    """A request's images as tiles: image i owns tiles[i] tiles (consecutive in the processor's
    batch) and tokens[i] placeholder tokens' features; keys[i] is the cache's key for it."""

    tiles: list[int]
    tokens: list[int]
    keys: list[str]
    # Where each image's block ends in the prompt (exclusive): covered by a prefix this long.
    ends: list[int]


def embed_tiled(
    model: Any,
    cache: VisionFeatureCache,
    input_ids: Any,
    pixel_values: Any,
    kwargs: dict[str, Any],
    hashes: Sequence[str],
    *,
    partition: str,
    processor: Any,
    covered_tokens: int = 0,
) -> Any | None:
    """Idefics3's or Llama 4's input embeddings (mlx-vlm's `InputEmbeddingsFeatures`) with each
    image's tiles' features through the cache; None for any other model, or when the prompt's
    tiles do not add up to the processor's (then mlx-vlm's own path runs). `covered_tokens`: the
    first prompt tokens whose KV comes from a cached prefix (images wholly inside are covered)."""
    from mlx_vlm.models.base import InputEmbeddingsFeatures

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in TILED or not hashes:
        return None
    ids = [int(token) for token in input_ids[0].tolist()]
    tiled = (
        _idefics3_tiles(model, processor, ids, pixel_values, kwargs, hashes)
        if model_type == "idefics3"
        else _llama4_tiles(model, processor, ids, pixel_values, hashes)
    )
    if tiled is None:
        return None
    features = encode_images(
        model,
        cache,
        pixel_values,
        kwargs,
        tiled.keys,
        partition=partition,
        covered=[
            tokens if end <= covered_tokens else 0
            for tokens, end in zip(tiled.tokens, tiled.ends, strict=True)
        ],
        images=_images(model, model_type, pixel_values, kwargs, tiled),
    )
    if features is None:
        return None
    if model_type == "idefics3":  # mlx-vlm takes them as cached features
        return model.get_input_embeddings(input_ids, pixel_values, cached_image_features=features, **kwargs)
    embeds = model.language_model.model.embed_tokens(input_ids)
    return InputEmbeddingsFeatures(
        inputs_embeds=model._prepare_inputs_for_multimodal(features, embeds, input_ids)
    )


def _images(
    model: Any, model_type: str, pixel_values: Any, kwargs: dict[str, Any], tiled: _Tiled
) -> FamilyImages:
    """Features [tokens, width] an image: mlx-vlm's input embeddings of its tiles' placeholders."""
    import mlx.core as mx

    first = [sum(tiled.tiles[:index]) for index in range(len(tiled.tiles))]
    token_id = int(model.config.image_token_index if model_type == "llama4" else model.config.image_token_id)
    mask = kwargs.get("pixel_attention_mask")

    def encode(indices: list[int]) -> list[Any]:
        rows = [first[i] + tile for i in indices for tile in range(tiled.tiles[i])]
        every = rows == list(range(sum(tiled.tiles)))  # all of them: the arrays as mlx-vlm has them
        count = sum(tiled.tokens[i] for i in indices)
        placeholders = mx.full((1, count), token_id, dtype=mx.int32)
        if model_type == "idefics3":  # [1, tiles, 3, h, w], its mask [1, tiles, h, w]
            taken = mx.array(rows)
            extra = {} if mask is None else {"pixel_attention_mask": mask if every else mask[:, taken]}
            pixels = pixel_values if every else pixel_values[:, taken]
        else:  # [tiles, 3, h, w]
            extra, pixels = {}, pixel_values if every else pixel_values[mx.array(rows)]
        embeds = model.get_input_embeddings(placeholders, pixels, **extra).inputs_embeds[0]
        ends = [sum(tiled.tokens[i] for i in indices[: j + 1]) for j in range(len(indices))]
        return [embeds[end - tiled.tokens[i] : end] for end, i in zip(ends, indices, strict=True)]

    embed_tokens = (
        model.language_model.embed_tokens
        if model_type == "idefics3"
        else model.language_model.model.embed_tokens
    )
    width, dtype = int(embed_tokens.weight.shape[-1]), embed_tokens.weight.dtype
    return FamilyImages(
        len(tiled.tiles),
        encode,
        lambda tokens: mx.zeros((tokens, width), dtype=dtype),
        lambda features: mx.concatenate(features, axis=0),
    )


def _runs(ids: Sequence[int], token_id: int) -> list[tuple[int, int]]:
    return list(token_runs(ids, token_id))


def _key(content_hash: str, *shaping: object) -> str:
    """The image's cache key: its content hash and what the processor made of it."""
    return hashlib.sha256(f"{content_hash}\0{shaping!r}".encode()).hexdigest()


Run = tuple[int, int]  # (start, length) of a run of placeholder tokens


def tiled_blocks(
    model_type: str, processor: Any, ids: Sequence[int], image_token_id: int
) -> list[list[Run]] | None:
    """Each image's placeholder runs, in prompt order, for the families whose image is several
    runs: Idefics3 (a run a tile: an image's runs up to the one after `<global-img>`, its global
    view), Llama 4 (a run a tile: the runs between its `<|image_start|>` and `<|image_end|>`) and
    Mistral 3 (a run a row: its runs up to the one before `[IMG_END]`); None for any other (an
    image is one run there) or where the markers are not the processor's."""
    tokenizer = getattr(processor, "tokenizer", processor)
    runs = _runs(ids, image_token_id)
    if model_type == "idefics3":
        global_id = tokenizer.convert_tokens_to_ids(getattr(processor, "global_image_tag", "<global-img>"))
        if not isinstance(global_id, int):
            return None
        blocks: list[list[Run]] = [[]]
        for start, length in runs:
            blocks[-1].append((start, length))
            if start > 0 and ids[start - 1] == global_id:
                blocks.append([])
        return blocks[:-1] if not blocks[-1] else blocks
    if model_type == "mistral3":
        end_id = tokenizer.convert_tokens_to_ids(getattr(processor, "image_end_token", "[IMG_END]"))
        if not isinstance(end_id, int):
            return None
        rows: list[list[Run]] = [[]]
        for start, length in runs:
            rows[-1].append((start, length))
            if start + length < len(ids) and ids[start + length] == end_id:
                rows.append([])
        return rows[:-1] if not rows[-1] else rows
    if model_type == "llama4":
        begin = tokenizer.convert_tokens_to_ids(getattr(processor, "start_of_img_token", "<|image_start|>"))
        end = tokenizer.convert_tokens_to_ids(getattr(processor, "end_of_img_token", "<|image_end|>"))
        if not isinstance(begin, int) or not isinstance(end, int):
            return None
        starts = [index for index, token in enumerate(ids) if token == begin]
        ends = [index for index, token in enumerate(ids) if token == end]
        if len(ends) != len(starts):
            return None
        return [
            [run for run in runs if first < run[0] < stop] for first, stop in zip(starts, ends, strict=True)
        ]
    return None


def _idefics3_tiles(
    model: Any,
    processor: Any,
    ids: list[int],
    pixel_values: Any,
    kwargs: dict[str, Any],
    hashes: Sequence[str],
) -> _Tiled | None:
    if getattr(pixel_values, "ndim", 0) != 5 or int(pixel_values.shape[0]) != 1:
        return None
    blocks = tiled_blocks("idefics3", processor, ids, int(model.config.image_token_id))
    tiles = [len(block) for block in blocks or ()]
    if blocks is None or len(blocks) != len(hashes) or sum(tiles) != int(pixel_values.shape[1]):
        return None
    mask = kwargs.get("pixel_attention_mask")
    areas = mask[0].sum(axis=(-1, -2)).tolist() if mask is not None else []
    size = tuple(int(side) for side in pixel_values.shape[-2:])
    keys, first = [], 0
    for content_hash, block, count in zip(hashes, blocks, tiles, strict=True):
        grid = ids[block[0][0] : block[-1][0] + block[-1][1]]
        keys.append(_key(content_hash, "idefics3", size, grid, areas[first : first + count]))
        first += count
    tokens = [sum(length for _, length in block) for block in blocks]
    return _Tiled(tiles, tokens, keys, [block[-1][0] + block[-1][1] for block in blocks])


def _llama4_tiles(
    model: Any, processor: Any, ids: list[int], pixel_values: Any, hashes: Sequence[str]
) -> _Tiled | None:
    """An image's tiles are one per run, or one per run but the global view's (see the module
    docstring)."""
    if getattr(pixel_values, "ndim", 0) != 4:
        return None
    blocks = tiled_blocks("llama4", processor, ids, int(model.config.image_token_index))
    if (
        blocks is None
        or len(blocks) != len(hashes)
        or any(not block or len({length for _, length in block}) != 1 for block in blocks)
    ):
        return None
    total = int(pixel_values.shape[0])
    with_global = [len(block) for block in blocks]
    without_global = [count - 1 if count > 1 else 1 for count in with_global]
    tiles = with_global if sum(with_global) == total else without_global
    if sum(tiles) != total:
        return None
    size = tuple(int(side) for side in pixel_values.shape[-2:])
    # The block's tokens from the first run to the last: its tile grid (the separators between).
    keys = [
        _key(content_hash, "llama4", size, ids[block[0][0] : block[-1][0] + block[-1][1]])
        for content_hash, block in zip(hashes, blocks, strict=True)
    ]
    tokens = [count * block[0][1] for count, block in zip(tiles, blocks, strict=True)]
    return _Tiled(tiles, tokens, keys, [block[-1][0] + block[-1][1] for block in blocks])

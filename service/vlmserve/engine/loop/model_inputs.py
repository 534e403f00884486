"""A prepared request -> the arrays the language model takes (generation thread only).

Takes the token ids and processor arrays that request preparation made off this thread, gets
the input embeddings with the vision features (from the vision cache when every image is
known), and records where each image's and clip's tokens sit, keyed by its content hash, so the
prefix cache can match prompts that hold images, video and audio.

Clips of the families whose vision tower the cache serves (Qwen2-VL, Qwen2.5-VL, Qwen3.5) go
through it like images (a clip is its frames' patch rows and a grid, encoded on its own).
mlx-vlm's Qwen2-VL and Qwen3.5 take images or videos in one request, not both (they encode
`pixel_values` when there are images, the videos only when there are none): with both, the
clips' placeholders are handed to them as image placeholders with every vision block's grid in
prompt order, which is the same computation (the same tower per block, the same M-RoPE rule for
image and video blocks), and the features come from the cache in prompt order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vlmserve.engine.jobs import PreparedRequest
from vlmserve.engine.loop.vision_cache import VisionFeatureCache, embed_with_deepstack, encode_images
from vlmserve.engine.loop.vision_tiles import embed_tiled, tiled_blocks
from vlmserve.engine.model import LoadedModel
from vlmserve.engine.prep.clip_inputs import token_runs
from vlmserve.engine.prep.image_inputs import image_inputs_for

__all__ = ["ImageSpan", "ModelInputs", "build_model_inputs"]


@dataclass(frozen=True, slots=True)
class ImageSpan:
    """One image's placeholder tokens in a prompt: [start, start + length), and whose they are (a
    tiled image's: its tiles' runs and the markup between them)."""

    start: int
    length: int
    content_hash: str
    kind: str = "image"  # "image" | "video" | "audio"


@dataclass(slots=True)
class ModelInputs:
    token_ids: tuple[int, ...]
    image_spans: tuple[ImageSpan, ...]
    input_ids: Any  # mx.array [1, n]
    embeds: Any  # mx.array [1, n, hidden]; None once the prompt is prefilled
    # Passed with every prefill chunk (M-RoPE position_ids, grids, ...).
    prefill_kwargs: dict[str, Any]
    # Qwen2-VL's M-RoPE offset of generated positions, [1, 1]; None for plain RoPE models.
    rope_deltas: Any

    def release_prompt(self) -> None:
        self.embeds = None
        self.prefill_kwargs = {}


def image_spans(
    token_ids: Sequence[int], image_token_id: int | None, hashes: Sequence[str]
) -> tuple[ImageSpan, ...]:
    """The i-th run of image placeholder tokens belongs to the i-th image."""
    if image_token_id is None or not hashes:
        return ()
    # The hashes first: the scan stops at the last image's run (and with fewer runs than
    # images, at the last run).
    runs = token_runs(token_ids, image_token_id)
    return tuple(
        ImageSpan(start, length, content_hash)
        for content_hash, (start, length) in zip(hashes, runs, strict=False)
    )


def prompt_image_spans(loaded: LoadedModel, request: PreparedRequest) -> tuple[ImageSpan, ...]:
    """Every image's and clip's placeholder runs, in prompt order. A tiled image (Idefics3, Llama
    4: a run a tile) spans its block, from its first run to its last (vision_tiles.py)."""
    hashes = [image.content_hash for image in request.images]
    token_id = _image_token_id(loaded) if request.images else None
    model_type = getattr(getattr(loaded.model, "config", None), "model_type", "")
    blocks = (
        tiled_blocks(str(model_type), loaded.processor, request.prompt_ids, token_id)
        if token_id is not None
        else None
    )
    if blocks is not None and len(blocks) == len(hashes) and all(blocks):
        images: tuple[ImageSpan, ...] = tuple(
            ImageSpan(block[0][0], block[-1][0] + block[-1][1] - block[0][0], content_hash)
            for content_hash, block in zip(hashes, blocks, strict=True)
        )
    else:
        images = image_spans(request.prompt_ids, token_id, hashes)
    clips = [
        ImageSpan(start, length, clip.content_hash, clip.kind)
        for clip in request.clips
        for start, length in clip.spans
    ]
    return tuple(sorted((*images, *clips), key=lambda span: span.start))


def _image_token_id(loaded: LoadedModel) -> int | None:
    """The image placeholder the prompt was prepared with (prep/image_inputs.py, from the
    processor). Not the model config's `image_token_id`: Gemma 3, LLaVA and Mistral 3 configs name
    it `image_token_index`, and Llama 4's keeps a default `image_token_id` beside the real index,
    so their prompts had no image spans and a prompt with another image behind the same text
    reused the first one's KV."""
    adapter = image_inputs_for(loaded.processor, loaded.tokenizer)
    return adapter.image_token_id if adapter is not None else None


def build_model_inputs(
    loaded: LoadedModel,
    request: PreparedRequest,
    spans: tuple[ImageSpan, ...],
    *,
    vision_cache: VisionFeatureCache | None,
    covered_tokens: int = 0,
) -> ModelInputs:
    """Token ids and image arrays (prepared off this thread, `prep/preparer.py`) -> MLX arrays,
    the input embeddings with the vision features; `spans` (`prompt_image_spans`) says where each
    image's tokens sit.

    `covered_tokens`: the first prompt tokens whose KV comes from elsewhere (a cached prefix):
    images wholly inside them are not run through the vision tower (their embedding positions
    are never computed again)."""
    import mlx.core as mx

    model = loaded.model
    token_ids = request.prompt_ids
    input_ids = mx.array([token_ids])
    extra: dict[str, Any] = {
        # An object array holds differently shaped images (prep/image_inputs.py): a list of them.
        key: [mx.array(item) for item in value] if value.dtype == object else mx.array(value)
        for key, value in request.image_arrays().items()
    }
    pixel_values = extra.pop("pixel_values", None)
    hashes = [image.content_hash for image in request.images]
    image_only = [span for span in spans if span.kind == "image"]
    covered = [span.length if span.start + span.length <= covered_tokens else 0 for span in image_only]
    features = None
    if pixel_values is not None and vision_cache is not None:
        features = encode_images(
            model,
            vision_cache,
            pixel_values,
            extra,
            hashes,
            partition=request.partition_key,
            covered=covered if len(image_only) == len(hashes) else (),
        )
    embed_ids = input_ids
    clip_features = _cached_video_features(model, request, extra, vision_cache, covered_tokens)
    if clip_features is not None and pixel_values is None:
        features = clip_features  # mlx-vlm's Qwen2-VL takes cached features for a video alone
    elif clip_features is not None and features is not None:
        features, embed_ids = _as_images(model, spans, extra, features, clip_features, input_ids)
        pixel_values = extra.pop("pixel_values_videos")
    if features is not None:
        extra["cached_image_features"] = features
    mask = mx.ones(input_ids.shape, dtype=mx.int32)
    embedding = None
    if features is None and clip_features is None and pixel_values is not None and vision_cache is not None:
        # Qwen3-VL: its deepstack features through the cache too (vision_cache.py)
        embedding = embed_with_deepstack(
            model,
            vision_cache,
            input_ids,
            pixel_values,
            {**extra, "mask": mask},
            hashes,
            partition=request.partition_key,
            covered=covered if len(image_only) == len(hashes) else (),
        )
        if embedding is None:  # Idefics3, Llama 4: each image's tiles through it (vision_tiles.py)
            embedding = embed_tiled(
                model,
                vision_cache,
                input_ids,
                pixel_values,
                extra,
                hashes,
                partition=request.partition_key,
                processor=loaded.processor,
                covered_tokens=covered_tokens,
            )
    if embedding is None:
        embedding = model.get_input_embeddings(embed_ids, pixel_values, mask=mask, **extra)
    extra.pop("cached_image_features", None)
    derived = {k: v for k, v in embedding.to_dict().items() if k != "inputs_embeds" and v is not None}
    if "position_ids" not in derived and _model_type(model) in _STASHED_POSITIONS:
        derived |= _stashed_positions(model, input_ids, extra, mask)
    return ModelInputs(
        token_ids=token_ids,
        image_spans=spans,
        input_ids=input_ids,
        embeds=embedding.inputs_embeds,
        prefill_kwargs={**extra, **derived},
        rope_deltas=derived.get("rope_deltas"),
    )


# mlx-vlm's GLM-4V keeps a prompt's M-RoPE positions on the model (`_position_ids`,
# `_rope_deltas`, set by `get_input_embeddings`) instead of returning them as Qwen's do, so
# requests in flight together would read the last one's positions. They are computed here per
# request, as mlx-vlm computes them, and carried with it like Qwen's (prefill chunks and shared
# prompt forwards take them explicitly, decode steps its `rope_deltas`).
_STASHED_POSITIONS = frozenset({"glm4v", "glm4v_moe"})


def _model_type(model: Any) -> str | None:
    return getattr(getattr(model, "config", None), "model_type", None)


def _stashed_positions(model: Any, input_ids: Any, extra: dict[str, Any], mask: Any) -> dict[str, Any]:
    language_model = model.language_model
    position_ids, rope_deltas = language_model.get_rope_index(
        input_ids, extra.get("image_grid_thw"), extra.get("video_grid_thw"), mask
    )
    # Its decode step reads the `rope_deltas` argument only once its own stash is set (a text
    # prompt with explicit positions never sets it); the argument then decides every position.
    if language_model._rope_deltas is None:
        language_model._rope_deltas = rope_deltas
    return {"position_ids": position_ids, "rope_deltas": rope_deltas}


def _cached_video_features(
    model: Any,
    request: PreparedRequest,
    extra: dict[str, Any],
    vision_cache: VisionFeatureCache | None,
    covered_tokens: int,
) -> Any | None:
    """Qwen2-style clips' features through the vision cache, in order (each clip by its content
    hash, sampling included); None where the family is not one (`encode_images` says)."""
    videos = [clip for clip in request.clips if clip.kind == "video"]
    pixels, grids = extra.get("pixel_values_videos"), extra.get("video_grid_thw")
    if vision_cache is None or not videos or pixels is None or grids is None:
        return None
    covered = [
        clip.token_count if all(start + length <= covered_tokens for start, length in clip.spans) else 0
        for clip in videos
    ]
    return encode_images(
        model,
        vision_cache,
        pixels,
        {"image_grid_thw": grids},
        [clip.content_hash for clip in videos],
        partition=request.partition_key,
        covered=covered,
    )


def _as_images(
    model: Any,
    spans: Sequence[ImageSpan],
    extra: dict[str, Any],
    image_features: Any,
    video_features: Any,
    input_ids: Any,
) -> tuple[Any, Any]:
    """Images and clips in one Qwen2-VL / Qwen3.5 request (see the module docstring): (the
    features in prompt order, the ids with clip placeholders as image placeholders); `extra`'s
    image grids become every vision block's grid in prompt order. A clip is one block (Qwen2-VL)
    or one per temporal group (Qwen3.5: a timestamp between; a group of grid (1, h, w), which the
    tower encodes and M-RoPE places as the clip's own rows)."""
    import mlx.core as mx

    ordered = [span for span in spans if span.kind in ("image", "video")]
    blocks: dict[str, list[Any]] = {}
    for kind, grids in (("image", extra.pop("image_grid_thw")), ("video", extra.pop("video_grid_thw"))):
        rows = [[int(n) for n in grid] for grid in grids.tolist()]
        count = sum(1 for span in ordered if span.kind == kind)
        if count == len(rows):
            blocks[kind] = rows
        elif count == sum(t for t, _, _ in rows):
            blocks[kind] = [[1, h, w] for t, h, w in rows for _ in range(t)]
        else:
            raise ValueError(f"{count} {kind} placeholder runs for the grids {rows}")
    sources = {"image": image_features, "video": video_features}
    rows_taken = {"image": 0, "video": 0}
    grids_taken = {"image": 0, "video": 0}
    features, grids_in_order = [], []
    for span in ordered:
        at, index = rows_taken[span.kind], grids_taken[span.kind]
        features.append(sources[span.kind][at : at + span.length])
        grids_in_order.append(blocks[span.kind][index])
        rows_taken[span.kind] += span.length
        grids_taken[span.kind] += 1
    extra["image_grid_thw"] = mx.array(grids_in_order, dtype=mx.int64)
    config = model.config
    ids = mx.where(input_ids == config.video_token_id, config.image_token_id, input_ids)
    return mx.concatenate(features, axis=0), ids

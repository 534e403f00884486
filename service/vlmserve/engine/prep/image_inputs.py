"""An image -> the model processor's arrays and its image-token count, per model family.

`ImageDetail` (OpenAI's `detail`) picks the resolution the model sees, in the processor's own
terms, so the answer depends on the family (the table in docs/images.md):

- dynamic resolution (Qwen2-VL, Qwen2.5-VL, Qwen3-VL: an image processor with `min_pixels` /
  `max_pixels`): `low` resizes to the processor's smallest pixel budget (`min_pixels`),
  `high` to its largest (`max_pixels`), `auto` (and unspecified) keeps the image's own size
  within those bounds, the processor's default. `original` is `auto`: the processor never
  goes past `max_pixels`.
- any other family (generic path): the processor's own default for every `detail`; families that
  can do better get an adapter here.

Also the size the engine needs to decode an image at (`decode_size`): big images are decoded
straight to about twice the processor's target side, never at full size for long.

No MLX: runs in request-preparation worker threads. Arrays are numpy, one image's rows each.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from vlmserve.common.images import ImageError
from vlmserve.engine.jobs import PreparedImage
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = [
    "DynamicResolution",
    "GenericProcessor",
    "ImageInputs",
    "ImageProcessorCall",
    "image_inputs_for",
    "run_processor",
]

_TEXT_KEYS = frozenset({"input_ids", "attention_mask", "token_type_ids"})


class ImageInputs(Protocol):
    """What every family's adapter tells request preparation."""

    @property
    def image_token_id(self) -> int:
        """The image token of the model's prompts."""
        ...

    def decode_size(self, width: int, height: int, detail: pb.ImageDetail.ValueType) -> tuple[int, int]:
        """The smallest (width, height) worth decoding an image of this size at."""
        ...


def _hash(content_hash: str, *sizing: object) -> str:
    """The hash of the pixels the model will see: the bytes' hash plus how they are sized."""
    return hashlib.sha256(f"{content_hash}:{':'.join(map(str, sizing))}".encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class DynamicResolution:
    """Qwen-VL image processors: a pixel budget between `min_pixels` and `max_pixels`."""

    image_processor: Any
    image_token_id: int

    @staticmethod
    def fits(image_processor: Any) -> bool:
        return all(
            hasattr(image_processor, name)
            for name in ("min_pixels", "max_pixels", "merge_size", "_resolved_size")
        )

    def pixel_bounds(self, detail: pb.ImageDetail.ValueType) -> tuple[int, int]:
        low, high = int(self.image_processor.min_pixels), int(self.image_processor.max_pixels)
        if detail == pb.IMAGE_DETAIL_LOW:
            return low, low
        if detail == pb.IMAGE_DETAIL_HIGH:
            return high, high
        return low, high

    def _target(self, width: int, height: int, detail: pb.ImageDetail.ValueType) -> tuple[int, int]:
        low, high = self.pixel_bounds(detail)
        try:
            target_h, target_w = self.image_processor._resolved_size(
                height, width, min_pixels=low, max_pixels=high
            )
        except ValueError:  # its one rule: an aspect ratio over 200:1
            raise ImageError(
                "the image's sides are too unequal for the model's image processor (over 200:1)"
            ) from None
        return int(target_w), int(target_h)

    def decode_size(self, width: int, height: int, detail: pb.ImageDetail.ValueType) -> tuple[int, int]:
        target_w, target_h = self._target(width, height, detail)
        return 2 * target_w, 2 * target_h

    def prepare(self, image: Any, detail: pb.ImageDetail.ValueType, content_hash: str) -> PreparedImage:
        low, high = self.pixel_bounds(detail)
        self._target(image.width, image.height, detail)  # refuses what the processor cannot size
        out = self.image_processor(images=[image], min_pixels=low, max_pixels=high)
        arrays = {key: np.asarray(value) for key, value in out.items()}
        grid = arrays["image_grid_thw"]
        tokens = int(np.prod(grid[0])) // int(self.image_processor.merge_size) ** 2
        return PreparedImage(content_hash=_hash(content_hash, low, high), token_count=tokens, arrays=arrays)


@dataclass(frozen=True, slots=True)
class GenericProcessor:
    """Any other processor: run on the whole prompt and all its images, as mlx-vlm runs it.

    Its text expansion (Gemma 3 wraps each image in newlines and markers, Idefics3 and Llama 4
    write tile grids, Mistral 3 image rows) is kept exactly; only its tokenizer call is swapped
    for the prompt tokenizer, so client text stays text. Arrays come for the request as a whole
    (`PreparedRequest.joint_arrays`): these processors pad or tile across a request's images.
    `detail` `low`, when every image of the request asks for it (the processor runs once for
    all of them), takes the family's cheaper view where it has one (`_low_detail`); any other
    `detail` is the processor's default.
    """

    processor: Any
    image_token_id: int

    def decode_size(self, width: int, height: int, detail: pb.ImageDetail.ValueType) -> tuple[int, int]:
        size = getattr(getattr(self.processor, "image_processor", None), "size", None)
        side = 0
        if isinstance(size, Mapping):
            sides = ("height", "width", "shortest_edge", "longest_edge")
            side = max((int(v) for k, v in size.items() if k in sides and isinstance(v, int)), default=0)
        elif isinstance(size, int):
            side = size
        if side <= 0:
            return width, height  # unknown: keep the full size
        scale = min(1.0, 2 * side / max(1, min(width, height)))
        return max(1, int(width * scale)), max(1, int(height * scale))

    def build(
        self,
        text: str,
        images: Sequence[Any],
        encode: Callable[[str, bool], list[int]],
        *,
        add_special_tokens: bool,
        low_detail: bool = False,
        media: Mapping[str, Any] | None = None,
    ) -> tuple[list[int], dict[str, np.ndarray]]:
        """(token ids, arrays) for the rendered prompt `text` and its decoded images (and clips:
        `media`, the processor's own keywords, `prep/clip_inputs.py`)."""
        image_processor = self.processor.image_processor
        if low_detail:
            image_processor = _low_detail(image_processor)
        return run_processor(
            self.processor,
            text,
            encode,
            add_special_tokens=add_special_tokens,
            images=images,
            image_processor=image_processor,
            media=media,
        )


def run_processor(
    processor: Any,
    text: str,
    encode: Callable[[str, bool], list[int]],
    *,
    add_special_tokens: bool,
    images: Sequence[Any] = (),
    image_processor: Any = None,
    media: Mapping[str, Any] | None = None,
) -> tuple[list[int], dict[str, np.ndarray]]:
    """The model's processor on the whole rendered prompt, as mlx-vlm's `process_inputs` runs it,
    its tokenizer call swapped for the prompt tokenizer (client text stays text): (token ids,
    arrays). `media`: further keywords the processor takes (`videos`, `fps`, `audio`, ...);
    `image_processor`: a replacement for the processor's own (None: its own)."""
    from mlx_vlm import utils

    process_inputs: Any = utils.process_inputs  # unannotated in mlx-vlm
    call = copy.copy(processor)  # private tokenizer and image-processor slots for this call
    call.tokenizer = _PromptTokenizerCall(processor.tokenizer, encode)
    call.image_processor = ImageProcessorCall(
        image_processor if image_processor is not None else processor.image_processor
    )
    extra = dict(media or {})
    for name in ("video_processor", "feature_extractor"):
        if name in extra:  # a component replaced for this call (Qwen2-VL's video processor)
            setattr(call, name, extra.pop(name))
    out = process_inputs(
        call,
        prompts=[text],
        images=list(images) or None,
        add_special_tokens=add_special_tokens,
        return_tensors="np",
        **extra,
    )
    if "images" in out and "pixel_values" not in out:
        out["pixel_values"] = out.pop("images")
    ids = [int(t) for t in np.asarray(out["input_ids"]).reshape(-1)]
    arrays = {
        key: _request_array(value)
        for key, value in out.items()
        if key not in _TEXT_KEYS and value is not None and not isinstance(value, str)
    }
    return ids, arrays


def _request_array(value: Any) -> np.ndarray:
    """One processor output as an array; a list of differently shaped images (Gemma 4 keeps each
    image's aspect ratio, and its vision tower takes such a list) as an object array of them."""
    if isinstance(value, (list, tuple)) and len({np.shape(item) for item in value}) > 1:
        ragged = np.empty(len(value), dtype=object)
        for index, item in enumerate(value):
            ragged[index] = np.asarray(item)
        return ragged
    return np.asarray(value)


def _low_detail(image_processor: Any) -> Any:
    """A copy of the image processor that looks at less, where the family has a knob for it.

    Idefics3 / SmolVLM: no tiles, the global image only. Llama 4: one tile. Pixtral (Mistral 3):
    half the longest edge. GLM-4V: its smallest pixel budget (its `size` edges are pixel counts,
    as Qwen's min/max pixels). Others (Gemma 3, a fixed token count per image): unchanged.
    """
    low = copy.copy(image_processor)
    size = getattr(low, "size", None)
    if type(image_processor).__name__.startswith("Glm4vImageProcessor") and size is not None:
        fewest = int(size.shortest_edge)
        low.size = {"shortest_edge": fewest, "longest_edge": fewest}
    elif getattr(low, "do_image_splitting", False):
        low.do_image_splitting = False
    elif isinstance(getattr(low, "max_patches", None), int) and low.max_patches > 1:
        low.max_patches = 1
    elif isinstance(size, Mapping) and isinstance(size.get("longest_edge"), int):
        patch = getattr(low, "patch_size", None)
        side = int(patch.get("height", 1)) if isinstance(patch, Mapping) else int(patch or 1)
        low.size = {**size, "longest_edge": max(side, size["longest_edge"] // 2)}
    return low


class ImageProcessorCall:
    """An image processor called with image arguments only.

    mlx-vlm's processors hand the text call's arguments (`padding`, ...) to the image processor
    too; transformers 5's image processors refuse arguments they do not know (LLaVA's CLIP
    processor: every image request failed). Everything else is delegated.
    """

    _TEXT_ARGUMENTS = frozenset({"padding", "padding_side", "truncation", "max_length", "add_special_tokens"})

    def __init__(self, image_processor: Any) -> None:
        self._image_processor = image_processor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._image_processor, name)

    def __call__(self, images: Any, *args: Any, **kwargs: Any) -> Any:
        kept = {key: value for key, value in kwargs.items() if key not in self._TEXT_ARGUMENTS}
        out = self._image_processor(images, *args, **kept)
        return _with_llama4_global_views(self._image_processor, images, out)


def _with_llama4_global_views(image_processor: Any, images: Any, out: Any) -> Any:
    """mlx-vlm 0.7.10's Llama 4 image processor with each image's global view put back.

    Its processor writes a global view's placeholders after the tiles of an image of several
    tiles (as transformers' does), but its image processor keeps only the tiles, so the model's
    embedding gathered those placeholders' features past the end of the image's (the next image's
    tiles, and past the last image memory it never wrote: NaN or noise, run to run). The global
    view is transformers' (the whole image at one tile's size, after the image's tiles), made with
    mlx-vlm's own resize and normalisation."""
    from mlx_vlm.models.llama4.processing_llama4 import Llama4ImageProcessor
    from PIL import Image

    if not isinstance(image_processor, Llama4ImageProcessor) or "aspect_ratios" not in out:
        return out
    flat = images if isinstance(images, list) else [images]
    tiles = list(out["pixel_values"])
    steps: Any = image_processor  # its methods are unannotated in mlx-vlm
    kept, taken = [], 0
    for image, (rows, columns) in zip(flat, out["aspect_ratios"], strict=True):
        kept += tiles[taken : taken + rows * columns]
        taken += rows * columns
        if rows * columns > 1:
            whole = image if isinstance(image, Image.Image) else Image.fromarray(np.uint8(image))
            kept.append(steps._preprocess_single(steps._split_into_tiles(whole, (1, 1))[0]))
    return {**out, "pixel_values": np.stack(kept)}


class _PromptTokenizerCall:
    """A tokenizer whose call goes through `encode` (client text as text); all else delegated."""

    def __init__(self, tokenizer: Any, encode: Callable[[str, bool], list[int]]) -> None:
        self._tokenizer = tokenizer
        self._encode = encode

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def __call__(self, text: Any = None, *args: Any, **kwargs: Any) -> Any:
        from transformers import BatchEncoding

        texts = [text] if isinstance(text, str) else list(text)
        add = bool(kwargs.get("add_special_tokens", True))
        ids = [self._encode(item, add) for item in texts]
        data = {"input_ids": ids, "attention_mask": [[1] * len(row) for row in ids]}
        tensors = kwargs.get("return_tensors")
        return BatchEncoding(data, tensor_type="np" if tensors is not None else None)


def image_inputs_for(processor: Any, tokenizer: Any) -> ImageInputs | None:
    """The adapter for a loaded processor; None when the model takes no images."""
    image_processor = getattr(processor, "image_processor", None)
    image_token = getattr(processor, "image_token", None)
    if image_processor is None or not isinstance(image_token, str):
        return None
    token_id = getattr(processor, "image_token_id", None)
    if not isinstance(token_id, int):
        token_id = tokenizer.convert_tokens_to_ids(image_token)
    if DynamicResolution.fits(image_processor):
        return DynamicResolution(image_processor=image_processor, image_token_id=int(token_id))
    return GenericProcessor(processor=processor, image_token_id=int(token_id))

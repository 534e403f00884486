"""Each model family's grounding convention: how the coordinates it writes relate to the
screenshot it saw (docs/models.md, "Computer use coordinates"). No MLX.

* `relative`: 0..1000 across the image whatever its size (Qwen2-VL, Qwen3-VL, GLM-4.5V/4.6V,
  and the default for families that document none);
* `resized_pixels`: absolute pixels of the image as the processor resized it (Qwen2.5-VL, whose
  processor's `smart_resize` decides that size; UI-TARS-1.5 is this architecture).

A `Space` is one screenshot (or the display before any) in both systems: `to_screen` and
`to_model` convert a point, both clamped to the screen, so a client always gets a pixel on
its real screen whatever size the model saw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["RELATIVE_SCALE", "Convention", "Space", "convention_for"]

RELATIVE_SCALE = 1000
ConventionKind = Literal["relative", "resized_pixels"]

# Families whose model cards document absolute pixels of the resized input.
_RESIZED_PIXEL_FAMILIES = frozenset({"qwen2_5_vl"})


@dataclass(frozen=True, slots=True)
class Space:
    """The screen (`width` x `height`) and the model's coordinate range for it (0..model_*)."""

    width: int
    height: int
    model_width: int
    model_height: int

    def to_screen(self, x: int, y: int) -> tuple[int, int]:
        return (_scale(x, self.model_width, self.width), _scale(y, self.model_height, self.height))

    def to_model(self, x: int, y: int) -> tuple[int, int]:
        return (_scale(x, self.width, self.model_width), _scale(y, self.height, self.model_height))

    def on_screen(self, x: int, y: int) -> bool:
        return 0 <= x < self.width and 0 <= y < self.height


def _scale(value: int, source: int, target: int) -> int:
    """`value` of 0..source-1 (or 0..source for the relative scale) -> 0..target-1, rounded."""
    scaled = math.floor(value * target / max(source, 1) + 0.5)
    return min(max(scaled, 0), max(target - 1, 0))


@dataclass(frozen=True, slots=True)
class Convention:
    kind: ConventionKind
    # `resized_pixels` only: the processor's resize (patch factor, pixel bounds).
    factor: int = 28
    min_pixels: int = 56 * 56
    max_pixels: int = 14 * 14 * 4 * 1280

    def space(self, width: int, height: int) -> Space:
        if self.kind == "relative":
            return Space(width, height, RELATIVE_SCALE, RELATIVE_SCALE)
        resized_height, resized_width = _smart_resize(
            height, width, self.factor, self.min_pixels, self.max_pixels
        )
        return Space(width, height, resized_width, resized_height)

    def describe(self, space: Space | None) -> str:
        """The sentence the tool's description gives the model about coordinates."""
        if self.kind == "relative":
            return (
                f"Coordinates are relative: x and y from 0 to {RELATIVE_SCALE} across the last "
                "screenshot, from its top-left corner."
            )
        if space is None:
            return "Coordinates are pixels of the last screenshot, from its top-left corner."
        return (
            f"Coordinates are pixels of the last screenshot ({space.model_width}x{space.model_height}), "
            "from its top-left corner."
        )


def _smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's processor resize (transformers' `smart_resize`, without its aspect check):
    sides rounded to `factor`, the area brought within [min_pixels, max_pixels]."""
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def convention_for(architecture: str, processor: Any = None) -> Convention:
    """The family's convention; `resized_pixels` reads the resize bounds off the processor."""
    if architecture not in _RESIZED_PIXEL_FAMILIES:
        return Convention("relative")
    images = getattr(processor, "image_processor", processor)
    patch = int(getattr(images, "patch_size", 14) or 14)
    merge = int(getattr(images, "merge_size", 2) or 2)
    defaults = Convention("resized_pixels")
    return Convention(
        "resized_pixels",
        factor=patch * merge,
        min_pixels=int(getattr(images, "min_pixels", None) or defaults.min_pixels),
        max_pixels=int(getattr(images, "max_pixels", None) or defaults.max_pixels),
    )

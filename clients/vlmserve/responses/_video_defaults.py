"""vLLM's top-level `mm_processor_kwargs` -> the sampling every video part of a request takes
unless it asks otherwise itself (docs/video-audio.md, Sampling)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._clip_models import MAX_FPS, MAX_FRAMES, MAX_PIXELS
from ._errors import InvalidRequestError
from ._json import join, type_name

__all__ = ["SAMPLING_KEYS", "VideoDefaults", "parse_mm_processor_kwargs"]


@dataclass(frozen=True)
class VideoDefaults:
    """The request's `mm_processor_kwargs` (vLLM's): sampling for every video part that does not
    say otherwise itself. None: the engine's default."""

    fps: float | None = None
    max_frames: int | None = None
    min_pixels: int | None = None
    max_pixels: int | None = None


# Key -> (bounds, integral): the keys `mm_processor_kwargs` may hold; anything else is a 400.
SAMPLING_KEYS: dict[str, tuple[float, float, bool]] = {
    "fps": (0.0, MAX_FPS, False),
    "max_frames": (1, MAX_FRAMES, True),
    "min_pixels": (1, MAX_PIXELS, True),
    "max_pixels": (1, MAX_PIXELS, True),
}


def parse_mm_processor_kwargs(
    value: Mapping[str, Any] | None, param: str = "mm_processor_kwargs"
) -> VideoDefaults:
    """vLLM's top-level `mm_processor_kwargs`: honoured keys only (a 400 naming any other: a
    setting silently ignored is how every clip came to cost 10,798 tokens, mlx-vlm #2050)."""
    if not value:
        return VideoDefaults()
    found: dict[str, Any] = {}
    for key, item in value.items():
        at = join(param, key)
        if key not in SAMPLING_KEYS:
            raise InvalidRequestError(
                f"Invalid value for '{at}': unknown key {json.dumps(key)[:80]}; supported: "
                f"{', '.join(SAMPLING_KEYS)}.",
                param=at,
                code="unknown_parameter",
            )
        low, high, integral = SAMPLING_KEYS[key]
        if isinstance(item, float) and integral and item.is_integer():
            item = int(item)
        number_ok = isinstance(item, int) if integral else isinstance(item, int | float)
        if isinstance(item, bool) or not number_ok:
            expected = "an integer" if integral else "a number"
            raise InvalidRequestError(
                f"Invalid type for '{at}': expected {expected}, got {type_name(item)}.",
                param=at,
                code="invalid_type",
            )
        if not (item > low if key == "fps" else item >= low) or item > high:
            bound = f"more than {low:g}" if key == "fps" else f"at least {low:g}"
            raise InvalidRequestError(
                f"Invalid value for '{at}': must be {bound} and at most {high:g}.", param=at
            )
        found[key] = item
    return VideoDefaults(**found)

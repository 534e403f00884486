"""The vision tower's transient memory per request: what admission reserves beside the KV for
the length of the request's prefill (memory_budget.py).

A prefill runs the vision tower over the request's images before its first chunk: patch
embeddings, each block's attention and MLP activations, the merged features. None of it outlives
the prefill, but a large screenshot's transient can exceed its whole KV cache, and it is what
takes a Mac down when several arrive together. Measured per family by bench/vision_memory.py
(MLX's peak memory around `get_input_embeddings`, on the fixtures, at five screenshot sizes) and
fitted in activation widths (transient bytes / (vision hidden size x dtype bytes)) as
per_image + linear x t + quadratic x t^2 for an image of t tokens, scaled to cover every measured
point. A width count carries over to the real model (its own hidden size and dtype) where a byte
count measured on a tiny fixture would not; families not measured take the largest terms.

Pure but for `vision_width` (reads a loaded model's configuration and weights).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FITTED", "VisionCost", "vision_cost", "vision_width"]


@dataclass(frozen=True)
class VisionCost:
    """An image of t tokens holds width_bytes x (per_image + linear x t + quadratic x t^2)
    bytes while the vision tower runs (the square: attention within the image)."""

    width_bytes: int  # vision hidden size x dtype bytes
    per_image: float
    linear: float
    quadratic: float

    def transient(self, image_tokens: Sequence[int]) -> int:
        """Bytes the vision tower holds at its peak for these images (one prefill's batch)."""
        widths = sum(self.per_image + self.linear * t + self.quadratic * t * t for t in image_tokens if t > 0)
        return math.ceil(widths * self.width_bytes)


# bench/results/vision-memory.json "fit" (per_image, linear, quadratic), CPU backend, mlx 0.32.4:
# least squares over 5 screenshot sizes (320x240 .. 1600x1000), scaled to cover every point.
FITTED: dict[str, tuple[float, float, float]] = {
    "qwen2_vl": (15224.0, 77.017, 0.27203),
    "qwen2_5_vl": (81628.8, 164.298, 1.12527),
    "qwen3_vl": (114446.4, 334.935, 1.10459),
    "qwen3_vl_moe": (86996.2, 398.588, 1.20071),
    "qwen3_5": (115076.9, 331.589, 1.11422),
    "qwen3_5_moe": (127469.6, 276.559, 1.15665),
    "mistral3": (23718.8, 106.579, 1.12624),
    # Fixed-size processors (one token count measured): the linear term alone.
    "gemma3": (0.0, 277.371, 0.0),
    "idefics3": (0.0, 289.713, 0.0),
}


def vision_cost(model_type: str, hidden_size: int, dtype_bytes: int) -> VisionCost:
    """The family's fitted cost at this model's width; a family not measured takes the largest
    of each term (an upper bound, not a guess below the measured ones)."""
    terms = FITTED.get(model_type) or tuple(max(fit[i] for fit in FITTED.values()) for i in range(3))
    return VisionCost(hidden_size * dtype_bytes, *terms)


def vision_width(model: Any) -> tuple[int, int]:
    """(vision hidden size, bytes per element of the vision tower's weights) of a loaded model."""
    from mlx.utils import tree_flatten

    vision = getattr(model.config, "vision_config", None)
    hidden = getattr(vision, "hidden_size", None) or getattr(vision, "embed_dim", None)
    if not isinstance(hidden, int) and isinstance(vision, dict):
        hidden = vision.get("hidden_size") or vision.get("embed_dim")
    tower = getattr(model, "vision_tower", None) or getattr(model, "vision_model", None)
    parameters: list[Any] = list(tree_flatten(tower.parameters())) if tower is not None else []
    floats = [value for _, value in parameters if "float" in str(value.dtype)]
    itemsize = int(floats[0].itemsize) if floats else 2
    return int(hidden or 0), itemsize

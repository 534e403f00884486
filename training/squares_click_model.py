"""The squares-click fixture's architecture (models/squares-click/README.md): the tiny Qwen3-VL
of the family fixtures (training/families/qwen.py) with four text layers, one vision block and
an image processor that brings every D x D screen (D in 112, 224, 336) to 128 x 128.

Why Qwen3-VL: its vision tower adds a learned absolute position embedding, interpolated to the
image's patch grid, to every patch before the blocks (mlx-vlm's `pos_embed` /
`fast_pos_embed_interpolate`), so an image token's features say where it is relative to the
image's extent — what a 0-1000 click needs. Qwen2-VL's tower has only 2-D rotary inside its
attention, and rotary position never reaches the values the text model reads, so a tiny qwen2_vl
could not find a square's cell (it stayed at chance).

At 128 x 128 with 16-px patches merged 2 x 2 a screen is 4 x 4 image tokens: one per cell of the
task's 4 x 4 grid, whatever D.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from training.media_model import build_small_qwen3_vl
from training.squares_click import draw_screen

SCREEN_PIXELS = 128 * 128
TEXT_LAYERS = 4
VISION_LAYERS = 1


def build_click_base(out_dir: Path, seed: int = 0) -> Path:
    """Write the untrained squares-click model (random weights) to `out_dir`; returns it."""
    build_small_qwen3_vl(
        out_dir,
        seed,
        text_layers=TEXT_LAYERS,
        vision_layers=VISION_LAYERS,
        processor_file="preprocessor_config.json",
        min_pixels=SCREEN_PIXELS,
        max_pixels=SCREEN_PIXELS,
    )
    # Greedy by default, as the other task fixtures: the SDK loops send no temperature, and the
    # family's default (0.7, top-k 20) would sample the click's digits.
    path = out_dir / "generation_config.json"
    generation = json.loads(path.read_text(encoding="utf-8"))
    for key in ("temperature", "top_k", "top_p"):
        generation.pop(key, None)
    generation["do_sample"] = False
    path.write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")
    return out_dir


def smooth_patch_filters(model: Any, scale: float) -> None:
    """Replace each random patch filter by its mean over the patch's pixels and frames (per output
    feature and colour channel), its weights' spread `scale` times the random ones', once, on
    fresh weights.

    With iid random weights per pixel, what a square's colour adds to a token depends on which of
    the patch's pixels it covers (a square lies anywhere in its cell), so the same colour gives
    unrelated features on different screens: a linear probe read a square token's colour right
    86 % of the time (between colour means 0.46 apart, spread within a colour 1.34). Smoothed,
    a filter sees the patch's mean colour (what a trained first layer's low-frequency filters
    do): the probe reads 98 %, the colour means 1.24 apart against a spread of 1.85 (mostly the
    cell: the position embedding, added after, is untouched). The filters stay random; nothing
    about the palette or the task is put in.
    """
    proj = model.vision_tower.patch_embed.proj
    weight = proj.weight.astype(mx.float32)  # (out, frames, height, width, channels)
    mean = weight.mean(axis=(1, 2, 3), keepdims=True)
    smoothed = mx.broadcast_to(mean * (scale * weight.std() / mean.std()), weight.shape)
    proj.weight = smoothed.astype(proj.weight.dtype)
    mx.eval(proj.weight)


def recentre_vision(model: Any, processor: Any, rng: random.Random, scale: float) -> dict[str, float]:
    """Rescale the vision mergers' outputs (the main one and deepstack's) to mean 0 and a mean
    norm of `scale` over the tokens of random screens, once, before training from fresh weights.

    Fresh, the mergers' outputs are dominated by one shared vector (~70 long against text
    embeddings of ~1.2; where a token is and whether it holds a square move it by 4 and 13): after
    the text model's RMSNorm a token's cell and colour are a few per cent of what attention reads,
    and the click's logits did not move with the screen at all after 200 steps. Adam moves each
    weight by about the learning rate a step, so unlearning that vector alone would take thousands
    of steps. Returns the spreads found (the README's figures).
    """
    screens = [draw_screen(rng).image for _ in range(16)]
    processed = processor.image_processor(images=screens)
    tower = model.vision_tower
    pixels = mx.array(np.asarray(processed["pixel_values"])).astype(tower.patch_embed.proj.weight.dtype)
    features, deepstack = tower(pixels, mx.array(np.asarray(processed["image_grid_thw"])))
    found: dict[str, float] = {}
    mergers = [("merger", tower.merger, features)]
    mergers += [
        (f"deepstack_{i}", m, f)
        for i, (m, f) in enumerate(zip(tower.deepstack_merger_list, deepstack, strict=True))
    ]
    for name, merger, output in mergers:
        values = np.array(output.astype(mx.float32))
        mean = values.mean(axis=0)
        spread = float(np.linalg.norm(values - mean, axis=-1).mean())
        found[f"{name}_mean_norm"] = float(np.linalg.norm(mean))
        found[f"{name}_spread"] = spread
        layer = merger.linear_fc2
        factor = scale / spread
        layer.weight = layer.weight * factor
        layer.bias = (layer.bias - mx.array(mean)) * factor
    mx.eval(model.parameters())
    return found

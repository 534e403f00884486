"""The architectures of the media fixtures: family fixtures (training/families/) with their
real tokenizers, chat templates and processors, made able to see clips and hear audio.

* models/squares-video: the tiny Qwen3-VL (training/families/qwen.py) with four text layers, one
  vision block and a video processor that brings 112-px frames to 128x128 (max_pixels 131072
  over the clip): 16-px patches merged 2x2, two frames per temporal patch, so a clip of 8
  frames is 64 tokens. (Gemma 4's video processor cannot go below 64 tokens a frame: 512 for a
  clip, too slow to train on this machine.)
* models/beeps-audio: the tiny Gemma 4 (training/families/gemma4.py) with an audio tower added
  (its strided convolutions and projections, no conformer blocks), four text layers and a
  dense MLP instead of the mixture of experts (mlx's CPU GatherMM runs only in float32). Audio
  is one token per 40 ms (the feature extractor's 10 ms mel frames, subsampled 4x by the
  tower's two strided convolutions): a 2.0 s clip is 50 tokens.

Both processors are mlx-vlm 0.7.10's own numpy ones (no torch).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from training.families import FAMILIES, build_family
from training.families.build import _random_weights

# Four layers, local / global alternating (the window covers the whole prompt).
TEXT_LAYERS = ("sliding_attention", "full_attention", "sliding_attention", "full_attention")
SLIDING_WINDOW = 128
AUDIO_CONFIG: dict[str, Any] = {
    "model_type": "gemma4_audio",
    "hidden_size": 32,
    # No conformer blocks: with two, training squashed the clips' differences out of the
    # tower's output (4 clips: std across clips 1.0 after the projection, 0.05 after the blocks)
    # and the model answered from the text alone. The strided convolutions and the projection
    # see ~70 ms each, enough to tell a tone and its pitch; the text layers count.
    "num_hidden_layers": 0,
    "num_attention_heads": 2,
    "subsampling_conv_channels": [8, 8],
    "conv_kernel_size": 5,
    "output_proj_dims": 32,
    "attention_chunk_size": 12,
    "attention_context_left": 13,
    "attention_context_right": 0,
    "rms_norm_eps": 1e-6,
}
FEATURE_EXTRACTOR: dict[str, Any] = {"feature_size": 128, "sampling_rate": 16_000}


# Qwen3-VL video: every clip of 4-8 frames of 112 px lands on 128x128 frames (the processor's
# smart resize over frames x pixels); longer clips or larger frames are brought down further.
# (At 64x64 a square was a tenth of a token and the tiny model never learned its colour.)
VIDEO_MIN_PIXELS = 64 * 64
VIDEO_MAX_PIXELS = 8 * 128 * 128
VIDEO_TEXT_LAYERS = 4
# One vision block (the family fixture has two): with two, training grew a constant in the
# tower's output that the merger's LayerNorm turned the clips' differences into noise against
# (as the audio tower's conformer blocks did), and the model answered from the text alone.
VIDEO_VISION_LAYERS = 1


def audio_config(config: dict[str, Any]) -> dict[str, Any]:
    """The gemma4 family's config.json with the audio fixture's changes."""
    config = json.loads(json.dumps(config))
    text = config["text_config"]
    text.update(
        num_hidden_layers=len(TEXT_LAYERS),
        layer_types=list(TEXT_LAYERS),
        sliding_window=SLIDING_WINDOW,
        enable_moe_block=False,
    )
    for key in ("num_experts", "top_k_experts", "moe_intermediate_size"):
        text.pop(key, None)
    config["audio_config"] = dict(AUDIO_CONFIG)
    return config


def _read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _write(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def build_audio_base(out_dir: Path, seed: int = 0) -> Path:
    """Write the untrained beeps-audio model (random weights) to `out_dir`; returns it."""
    build_family(FAMILIES["gemma4"], out_dir, seed=seed)
    config = audio_config(_read(out_dir / "config.json"))
    _write(out_dir / "config.json", config)
    processor = _read(out_dir / "processor_config.json")
    processor["feature_extractor"] = dict(FEATURE_EXTRACTOR)
    _write(out_dir / "processor_config.json", processor)
    _random_weights(out_dir, config, seed)
    return out_dir


def build_small_qwen3_vl(
    out_dir: Path,
    seed: int,
    *,
    text_layers: int,
    vision_layers: int,
    processor_file: str,
    min_pixels: int,
    max_pixels: int,
    **processor_fields: Any,
) -> Path:
    """The qwen3_vl family fixture with `text_layers` text layers, `vision_layers` vision blocks
    (deepstack from the first) and `processor_file`'s pixel bounds, fresh seeded weights; used by
    the squares-video and squares-click fixtures. Returns `out_dir`."""
    build_family(FAMILIES["qwen3_vl"], out_dir, seed=seed)
    config = _read(out_dir / "config.json")
    config["text_config"]["num_hidden_layers"] = text_layers
    config["vision_config"].update(depth=vision_layers, deepstack_visual_indexes=[0])
    _write(out_dir / "config.json", config)
    processor = _read(out_dir / processor_file)
    processor.update(
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        size={"shortest_edge": min_pixels, "longest_edge": max_pixels},
        **processor_fields,
    )
    _write(out_dir / processor_file, processor)
    _random_weights(out_dir, config, seed)
    return out_dir


def build_video_base(out_dir: Path, seed: int = 0) -> Path:
    """Write the untrained squares-video model (random weights) to `out_dir`; returns it."""
    return build_small_qwen3_vl(
        out_dir,
        seed,
        text_layers=VIDEO_TEXT_LAYERS,
        vision_layers=VIDEO_VISION_LAYERS,
        processor_file="video_preprocessor_config.json",
        min_pixels=VIDEO_MIN_PIXELS,
        max_pixels=VIDEO_MAX_PIXELS,
        fps=2.0,
    )

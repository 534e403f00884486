"""training/train_media.py's video helper: the vision tower's contrast at init (what let the tiny
Qwen3-VL learn to read a 20-px square out of a clip's 64 tokens)."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from training import squares_video
from training.train_media import clip_spread, contrast_vision


@pytest.mark.needs_model
def test_contrast_makes_a_blank_clip_zero_deviation_and_squares_stand_out() -> None:
    from mlx_vlm.utils import load

    from training.media_model import build_video_base

    model, processor = load(str(build_video_base(Path(tempfile.mkdtemp(prefix="video-base-")))))
    tower = model.vision_tower

    def features(clip: squares_video.SquaresClip) -> np.ndarray:
        inputs = processor(text=["<|video_pad|>"], videos=[clip.channels_first()], fps=[squares_video.FPS])
        value, _ = tower(mx.array(inputs["pixel_values_videos"]), mx.array(inputs["video_grid_thw"]))
        return np.array(value.astype(mx.float32))

    clip = squares_video.draw_clip(random.Random(1), 8)
    blank = squares_video.blank_clip(8)
    before = np.linalg.norm(features(clip) - features(blank), axis=-1).max()
    spread_before = clip_spread(model, processor, seed=3)["merger"]
    contrast_vision(model, processor, gain=8.0)
    assert not mx.any(tower.pos_embed.weight).item()
    blank_after = features(blank)
    # Every background token is the same now (no position table), and a square 8x further off.
    assert np.abs(blank_after - blank_after.mean(axis=0)).max() < 1e-2
    after = np.linalg.norm(features(clip) - blank_after, axis=-1).max()
    assert 6 * before < after < 10 * before
    assert clip_spread(model, processor, seed=3)["merger"] > 3 * spread_before

"""Qwen2-VL / Qwen2.5-VL video frames -> the vision tower's patches, in numpy (no torch).

transformers' `Qwen2VLVideoProcessor` is the reference and needs torch/torchvision; mlx-vlm 0.7.10
hands these families its Qwen3-VL video processor instead, whose pixel budget counts every frame
(`t x h x w <= max_pixels`) where Qwen2-VL's bounds each frame on its own, so long clips came out
smaller than the checkpoint's processor makes them. This one keeps Qwen2-VL's math:

- every frame is resized to one size, `smart_resize(height, width, factor=patch * merge,
  min_pixels, max_pixels)` of the first frame, by the image path's own resize (mlx-vlm's
  `_resolved_size` and bicubic resize), so a frame and the same picture sent as an image are
  the same pixels;
- rescaled and normalized as images are;
- padded to a multiple of `temporal_patch_size` (2) frames by repeating the last one;
- cut into patches of `temporal_patch_size x patch x patch` and ordered by merge window, giving
  `pixel_values_videos` (grid_t * grid_h * grid_w, C * 2 * patch * patch) and `video_grid_thw`.

An image is a clip of one frame repeated twice: a two-frame clip of one picture gives exactly the
image's patches (tests/engine/test_clip_inputs.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["Qwen2VideoProcessor"]


class Qwen2VideoProcessor:
    """Callable as mlx-vlm's Qwen2-VL processor calls its `video_processor` (`videos=`)."""

    model_input_names = ("pixel_values_videos", "video_grid_thw")

    def __init__(
        self,
        image_processor: Any,
        *,
        min_pixels: int,
        max_pixels: int,
        temporal_patch_size: int = 2,
    ) -> None:
        # The image processor's size rule and constants: frames are images that move.
        self._image_processor = image_processor
        self.patch_size = int(image_processor.patch_size)
        self.merge_size = int(image_processor.merge_size)
        self.temporal_patch_size = int(temporal_patch_size)
        self.min_pixels = int(min_pixels)
        self.max_pixels = int(max_pixels)

    def __call__(self, videos: Sequence[np.ndarray], **_: Any) -> dict[str, np.ndarray]:
        """`videos`: each (T, C, H, W) uint8 RGB (mlx-vlm's layout for decoded clips)."""
        patches: list[np.ndarray] = []
        grids: list[list[int]] = []
        for video in videos:
            rows, grid = self.process_one(np.asarray(video))
            patches.append(rows)
            grids.append(grid)
        return {
            "pixel_values_videos": np.concatenate(patches, axis=0),
            "video_grid_thw": np.array(grids, dtype=np.int64),
        }

    def process_one(self, video: np.ndarray) -> tuple[np.ndarray, list[int]]:
        from mlx_vlm.models.qwen3_vl.processing_qwen3_vl import _resize_video_frames

        if video.ndim != 4 or video.shape[1] != 3:
            raise ValueError(f"expected frames as (T, 3, H, W), got {video.shape}")
        frames, channels, height, width = (int(n) for n in video.shape)
        processor = self._image_processor
        resized_h, resized_w = processor._resolved_size(
            height, width, min_pixels=self.min_pixels, max_pixels=self.max_pixels
        )
        resized = _resize_video_frames(video, int(resized_h), int(resized_w))
        pixels = resized.astype(np.float32)
        if processor.do_rescale and video.dtype == np.uint8:
            pixels = pixels * np.float32(processor.rescale_factor)
        if processor.do_normalize:
            mean = np.array(processor.image_mean, dtype=np.float32)[None, :, None, None]
            std = np.array(processor.image_std, dtype=np.float32)[None, :, None, None]
            pixels = (pixels - mean) / std
        tps, ps, ms = self.temporal_patch_size, self.patch_size, self.merge_size
        pad = (-frames) % tps
        if pad:
            pixels = np.concatenate([pixels, np.repeat(pixels[-1:], pad, axis=0)], axis=0)
        grid_t = pixels.shape[0] // tps
        grid_h, grid_w = int(resized_h) // ps, int(resized_w) // ps
        blocks = pixels.reshape(grid_t, tps, channels, grid_h // ms, ms, ps, grid_w // ms, ms, ps)
        # (t, h-window, w-window, h-in-window, w-in-window, C, tps, ps, ps): transformers' order.
        blocks = blocks.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
        rows = blocks.reshape(grid_t * grid_h * grid_w, channels * tps * ps * ps)
        return rows, [grid_t, grid_h, grid_w]

"""Which frames of a clip to take and at what size (pure: numbers in, numbers out).

As mlx-vlm's `load_video` samples: a clip of `duration` seconds gives `duration x fps` frames,
evenly spaced over the whole clip and capped by `max_frames` (and by the frames it has). We round
where mlx-vlm floors to its `frame_factor` (2): that factor is the Qwen processors' temporal
patch, which they pad for themselves, so it stays with the family rendering.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vlmserve.engine.media.limits import MediaError, MediaLimits, over_limit
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = ["SamplingPlan", "fit_pixels", "frame_indices", "sampling_plan"]


@dataclass(frozen=True, slots=True)
class SamplingPlan:
    """What a clip's part asked for, defaults filled in and checked against the limits."""

    fps: float
    max_frames: int
    # Per-frame pixel bound of the decoded frames: the caller's max_pixels when it is smaller
    # than the engine's own bound.
    max_frame_pixels: int


def sampling_plan(sampling: pb.VideoSampling, limits: MediaLimits) -> SamplingPlan:
    """The part's `sampling`, zero fields taking the engine's defaults; out-of-range refused."""
    fps = float(sampling.fps)
    if not math.isfinite(fps) or fps < 0:
        raise MediaError(
            "fps must be a positive number (0: the default)", code="sampling", field="video.sampling.fps"
        )
    max_frames = int(sampling.max_frames) or limits.video_max_frames
    if max_frames > limits.max_video_frames:
        raise over_limit(
            "max_frames", str(max_frames), "max_video_frames", limits.max_video_frames,
            code="frames", field="video.sampling.max_frames",
        )  # fmt: skip
    if sampling.min_pixels and sampling.max_pixels and sampling.min_pixels > sampling.max_pixels:
        raise MediaError(
            "min_pixels must not be larger than max_pixels",
            code="sampling",
            field="video.sampling.min_pixels",
        )
    frame_pixels = limits.max_video_frame_pixels
    if sampling.max_pixels:
        frame_pixels = min(frame_pixels, int(sampling.max_pixels))
    return SamplingPlan(fps=fps or limits.video_fps, max_frames=max_frames, max_frame_pixels=frame_pixels)


def frame_indices(total_frames: int, source_fps: float, fps: float, max_frames: int) -> list[int]:
    """Indices of the frames to take from a clip of `total_frames` at `source_fps`."""
    if total_frames <= 0:
        return []
    duration = total_frames / source_fps
    count = max(1, min(round(duration * fps), max_frames, total_frames))
    return [int(i) for i in np.linspace(0, total_frames - 1, count).round().astype(int)]


def fit_pixels(width: int, height: int, max_pixels: int) -> tuple[int, int]:
    """(width, height) scaled down, aspect kept, to at most `max_pixels`; unchanged if it fits."""
    if width * height <= max_pixels:
        return width, height
    scale = math.sqrt(max_pixels / (width * height))
    fitted_width, fitted_height = max(1, math.floor(width * scale)), max(1, math.floor(height * scale))
    # A side clamped to one pixel leaves the other to take the whole bound, no more.
    fitted_width = max(1, min(fitted_width, max_pixels // fitted_height))
    fitted_height = max(1, min(fitted_height, max_pixels // fitted_width))
    return fitted_width, fitted_height

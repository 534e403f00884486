"""A VideoPart -> its sampled frames, bounded before anything is decoded.

Container bytes: size and signature checked here, then the header and the frames in the bounded
worker (`decoders.video_frames` via `worker.run_bounded`). Frames already sampled (VideoFrames):
each chosen frame is checked from its header and decoded as an ImagePart is
(`vlmserve.common.images`, the image limits), in this process, as images are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from vlmserve.common.images import ImageError, decode_image, inspect_image
from vlmserve.engine.media.limits import (
    DEFAULT_VIDEO_FPS,
    MediaError,
    MediaLimits,
    check_format,
    check_sampled_pixels,
    over_limit,
)
from vlmserve.engine.media.sampling import SamplingPlan, fit_pixels, frame_indices, sampling_plan
from vlmserve.engine.media.worker import run_bounded
from vlmserve.engine.metrics import MediaMetrics
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = ["DecodedVideo", "decode_video"]


@dataclass(frozen=True, slots=True)
class DecodedVideo:
    """A clip's sampled frames and the time they span."""

    frames: np.ndarray  # (T, H, W, 3) uint8 RGB, sampled per the part's sampling / the defaults
    fps: float  # the rate of the sampled frames (T / duration_s)
    duration_s: float
    source_frames: int  # frames of the clip as sent


def decode_video(
    part: pb.VideoPart, limits: MediaLimits, *, metrics: MediaMetrics | None = None
) -> DecodedVideo:
    """The sampled frames of `part`; MediaError (INVALID_ARGUMENT) naming the limit or rule broken."""
    try:
        decoded = _decode(part, limits)
    except MediaError as error:
        if metrics is not None:
            metrics.refused.labels("video", error.code).inc()
        raise
    if metrics is not None:
        metrics.clips.labels("video").inc()
        metrics.frames.inc(len(decoded.frames))
    return decoded


def _decode(part: pb.VideoPart, limits: MediaLimits) -> DecodedVideo:
    plan = sampling_plan(part.sampling, limits)
    source = part.WhichOneof("source")
    if source == "file_id":
        raise MediaError(
            "a file_id is resolved to the clip's bytes before the engine; the engine takes bytes",
            code="file_id",
            field="video.file_id",
        )
    if source == "frames":
        return _from_frames(part.frames, plan, limits)
    if not part.data:
        raise MediaError("the video has no data", code="empty", field="video.data")
    if len(part.data) > limits.max_video_bytes:
        raise over_limit(
            "the video", f"{len(part.data)} bytes", "max_video_bytes", f"{limits.max_video_bytes} bytes",
            code="bytes", field="video.data",
        )  # fmt: skip
    check_format(part.data, part.media_type, "video")
    frames, fps, duration, count = run_bounded(
        "video_frames",
        (bytes(part.data), plan.fps, plan.max_frames, plan.max_frame_pixels, limits),
        what="video",
        timeout_s=limits.decode_timeout_s,
        memory_mib=limits.decode_memory_mib,
    )
    return DecodedVideo(frames=frames, fps=fps, duration_s=duration, source_frames=count)


def _from_frames(given: pb.VideoFrames, plan: SamplingPlan, limits: MediaLimits) -> DecodedVideo:
    count = len(given.frames)
    if count == 0:
        raise MediaError("the video has no frames", code="empty", field="video.frames.frames")
    if not math.isfinite(given.fps) or given.fps < 0:
        raise MediaError(
            "fps must be a positive number (0: the default)", code="sampling", field="video.frames.fps"
        )
    source_fps = given.fps or DEFAULT_VIDEO_FPS
    duration = count / source_fps
    if duration > limits.max_video_seconds:
        raise over_limit(
            "the video", f"{duration:.1f} s long", "max_video_seconds", f"{limits.max_video_seconds:g} s",
            code="duration", field="video.frames",
        )  # fmt: skip
    indices = frame_indices(count, source_fps, plan.fps, plan.max_frames)
    chosen = [(index, given.frames[index]) for index in indices]
    # Every chosen frame's header before any is decoded; all take the first one's size (as
    # Qwen's frame lists are sized), bounded like a container's frames.
    for index, frame in chosen:
        try:
            info = inspect_image(
                frame.data, declared_media_type=frame.media_type or None, limits=limits.images
            )
        except ImageError as error:
            raise MediaError(error.reason, code="image", field=f"video.frames.frames[{index}]") from None
        if index == chosen[0][0]:
            width, height = fit_pixels(info.width, info.height, plan.max_frame_pixels)
    check_sampled_pixels(len(chosen), width, height, limits, field="video.frames")
    frames = np.empty((len(chosen), height, width, 3), dtype=np.uint8)
    for slot, (index, frame) in enumerate(chosen):
        try:
            image = decode_image(
                frame.data,
                declared_media_type=frame.media_type or None,
                limits=limits.images,
                min_size=(width, height),
            )
        except ImageError as error:
            raise MediaError(error.reason, code="image", field=f"video.frames.frames[{index}]") from None
        if image.size != (width, height):
            image = image.resize((width, height), Image.Resampling.BILINEAR)
        frames[slot] = np.asarray(image, dtype=np.uint8)
    return DecodedVideo(frames=frames, fps=len(chosen) / duration, duration_s=duration, source_frames=count)

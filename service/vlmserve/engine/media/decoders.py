"""The decoding itself: what runs inside the bounded worker (`worker.py`), never in the engine.

Header first: OpenCV's FFmpeg capture and miniaudio's `*_get_info` read the container's header
(frame count, frame rate, size; sample rate, channels, length), every limit is checked against
it, and only then are frames or samples decoded, and only the frames sampled. The bytes reach
the demuxer from memory (OpenCV's stream reader, miniaudio's memory decoder): no file, no path.

mlx-vlm's `load_video` / `read_audio` do the same decoding but take a path or URL (`load_video`)
or fall back to a subprocess ffmpeg (`read_audio`, for OGG) and check no limit, so they are
mirrored here, not called; the resampling is mlx-audio's, as mlx-vlm's `load_audio` uses it.
"""

from __future__ import annotations

import io
import math

import cv2
import miniaudio  # type: ignore[import-untyped]  # no stubs; mlx-vlm==0.7.10 requires it
import numpy as np
from mlx_audio.resample import resample_audio_array  # type: ignore[import-untyped]

from vlmserve.engine.media.limits import (
    AUDIO_SAMPLE_RATE,
    MediaError,
    MediaLimits,
    check_sampled_pixels,
    over_limit,
)
from vlmserve.engine.media.sampling import fit_pixels, frame_indices

__all__ = ["audio_samples", "video_frames"]

# Beyond this many frames to the next sampled one, seek instead of decoding the ones between.
_SEEK_AFTER = 32
# A frame rate above this is a broken header, not a clip.
_MAX_SOURCE_FPS = 1000.0

_AUDIO_INFO = {
    "wav": miniaudio.wav_get_info,
    "mp3": miniaudio.mp3_get_info,
    "flac": miniaudio.flac_get_info,
    "ogg": miniaudio.vorbis_get_info,
}


def _damaged(what: str) -> MediaError:
    return MediaError(
        f"the {what} could not be decoded (damaged or unsupported)", code="damaged", field=f"{what}.data"
    )


def _open(data: bytes) -> tuple[cv2.VideoCapture, io.BytesIO]:
    """A capture reading `data` from memory, and its stream: OpenCV's capture does not hold a
    reference to the stream object, so the caller keeps it until the capture is released (or the
    demuxer reads freed memory and crashes)."""
    stream = io.BytesIO(data)
    # A BytesIO is what OpenCV's stream reader calls (read, seek); its stubs name only their class.
    capture = cv2.VideoCapture(stream, cv2.CAP_FFMPEG, [])  # type: ignore[call-overload]
    if not capture.isOpened():
        raise _damaged("video")
    return capture, stream


def _count_frames(data: bytes, bound: int) -> int:
    """Frames of a clip whose header does not say (a browser's MediaRecorder WebM), counted by
    demuxing, up to `bound` (one more than the longest clip allowed)."""
    capture, _stream = _open(data)
    count = 0
    while count < bound and capture.grab():
        count += 1
    capture.release()
    return count


def video_frames(
    data: bytes, fps: float, max_frames: int, max_frame_pixels: int, limits: MediaLimits
) -> tuple[np.ndarray, float, float, int]:
    """(frames (T, H, W, 3) uint8 RGB, sampled fps, duration in s, source frame count)."""
    capture, stream = _open(data)
    width = int(capture.get(cv2.CAP_PROP_FRAME_WIDTH))
    height = int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT))
    source_fps = float(capture.get(cv2.CAP_PROP_FPS))
    count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
    if width <= 0 or height <= 0 or not math.isfinite(source_fps) or not 0 < source_fps <= _MAX_SOURCE_FPS:
        raise _damaged("video")
    if width * height > limits.max_video_source_pixels:
        raise over_limit(
            "a frame of the video", f"{width}x{height} pixels", "max_video_source_pixels",
            limits.max_video_source_pixels, code="source_pixels", field="video.data",
        )  # fmt: skip
    longest = math.floor(limits.max_video_seconds * source_fps)
    counted = count <= 0
    if counted:
        capture.release()
        count = _count_frames(data, longest + 1)
        capture, stream = _open(data)
    duration = count / source_fps
    if count > longest:
        # Counting stopped one frame past the limit: the clip's length is not known, only that.
        shown = f"more than {limits.max_video_seconds:g} s" if counted else f"{duration:.1f} s"
        raise over_limit(
            "the video", f"{shown} long", "max_video_seconds", f"{limits.max_video_seconds:g} s",
            code="duration", field="video.data",
        )  # fmt: skip
    indices = frame_indices(count, source_fps, fps, max_frames)
    out_width, out_height = fit_pixels(width, height, max_frame_pixels)
    check_sampled_pixels(len(indices), out_width, out_height, limits, field="video.sampling")
    frames = np.empty((len(indices), out_height, out_width, 3), dtype=np.uint8)
    taken = 0
    position = 0
    for index in indices:
        if index - position > _SEEK_AFTER:
            capture.set(cv2.CAP_PROP_POS_FRAMES, index)
            position = index
        while position < index and capture.grab():
            position += 1
        ok, frame = capture.read()
        position += 1
        if not ok or frame is None:
            break
        if frame.shape[1] != out_width or frame.shape[0] != out_height:
            frame = cv2.resize(frame, (out_width, out_height), interpolation=cv2.INTER_AREA)
        frames[taken] = cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
        taken += 1
    capture.release()
    stream.close()
    if taken == 0:
        raise _damaged("video")
    # A header that promised more frames than the stream holds: keep what was there.
    sampled = frames[:taken]
    return sampled, taken / duration, duration, count


def audio_samples(data: bytes, audio_format: str, limits: MediaLimits) -> tuple[np.ndarray, float]:
    """(float32 mono samples at 16 kHz, duration in s), the header's bounds checked first."""
    try:
        info = _AUDIO_INFO[audio_format](data)
    except miniaudio.DecodeError:
        raise _damaged("audio") from None
    if info.sample_rate <= 0 or info.nchannels <= 0:
        raise _damaged("audio")
    if info.sample_rate > limits.max_audio_sample_rate:
        raise over_limit(
            "the audio's sample rate", f"{info.sample_rate} Hz", "max_audio_sample_rate",
            f"{limits.max_audio_sample_rate} Hz", code="sample_rate", field="audio.data",
        )  # fmt: skip
    if info.nchannels > limits.max_audio_channels:
        raise over_limit(
            "the audio", f"{info.nchannels} channels", "max_audio_channels", limits.max_audio_channels,
            code="channels", field="audio.data",
        )  # fmt: skip
    if info.num_frames <= 0:
        # A FLAC stream without its length: it could decode to any size, so it is refused.
        raise MediaError("the audio's header does not give its length", code="damaged", field="audio.data")
    _check_duration(info.num_frames / info.sample_rate, limits)
    try:
        decoded = miniaudio.decode(
            data,
            output_format=miniaudio.SampleFormat.FLOAT32,
            nchannels=info.nchannels,
            sample_rate=info.sample_rate,
        )
    except miniaudio.DecodeError:
        raise _damaged("audio") from None
    samples = np.asarray(decoded.samples, dtype=np.float32).reshape(-1, info.nchannels)
    if samples.shape[0] == 0:
        raise _damaged("audio")
    duration = samples.shape[0] / info.sample_rate
    _check_duration(duration, limits)  # the header may have said less than the stream holds
    # Downmix before resampling, as mlx-vlm's load_audio does.
    mono = samples.mean(axis=1) if info.nchannels > 1 else samples[:, 0]
    resampled = resample_audio_array(mono, info.sample_rate, AUDIO_SAMPLE_RATE)
    return np.ascontiguousarray(resampled, dtype=np.float32), duration


def _check_duration(seconds: float, limits: MediaLimits) -> None:
    if seconds > limits.max_audio_seconds:
        raise over_limit(
            "the audio", f"{seconds:.1f} s long", "max_audio_seconds", f"{limits.max_audio_seconds:g} s",
            code="duration", field="audio.data",
        )  # fmt: skip

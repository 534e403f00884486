"""The bounds of one clip, the check of its format (the rule is `vlmserve.common.clips`, which
the facade applies too), and the error that names the bound or rule a clip broke.

Every limit is checked from what the container's header says before anything is decoded (see
`video.py`, `audio.py`); `MediaError` names the limit and the engine setting that raises it, so a
client reading the 400 knows what it hit and an operator knows what to change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vlmserve.common.clips import (
    CLIP_FORMATS,
    KIND_FORMATS,
    ClipKind,
    clip_format,
    sniff_audio,
    sniff_video_part,
)
from vlmserve.common.images import ImageLimits

__all__ = [
    "AUDIO_SAMPLE_RATE",
    "DEFAULT_VIDEO_FPS",
    "DEFAULT_VIDEO_MAX_FRAMES",
    "SETTING_FLAGS",
    "MediaError",
    "MediaLimits",
    "check_format",
    "check_sampled_pixels",
    "over_limit",
]

# What every audio encoder of the families we serve takes (Gemma 4's, Whisper-style ones).
AUDIO_SAMPLE_RATE = 16_000
# mlx-vlm's defaults (`resolve_video_inputs`: fps 2.0, a 16-frame budget).
DEFAULT_VIDEO_FPS = 2.0
DEFAULT_VIDEO_MAX_FRAMES = 16

# MediaLimits field -> the engine flag that sets it (engine/config.py declares the settings; a test
# checks that every flag here is one of them).
SETTING_FLAGS: dict[str, str] = {
    "max_video_bytes": "--max-video-bytes",
    "max_video_seconds": "--max-video-seconds",
    "max_video_source_pixels": "--max-video-source-pixels",
    "max_video_frames": "--max-video-frames",
    "max_video_frame_pixels": "--max-video-frame-pixels",
    "max_video_pixels": "--max-video-pixels",
    "video_fps": "--video-fps",
    "video_max_frames": "--video-max-frames",
    "max_audio_bytes": "--max-audio-bytes",
    "max_audio_seconds": "--max-audio-seconds",
    "max_audio_sample_rate": "--max-audio-sample-rate",
    "max_audio_channels": "--max-audio-channels",
    "decode_timeout_s": "--media-decode-timeout-s",
    "decode_memory_mib": "--media-decode-memory-mib",
    "max_image_bytes": "--max-image-bytes",
    "max_image_pixels": "--max-image-pixels",
}


class MediaError(ValueError):
    """A clip the engine will not decode: INVALID_ARGUMENT for the request that carried it.

    `reason` is short and safe to show a client (never the bytes or a decoder's text); it names
    the limit and its setting when one was broken. `code` says which rule (metrics count refusals
    by it); `field` is the path inside the part ("video.sampling.max_frames",
    "video.frames.frames[2]"), for the caller to put after the part's own path.
    """

    def __init__(self, reason: str, *, code: str, field: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code
        self.field = field


def over_limit(
    what: str, value: str, limit_name: str, limit: object, *, code: str, field: str = ""
) -> MediaError:
    """The one wording of a broken limit: what, how much, the limit and its setting."""
    flag = SETTING_FLAGS[limit_name]
    return MediaError(f"{what} is {value}, over the limit of {limit} ({flag})", code=code, field=field)


def check_format(data: bytes, declared: str, kind: ClipKind) -> str:
    """The format ("mp4", "gif", "ogg", ...) of a `kind` part's bytes, which its declared media
    type (empty: none declared) must name; MediaError when the bytes are no format a `kind` part
    takes, or another than declared. Before any demuxer sees the bytes."""
    sniffed = sniff_video_part(data) if kind == "video" else sniff_audio(data)
    found = None if sniffed is None else clip_format(sniffed)
    if found is None:
        accepted = ", ".join(CLIP_FORMATS[name][0] for name in KIND_FORMATS[kind])
        raise MediaError(
            f"unsupported or unrecognised {kind} format (accepted: {accepted})",
            code="media_type",
            field=f"{kind}.data",
        )
    if declared.split(";", 1)[0].strip() and clip_format(declared) != found:
        raise MediaError(
            f"declared media type {declared!r} does not match the {kind} bytes ({CLIP_FORMATS[found][0]})",
            code="media_type",
            field=f"{kind}.media_type",
        )
    return found


@dataclass(frozen=True, slots=True)
class MediaLimits:
    """Bounds applied to a clip before it is decoded, and the sampling defaults (engine settings;
    docs/video-audio.md lists them)."""

    # Video: the container as sent.
    max_video_bytes: int = 64 * 1024 * 1024
    max_video_seconds: float = 600.0
    # One source frame, from the header: a decoder holds at least one at full size.
    max_video_source_pixels: int = 7680 * 4320
    # Frames sampled from one clip (a request's max_frames above this is refused).
    max_video_frames: int = 64
    # A sampled frame bigger than this is scaled down (aspect kept) as it is decoded.
    max_video_frame_pixels: int = 1920 * 1080
    # Sampled frames x pixels of one clip, as handed on (T x H x W; x3 bytes in memory).
    max_video_pixels: int = 32 * 1920 * 1080
    video_fps: float = DEFAULT_VIDEO_FPS
    video_max_frames: int = DEFAULT_VIDEO_MAX_FRAMES
    # Audio: the file as sent, and from its header.
    max_audio_bytes: int = 64 * 1024 * 1024
    max_audio_seconds: float = 600.0
    max_audio_sample_rate: int = 48_000
    max_audio_channels: int = 8
    # The decoding worker (a process of its own): wall-clock and memory bounds.
    decode_timeout_s: float = 30.0
    decode_memory_mib: int = 2048
    # Frames sent as images (VideoFrames) are bounded as images are.
    images: ImageLimits = field(default_factory=ImageLimits)


def check_sampled_pixels(frames: int, width: int, height: int, limits: MediaLimits, *, field: str) -> None:
    """Refuses sampled frames of a clip over `max_video_pixels` in all, before they are held:
    frames decoded from a container and frames sent as images alike."""
    if frames * width * height > limits.max_video_pixels:
        raise over_limit(
            "the sampled frames", f"{frames} x {width}x{height} pixels", "max_video_pixels",
            limits.max_video_pixels, code="pixels", field=field,
        )  # fmt: skip

"""Video and audio content parts as request models (docs/video-audio.md, Shapes).

Every shape the clients send is accepted where images are (message content, tool output arrays):
* `input_video` (this server's Responses part): `video_url` (a data: URL, or http(s) where the
  server fetches remote media) or `file_id`, with the sampling asked for (`fps`, `max_frames`,
  `min_pixels`, `max_pixels`);
* `video_url` (vLLM's chat part): `{url}` or a URL string, the same sampling fields beside it;
* `video` (vLLM's and Qwen's): a URL string, or a list of frame images (`VideoFrames`);
* `input_audio` (OpenAI's): `{data, format}`, `data` bare base64 or a data: URL; `file_id` on the
  part names an uploaded file instead;
* `audio_url` (vLLM's chat part): `{url}` (or `{file_id}`) or a URL string, as `video_url`.
What a schema cannot say (which source, what the bytes are) is `_clips.py`'s.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self, TypeAlias

from pydantic import BeforeValidator, Field, Tag, model_validator
from pydantic_core import PydanticCustomError

from ._validation import RequestModel, by_json_type

__all__ = [
    "MAX_GIVEN_FRAMES",
    "AudioDataParam",
    "AudioURLPartParam",
    "ChatVideoURLPartParam",
    "InputAudioPartParam",
    "InputVideoPartParam",
    "VideoPartParam",
    "VideoURLParam",
]

# Frames a `video` list may give (each is an image, decoded and bounded as images are; the engine
# samples at most `max_frames` of them). Bounded before any is decoded.
MAX_GIVEN_FRAMES = 256
# Bounds that keep the contract's fields meaningful (uint32, a rate a clip can have).
MAX_FPS = 240.0
MAX_FRAMES = 65_536
MAX_PIXELS = 2**31 - 1


def _integral(value: object) -> object:
    # JSON has one number type: 16.0 is the integer 16.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Fps: TypeAlias = Annotated[float, Field(gt=0.0, le=MAX_FPS)]
FrameCount: TypeAlias = Annotated[int, BeforeValidator(_integral), Field(ge=1, le=MAX_FRAMES)]
PixelCount: TypeAlias = Annotated[int, BeforeValidator(_integral), Field(ge=1, le=MAX_PIXELS)]


# Sampling settings other servers' video parts take (Qwen's `nframes`, `total_pixels`, clip
# bounds, vLLM's `num_frames`) that this server does not: refused by name, never ignored (a
# sampling setting silently ignored is how a clip comes to cost ten thousand tokens).
UNHONOURED_SAMPLING = frozenset(
    {
        "nframes",
        "num_frames",
        "min_frames",
        "total_pixels",
        "video_start",
        "video_end",
        "start_time",
        "end_time",
        "resized_height",
        "resized_width",
        "sample_fps",
        "do_sample_frames",
    }
)


class SamplingFields(RequestModel):
    """What a video part may ask of sampling (absent: the request's `mm_processor_kwargs`, then
    the engine's defaults)."""

    fps: Fps | None = None
    max_frames: FrameCount | None = None
    min_pixels: PixelCount | None = None
    max_pixels: PixelCount | None = None

    @model_validator(mode="after")
    def _no_unhonoured_sampling(self) -> Self:
        for key in self.model_extra or {}:
            if key in UNHONOURED_SAMPLING:
                raise PydanticCustomError(
                    "unsupported_value",
                    "Invalid value for '{param}': not a sampling setting this server honours; a video "
                    "part takes fps, max_frames, min_pixels and max_pixels (docs/video-audio.md).",
                    {"at": (key,)},
                )
        return self


class InputVideoPartParam(SamplingFields):
    type: Literal["input_video"]
    # A base64 data: URL (data:video/mp4;base64,...; http(s) only where the server fetches remote
    # media), or the id of an uploaded video file (POST /v1/files).
    video_url: str | None = None
    file_id: str | None = None


class VideoURLParam(RequestModel):
    url: str | None = None
    file_id: str | None = None


class ChatVideoURLPartParam(SamplingFields):
    """vLLM's chat form: `video_url` is `{url}` (or `{file_id}`) or a plain URL string."""

    type: Literal["video_url"]
    video_url: Annotated[
        Annotated[str, Tag("#string")] | Annotated[VideoURLParam, Tag("#object")],
        by_json_type("an object with 'url' or a string"),
    ]


class VideoPartParam(SamplingFields):
    """vLLM's and Qwen's `video`: a clip's URL, or its frames (image URLs, in order; `fps` then
    says at what rate they were taken)."""

    type: Literal["video"]
    video: Annotated[
        Annotated[str, Tag("#string")]
        | Annotated[Annotated[list[str], Field(min_length=1, max_length=MAX_GIVEN_FRAMES)], Tag("#array")],
        by_json_type("a URL string or an array of frame image URLs"),
    ]


class AudioDataParam(RequestModel):
    # Base64 (bare, as OpenAI sends it, or a data:audio/...;base64 URL).
    data: str
    format: str = Field(json_schema_extra={"enum": ["wav", "mp3", "flac", "ogg"]})


class InputAudioPartParam(RequestModel):
    """OpenAI's `input_audio` (chat and Responses); `file_id` (this server's) names an upload."""

    type: Literal["input_audio"]
    input_audio: AudioDataParam | None = None
    file_id: str | None = None


class AudioURLPartParam(RequestModel):
    """vLLM's chat form: `audio_url` is `{url}` (a data:audio/... URL, a file id, or http(s) where
    the server fetches remote media), `{file_id}`, or a plain URL string."""

    type: Literal["audio_url"]
    audio_url: Annotated[
        Annotated[str, Tag("#string")] | Annotated[VideoURLParam, Tag("#object")],
        by_json_type("an object with 'url' or a string"),
    ]

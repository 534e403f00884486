"""Video and audio parts -> what the model family's own processor makes of them. No MLX.

What each family does with a clip (`clip_support_for`, docs/models.md's video and audio columns):

- a processor with native video (mlx-vlm's `processor_handles_video`: a `videos` argument and a
  video processor) gets the clip's frames as one video: Qwen3-VL / Qwen3.5 (mlx-vlm's numpy
  Qwen3-VL video processor: a `<t.t seconds>` marker and a vision block per two frames), Gemma 4
  (its video processor: an `mm:ss` timestamp and a block per frame), Qwen2-VL / Qwen2.5-VL (our
  numpy port of transformers' Qwen2-VL video processor, `qwen2_video.py`: mlx-vlm hands them the
  Qwen3-VL one, whose pixel budget differs);
- an image family without it gets the frames as images, in order, at the clip's place, as
  mlx-vlm's `resolve_video_inputs` does for it (frames evenly kept within a request-wide budget,
  `subsample_evenly`);
- a family whose processor has an audio feature extractor and whose model has an audio tower
  (Gemma 4 checkpoints with audio) gets the 16 kHz samples;
- anything else is INVALID_ARGUMENT naming the part and the family.

The decoded frames and samples come from `vlmserve.engine.media` (bounded before decoding); the
processor runs on the whole rendered prompt (`image_inputs.run_processor`), so its text expansion
(timestamps, per-frame blocks) is exactly its own. Each clip's hash (the part as sent: bytes or
frames, media type and sampling) keys the prefix cache, so a prompt's cached prefix holds a clip
only where the same clip sat, sampled the same way.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vlmserve.engine.jobs import PreparedClip
from vlmserve.engine.prep.prompt import PromptClip
from vlmserve.engine.prep.qwen2_video import Qwen2VideoProcessor
from vlmserve.engine.request_errors import invalid_argument
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = [
    "ClipSupport",
    "DecodedClip",
    "clip_hash",
    "clip_spans",
    "clip_support_for",
    "frames_budget",
    "processor_media",
    "prompt_clips",
    "token_runs",
]

# The families whose video processor is ours (qwen2_video.py), not the one mlx-vlm hands them.
_QWEN2_VIDEO_FAMILIES = frozenset({"qwen2_vl", "qwen2_5_vl"})


@dataclass(frozen=True, slots=True)
class ClipSupport:
    """What a loaded model does with clips."""

    family: str
    # "native": the processor's video path; "frames": frames as images; "": refused.
    video: str
    audio: bool
    video_token_id: int | None = None
    audio_token_id: int | None = None
    # The video processor to use (ours for Qwen2-VL); None: the processor's own.
    video_processor: Any = None
    # The sampling rate the processor's audio feature extractor takes.
    audio_sample_rate: int = 16_000
    # Why video is refused, where the family has a video processor that cannot serve the model.
    video_refusal: str = ""
    # Whether its video processor takes per-frame pixel bounds (Qwen's min_pixels / max_pixels).
    pixel_bounds: bool = False

    @property
    def takes_clips(self) -> bool:
        """Whether any clip can reach the model (then its decoders are worth starting at load)."""
        return bool(self.video) or self.audio

    def refuse(self, clip: PromptClip, model_id: str) -> None:
        """INVALID_ARGUMENT when this model cannot take `clip`, naming the part and the family."""
        if clip.kind == "video" and not self.video:
            why = f": {self.video_refusal}" if self.video_refusal else ""
            raise invalid_argument(
                f"{clip.where}: model {model_id!r} ({self.family}) does not take video{why}",
                field=clip.where,
            )
        sampling = clip.part.video.sampling if clip.kind == "video" else None
        if sampling is not None and (sampling.min_pixels or sampling.max_pixels) and not self.pixel_bounds:
            name = "min_pixels" if sampling.min_pixels else "max_pixels"
            raise invalid_argument(
                f"{clip.where}: model {model_id!r} ({self.family}) takes no per-frame pixel bounds for "
                f"video (its processor sizes frames itself); leave {name} unset",
                field=f"{clip.where}.video.sampling.{name}",
            )
        if clip.kind == "audio" and not self.audio:
            raise invalid_argument(
                f"{clip.where}: model {model_id!r} ({self.family}) does not take audio",
                field=clip.where,
            )


def _token_id(processor: Any, config: Any, name: str) -> int | None:
    for owner, attribute in ((config, f"{name}_token_id"), (config, f"{name}_token_index")):
        value = getattr(owner, attribute, None)
        if isinstance(value, int):
            return value
    value = getattr(processor, f"{name}_token_id", None)
    return value if isinstance(value, int) else None


def clip_support_for(processor: Any, model: Any, *, frames_as_images: bool) -> ClipSupport:
    """What the loaded model does with clips (see the module docstring)."""
    from mlx_vlm.generate.video import processor_handles_video

    config = getattr(model, "config", None)
    family = str(getattr(config, "model_type", "") or "")
    video_token = _token_id(processor, config, "video")
    video = ""
    video_processor = None
    handles = processor_handles_video(processor) and video_token is not None
    refusal = _misfit(processor.video_processor, getattr(config, "vision_config", None)) if handles else ""
    if handles and not refusal:
        video = "native"
        if family in _QWEN2_VIDEO_FAMILIES:
            own = processor.video_processor
            video_processor = Qwen2VideoProcessor(
                processor.image_processor, min_pixels=own.min_pixels, max_pixels=own.max_pixels
            )
    elif not handles and frames_as_images:
        video = "frames"
    extractor = getattr(processor, "feature_extractor", None)
    audio_token = _token_id(processor, config, "audio")
    audio = (
        extractor is not None and getattr(model, "audio_tower", None) is not None and audio_token is not None
    )
    rate = int(getattr(extractor, "sampling_rate", 16_000) or 16_000)
    return ClipSupport(
        family=family,
        video=video,
        audio=audio,
        video_token_id=video_token if video == "native" else None,
        audio_token_id=audio_token if audio else None,
        video_processor=video_processor,
        audio_sample_rate=rate,
        video_refusal=refusal,
        pixel_bounds=video == "native"
        and hasattr(video_processor or processor.video_processor, "min_pixels"),
    )


# Video processor attribute -> the vision config's name for it.
_VISION_SIZES = {
    "patch_size": "patch_size",
    "pooling_kernel_size": "pooling_kernel_size",
    "temporal_patch_size": "temporal_patch_size",
    "merge_size": "spatial_merge_size",
}


def _misfit(video_processor: Any, vision_config: Any) -> str:
    """Why the checkpoint's video processor cannot feed its vision tower ("" when it can): a
    checkpoint without a video processor config gets mlx-vlm's defaults for the real model (Gemma
    4: 16 px patches pooled 3 x 3), which a tower of other sizes fails on mid-forward."""
    for ours, theirs in _VISION_SIZES.items():
        made, taken = getattr(video_processor, ours, None), getattr(vision_config, theirs, None)
        if isinstance(made, int) and isinstance(taken, int) and made != taken:
            return (
                f"the checkpoint's video processor makes {ours} {made} where its vision tower takes "
                f"{taken} (processor_config.json needs a video_processor entry)"
            )
    return ""


@dataclass(frozen=True, slots=True)
class DecodedClip:
    """A clip decoded (vlmserve.engine.media): frames (T, H, W, 3) uint8 RGB at `fps`, or mono
    float32 samples at `sample_rate`."""

    clip: PromptClip
    content_hash: str
    frames: np.ndarray | None = None
    fps: float = 0.0
    samples: np.ndarray | None = None
    sample_rate: int = 0
    seconds: float = 0.0
    byte_count: int = 0
    # Per-frame pixel bounds the caller asked for (0 = the processor's).
    min_pixels: int = 0
    max_pixels: int = 0

    @property
    def kind(self) -> str:
        return self.clip.kind


def clip_hash(part: pb.Part) -> str:
    """The hash of what the model will see of a clip: the part as sent, sampling included
    (deterministic serialization: equal parts, equal bytes)."""
    return hashlib.sha256(b"clip\0" + part.SerializeToString(deterministic=True)).hexdigest()


def frames_budget(clips: Sequence[DecodedClip], max_frames: int) -> list[list[int]]:
    """Which frames of each clip a family without video takes as images: at most `max_frames`
    (at least 2) in all, evenly kept across the request's clips in order, as mlx-vlm's
    `resolve_video_inputs` keeps them (`subsample_evenly` over all frames)."""
    from mlx_vlm.generate import video

    subsample_evenly: Any = video.subsample_evenly  # unannotated in mlx-vlm
    everything = [
        (index, frame)
        for index, clip in enumerate(clips)
        for frame in range(0 if clip.frames is None else int(clip.frames.shape[0]))
    ]
    kept = subsample_evenly(everything, max(2, max_frames))
    chosen: list[list[int]] = [[] for _ in clips]
    for index, frame in kept:
        chosen[index].append(frame)
    return chosen


class _PerClipPixels:
    """A Qwen video processor run clip by clip, each with the pixel bounds its part asked for;
    everything else (merge_size, fps, ...) is the wrapped processor's."""

    def __init__(self, processor: Any, bounds: Sequence[tuple[int, int]]) -> None:
        self._processor = processor
        self._bounds = list(bounds)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._processor, name)

    def __call__(self, videos: Any, video_metadata: Any = None, **kwargs: Any) -> dict[str, Any]:
        pixels, grids = [], []
        for index, video in enumerate(videos):
            one = copy.copy(self._processor)
            low, high = self._bounds[index]
            if low:
                one.min_pixels = low
            if high:
                one.max_pixels = high
            metadata = None if video_metadata is None else [video_metadata[index]]
            out = one(videos=[video], video_metadata=metadata) if metadata else one(videos=[video])
            pixels.append(np.asarray(out["pixel_values_videos"]))
            grids.append(np.asarray(out["video_grid_thw"]))
        return {
            "pixel_values_videos": np.concatenate(pixels, axis=0),
            "video_grid_thw": np.concatenate(grids, axis=0),
        }


def processor_media(processor: Any, support: ClipSupport, clips: Sequence[DecodedClip]) -> dict[str, Any]:
    """The processor keywords for the clips it renders natively, as mlx-vlm's `prepare_inputs`
    passes decoded clips: `videos` (T, C, H, W) uint8 each, `fps` and `video_metadata` (the
    frames are the sampled ones, at the clip's fps), `audio` (samples at the extractor's rate)."""
    from mlx_vlm.utils import VideoMetadata

    videos = [clip for clip in clips if clip.kind == "video" and clip.frames is not None]
    audio = [clip for clip in clips if clip.kind == "audio" and clip.samples is not None]
    media: dict[str, Any] = {}
    if videos:
        media["videos"] = [np.ascontiguousarray(clip.frames.transpose(0, 3, 1, 2)) for clip in videos]  # type: ignore[union-attr]
        media["fps"] = [clip.fps for clip in videos]
        media["video_metadata"] = [
            VideoMetadata(total_num_frames=len(frames), fps=clip.fps, frames_indices=list(range(len(frames))))
            for clip, frames in zip(videos, media["videos"], strict=True)
        ]
        own = support.video_processor or getattr(processor, "video_processor", None)
        bounds = [(clip.min_pixels, clip.max_pixels) for clip in videos]
        if own is not None and any(low or high for low, high in bounds) and hasattr(own, "min_pixels"):
            own = _PerClipPixels(own, bounds)
        if own is not None and own is not getattr(processor, "video_processor", None):
            media["video_processor"] = own
    if audio:
        media["audio"] = [clip.samples for clip in audio]
    return media


def token_runs(ids: Sequence[int], token_id: int) -> Iterator[tuple[int, int]]:
    """(start, length) of each run of `token_id` in `ids`: clips' placeholders here, images'
    in loop/model_inputs.py."""
    index, total = 0, len(ids)
    while index < total:
        if ids[index] != token_id:
            index += 1
            continue
        start = index
        while index < total and ids[index] == token_id:
            index += 1
        yield start, index - start


def clip_spans(
    ids: Sequence[int],
    token_id: int,
    clips: Sequence[DecodedClip],
    arrays: Mapping[str, np.ndarray],
) -> list[PreparedClip]:
    """Each clip's placeholder runs of `token_id` in the processed prompt, in order.

    A clip is one run (Qwen2-VL video, audio), one per two frames (Qwen3-VL: a timestamp between),
    or one per frame (Gemma 4 video). When the runs cannot be told apart that way, every clip of
    the kind gets all of them under one combined hash: the prefix cache stays exact (it can only
    reuse the clips as a whole)."""
    runs = list(token_runs(ids, token_id))
    per_clip: list[int] | None = None
    if len(runs) == len(clips):
        per_clip = [1] * len(clips)
    elif "video_grid_thw" in arrays and sum(int(g[0]) for g in arrays["video_grid_thw"]) == len(runs):
        per_clip = [int(g[0]) for g in arrays["video_grid_thw"]]
    elif "num_frames_per_video" in arrays and sum(int(n) for n in arrays["num_frames_per_video"]) == len(
        runs
    ):
        per_clip = [int(n) for n in arrays["num_frames_per_video"]]
    prepared: list[PreparedClip] = []
    if per_clip is None or len(per_clip) != len(clips):
        combined = hashlib.sha256("\0".join(clip.content_hash for clip in clips).encode()).hexdigest()
        return [
            _prepared(clip, tuple(runs) if index == 0 else (), combined) for index, clip in enumerate(clips)
        ]
    start = 0
    for clip, count in zip(clips, per_clip, strict=True):
        prepared.append(_prepared(clip, tuple(runs[start : start + count]), clip.content_hash))
        start += count
    return prepared


def _prepared(clip: DecodedClip, spans: tuple[tuple[int, int], ...], content_hash: str) -> PreparedClip:
    frames = 0 if clip.frames is None else int(clip.frames.shape[0])
    return PreparedClip(
        content_hash=content_hash,
        kind=clip.kind,
        spans=spans,
        byte_count=clip.byte_count,
        frames=frames,
        seconds=clip.seconds,
    )


def placeholder_count(ids: Sequence[int], token_id: int | None) -> int:
    return 0 if token_id is None else sum(1 for token in ids if token == token_id)


def check_placeholders(ids: Sequence[int], support: ClipSupport, clips: Sequence[DecodedClip]) -> None:
    """The template wrote one placeholder per clip of each kind it renders natively."""
    for kind, token_id in (("video", support.video_token_id), ("audio", support.audio_token_id)):
        expected = sum(1 for clip in clips if clip.kind == kind)
        written = placeholder_count(ids, token_id)
        if expected and written != expected:
            raise invalid_argument(
                f"the chat template wrote {written} {kind} slots for {expected} {kind} clips; this "
                f"model's template does not place every {kind} clip",
                field="messages",
            )


def prompt_clips(
    ids: Sequence[int], support: ClipSupport, clips: Sequence[DecodedClip], arrays: Mapping[str, np.ndarray]
) -> tuple[PreparedClip, ...]:
    """Each natively rendered clip's placeholder runs in the final prompt, in prompt order."""
    prepared: list[PreparedClip] = []
    for kind, token_id in (("video", support.video_token_id), ("audio", support.audio_token_id)):
        of_kind = [clip for clip in clips if clip.kind == kind]
        if of_kind and token_id is not None:
            prepared += clip_spans(ids, token_id, of_kind, arrays)
    return tuple(sorted(prepared, key=lambda clip: clip.spans[0][0] if clip.spans else len(ids)))

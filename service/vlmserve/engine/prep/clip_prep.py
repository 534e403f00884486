"""A request's clips: decoded (bounded, `vlmserve.engine.media`), refused where the family cannot
take them, and, for families that take video as frames, turned into images at the clip's place.
No MLX; runs in request-preparation threads (prep/preparer.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from PIL import Image

from vlmserve.engine.jobs import PreparedImage
from vlmserve.engine.media import MediaError, MediaLimits, decode_audio, decode_video
from vlmserve.engine.prep.clip_inputs import ClipSupport, DecodedClip, clip_hash, frames_budget
from vlmserve.engine.prep.prompt import PromptClip, TemplateConversation
from vlmserve.engine.request_errors import RequestError, invalid_argument

__all__ = ["ClipPreparer", "ImageSlot", "frame_image", "ordered_slots", "slot_pixels"]


@dataclass(frozen=True, slots=True)
class ImageSlot:
    """The i-th image placeholder of a rendered prompt: a request image (`image`: its index in
    the request's images) or a frame of a clip taken as an image (`clip`, `frame`)."""

    image: int = -1
    clip: int = -1
    frame: int = -1


class ClipPreparer:
    """Clips for one loaded model (thread-safe: nothing mutable)."""

    def __init__(self, support: ClipSupport, limits: MediaLimits, model_id: str) -> None:
        self.support = support
        self._limits = limits
        self._model_id = model_id

    def decode(self, clips: Sequence[PromptClip], cancelled: Callable[[], bool]) -> list[DecodedClip]:
        """Every clip refused or decoded, in order; the caller leaving stops between clips."""
        for clip in clips:  # refusals first: nothing is decoded for a request that fails
            self.support.refuse(clip, self._model_id)
        decoded: list[DecodedClip] = []
        for clip in clips:
            if cancelled():
                raise RequestError(
                    grpc.StatusCode.CANCELLED, "the caller left while the request was prepared"
                )
            decoded.append(self._decode(clip))
        return decoded

    def _decode(self, clip: PromptClip) -> DecodedClip:
        part = clip.part
        content_hash = clip_hash(part)
        try:
            if clip.kind == "video":
                video = decode_video(part.video, self._limits)
                sent = (
                    len(part.video.data)
                    if part.video.WhichOneof("source") == "data"
                    else sum(len(frame.data) for frame in part.video.frames.frames)
                )
                return DecodedClip(
                    clip=clip,
                    content_hash=content_hash,
                    frames=video.frames,
                    fps=float(video.fps),
                    seconds=float(video.duration_s),
                    byte_count=sent,
                    min_pixels=int(part.video.sampling.min_pixels),
                    max_pixels=int(part.video.sampling.max_pixels),
                )
            audio = decode_audio(part.audio, self._limits)
        except MediaError as error:
            inside = error.field or clip.kind  # "video.sampling.max_frames", "audio", ...
            raise invalid_argument(f"{clip.where}: {error.reason}", field=f"{clip.where}.{inside}") from None
        if int(audio.sample_rate) != self.support.audio_sample_rate:
            raise invalid_argument(
                f"{clip.where}: the audio was decoded at {audio.sample_rate} Hz; this model's feature "
                f"extractor takes {self.support.audio_sample_rate} Hz",
                field=f"{clip.where}.audio",
            )
        return DecodedClip(
            clip=clip,
            content_hash=content_hash,
            samples=audio.samples,
            sample_rate=int(audio.sample_rate),
            seconds=float(audio.duration_s),
            byte_count=len(part.audio.data),
        )

    def as_images(
        self, conversation: TemplateConversation, clips: Sequence[DecodedClip]
    ) -> tuple[TemplateConversation, list[DecodedClip], list[ImageSlot] | None]:
        """For a family that takes video as frames: each video entry of the conversation becomes
        its kept frames' image entries (`frames_budget`). Returns the conversation, the clips the
        processor renders natively, and the prompt's image slots in order (None: only the
        request's images, in order)."""
        if self.support.video != "frames" or not any(clip.kind == "video" for clip in clips):
            return conversation, list(clips), None
        videos = [index for index, clip in enumerate(clips) if clip.kind == "video"]
        # One budget for the request, as mlx-vlm's `resolve_video_inputs` (its max_frames: 16).
        kept = frames_budget([clips[index] for index in videos], self._limits.video_max_frames)
        frames_of = dict(zip(videos, kept, strict=True))
        slots: list[ImageSlot] = []
        images = 0
        video_order = iter(videos)
        messages: list[dict[str, Any]] = []
        for message in conversation.messages:
            content = message.get("content")
            if not isinstance(content, list):
                messages.append(message)
                continue
            items: list[dict[str, Any]] = []
            for item in content:
                kind = item.get("type") if isinstance(item, dict) else None
                if kind == "image":
                    slots.append(ImageSlot(image=images))
                    images += 1
                    items.append(item)
                elif kind == "video":
                    index = next(video_order)
                    for frame in frames_of[index]:
                        slots.append(ImageSlot(clip=index, frame=frame))
                        items.append({"type": "image"})
                else:
                    items.append(item)
            messages.append({**message, "content": items})
        native = [clip for clip in clips if clip.kind != "video"]
        return dataclasses.replace(conversation, messages=messages), native, slots


def ordered_slots(slots: list[ImageSlot] | None, image_count: int) -> list[ImageSlot]:
    return slots if slots is not None else [ImageSlot(image=index) for index in range(image_count)]


def slot_pixels(slot: ImageSlot, decoded: Sequence[Image.Image], clips: Sequence[DecodedClip]) -> Image.Image:
    """The pixels of an image slot: a request image (decoded), or a clip's frame."""
    if slot.image >= 0:
        return decoded[slot.image]
    frames = clips[slot.clip].frames
    assert frames is not None
    return Image.fromarray(frames[slot.frame])


def frame_image(slot: ImageSlot, clips: Sequence[DecodedClip]) -> PreparedImage:
    """A clip's frame taken as an image: keyed by the clip's hash and the frame's index."""
    clip = clips[slot.clip]
    return PreparedImage(content_hash=f"{clip.content_hash}:frame:{slot.frame}", token_count=0, arrays={})

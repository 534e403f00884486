"""Video and audio clips for the engine tests: frames and tones made here, the contract parts
that carry them, and mlx-vlm's own generation on the same frames and samples (the reference)."""

from __future__ import annotations

import dataclasses
import io
import wave
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from tests.engine._family_engine import reference_steps
from training.families import FAMILIES, build_family
from training.families._base import FamilyFiles
from training.squares_video import encode_mp4
from vlmserve.engine.model import LoadedModel
from vlmserve.engine.v1 import engine_pb2 as pb

FPS = 2.0
RATE = 16_000


def frames(count: int, width: int = 64, height: int = 48, seed: int = 0) -> np.ndarray:
    """(T, H, W, 3) uint8: a square moving across a gradient, so frames differ."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // width, y * 255 // height, rng.integers(0, 256, (height, width))], axis=-1)
    out = np.repeat(base[None].astype(np.uint8), count, axis=0)
    for index in range(count):
        left = (index * 7) % (width - 12)
        out[index, 10:22, left : left + 12] = (255, 0, 0)
    return out


def png_bytes(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def video(
    pixels: np.ndarray,
    fps: float = FPS,
    *,
    sample_fps: float = 0.0,
    max_frames: int = 0,
    min_pixels: int = 0,
    max_pixels: int = 0,
) -> pb.Part:
    """A clip sent as frames (VideoFrames at `fps`), decoded as images are; the rest: the
    sampling the caller asks for (0: the engine's defaults)."""
    parts = [pb.ImagePart(data=png_bytes(frame), media_type="image/png") for frame in pixels]
    sampling = pb.VideoSampling(
        fps=sample_fps, max_frames=max_frames, min_pixels=min_pixels, max_pixels=max_pixels
    )
    return pb.Part(video=pb.VideoPart(frames=pb.VideoFrames(frames=parts, fps=fps), sampling=sampling))


def mp4_bytes(pixels: np.ndarray, fps: float) -> bytes:
    """The frames encoded as an MP4 (MPEG-4 Part 2, OpenCV's writer): a container as clients send."""
    return encode_mp4(pixels, fps)


def tones(seconds: float = 1.0, hertz: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.5 * np.sin(2 * np.pi * hertz * t)).astype(np.float32)


def wav_bytes(samples: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes((np.clip(samples, -1, 1) * 32767).astype(np.int16).tobytes())
    return buffer.getvalue()


def audio(samples: np.ndarray) -> pb.Part:
    return pb.Part(audio=pb.AudioPart(data=wav_bytes(samples), media_type="audio/wav"))


def wav_samples(samples: np.ndarray) -> np.ndarray:
    """The samples as a 16-bit WAV holds them (what the engine decodes)."""
    return (np.clip(samples, -1, 1) * 32767).astype(np.int16).astype(np.float32) / 32768.0


def reference_clip_tokens(
    loaded: LoadedModel,
    messages: list[pb.Message],
    max_tokens: int,
    *,
    videos: Sequence[np.ndarray] = (),
    audios: Sequence[np.ndarray] = (),
    fps: float = FPS,
    processor: Any = None,
) -> tuple[list[int], int, list[float]]:
    """(generated ids, prompt tokens, each chosen token's logprob) from mlx-vlm's `prepare_inputs`
    and `stream_generate` on the engine's prompt, its images, the clips' frames ((T, H, W, 3)
    each, passed as arrays) and samples."""
    clips: dict[str, Any] = {}
    if videos:
        clips["videos"] = [np.ascontiguousarray(v.transpose(0, 3, 1, 2)) for v in videos]
        clips["fps"] = fps
    if audios:
        clips["audio"] = list(audios)
    steps, prompt_tokens = reference_steps(loaded, messages, max_tokens, processor=processor, **clips)
    tokens = list(steps[-1].token_ids)
    logprobs = [float(step.logprobs[step.token]) for step in steps if step.logprobs is not None]
    return tokens, prompt_tokens, logprobs[:max_tokens]


# A small audio tower for the Gemma 4 fixture (its published checkpoints with audio: E2B/E4B),
# so the audio path runs on the family's real architecture.
GEMMA4_AUDIO = {
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "subsampling_conv_channels": [8, 4],
    "conv_kernel_size": 5,
    "attention_chunk_size": 12,
    "attention_context_left": 13,
    "attention_context_right": 0,
    "output_proj_dims": 32,
}


# The fixture's vision tower sizes (8 px patches pooled 2 x 2) for its video processor: without
# a `video_processor` entry mlx-vlm's Gemma4Processor takes the real model's (16 px, 3 x 3).
GEMMA4_VIDEO_PROCESSOR = {"patch_size": 8, "pooling_kernel_size": 2, "max_soft_tokens": 70}


def build_gemma4_with_audio(out_dir: Path) -> Path:
    """The gemma4 family fixture with a tiny audio tower and a video processor of its sizes."""
    family = FAMILIES["gemma4"]

    def files(tokenizer: Any) -> FamilyFiles:
        made = family.files(tokenizer)
        extra = dict(made.extra_json)
        processor = dict(extra["processor_config.json"])
        processor["video_processor"] = dict(GEMMA4_VIDEO_PROCESSOR)
        extra["processor_config.json"] = processor
        return dataclasses.replace(
            made, config={**made.config, "audio_config": dict(GEMMA4_AUDIO)}, extra_json=extra
        )

    return build_family(dataclasses.replace(family, files=files), out_dir)

"""The engine's settings: which model, and the bounds of what the generation thread serves at once.

Declared once (vlmserve.server.settings): flags, environment and docs/configuration.md come from here.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from vlmserve.common.images import DEFAULT_MAX_IMAGE_BYTES, ImageLimits
from vlmserve.engine.kv.layout import UNIFORM, KVBits, KVQuantScheme
from vlmserve.engine.media import MediaLimits
from vlmserve.engine.model import DEFAULT_MODEL_PATH, Distribution, Dtype
from vlmserve.engine.model_lifecycle import LoadWhen
from vlmserve.engine.prep.preparer import DEFAULT_MAX_REQUEST_PIXELS
from vlmserve.server.settings import DeclaredSettings, Option

# Speculative decoding's draft sources (speculation/).
Speculation = Literal["off", "lookup", "draft", "auto"]

__all__ = ["EngineConfig", "MediaSettings"]


_MEDIA = MediaLimits()


class MediaSettings(DeclaredSettings):
    """Video and audio clips: bounds checked from the container's header before decoding, the
    decoding worker's limits, and the frame sampling a request gets when it asks for none
    (engine/media/, docs/video-audio.md)"""

    max_video_bytes: int = Field(_MEDIA.max_video_bytes, ge=1, description="bytes per video clip")
    max_video_seconds: float = Field(_MEDIA.max_video_seconds, gt=0, description="seconds per video clip")
    max_video_source_pixels: int = Field(
        _MEDIA.max_video_source_pixels, ge=1, description="pixels of one frame of a clip as sent (its header)"
    )
    max_video_frames: int = Field(
        _MEDIA.max_video_frames,
        ge=1,
        description="frames sampled from one clip (a request asking more is refused)",
    )
    max_video_frame_pixels: int = Field(
        _MEDIA.max_video_frame_pixels,
        ge=1,
        description="pixels of one sampled frame; bigger ones are scaled down (aspect kept) as decoded",
    )
    max_video_pixels: int = Field(
        _MEDIA.max_video_pixels, ge=1, description="sampled frames x pixels of one clip (memory: x3 bytes)"
    )
    video_fps: float = Field(
        _MEDIA.video_fps, gt=0, description="frames per second sampled when a request sets no fps"
    )
    video_max_frames: int = Field(
        _MEDIA.video_max_frames,
        ge=1,
        description="frames sampled from a clip when a request sets no max_frames",
    )
    max_audio_bytes: int = Field(_MEDIA.max_audio_bytes, ge=1, description="bytes per audio clip")
    max_audio_seconds: float = Field(_MEDIA.max_audio_seconds, gt=0, description="seconds per audio clip")
    max_audio_sample_rate: int = Field(
        _MEDIA.max_audio_sample_rate, ge=1, description="sample rate of an audio clip as sent, in Hz"
    )
    max_audio_channels: int = Field(_MEDIA.max_audio_channels, ge=1, description="channels of an audio clip")
    media_decode_timeout_s: float = Field(
        _MEDIA.decode_timeout_s,
        gt=0,
        description="seconds one clip may take to decode (its worker is killed)",
    )
    media_decode_memory_mib: int = Field(
        _MEDIA.decode_memory_mib,
        ge=256,
        description="MiB of memory a clip's decoding worker may hold (its imports take about 200)",
    )

    @model_validator(mode="after")
    def _default_within_the_cap(self) -> MediaSettings:
        # Otherwise every request that asks for no max_frames would be refused.
        if self.video_max_frames > self.max_video_frames:
            raise ValueError("--video-max-frames must not be more than --max-video-frames")
        return self


class EngineConfig(DeclaredSettings):
    """Model and bounds: what the generation thread serves, and how much at once"""

    ENV_PREFIX: ClassVar[str] = "VLMSERVE_ENGINE_"

    model: Annotated[str, Option(env="VLMSERVE_MODEL", default_text="models/qwen2-vl-squares")] = Field(
        str(DEFAULT_MODEL_PATH), description="local model directory or Hugging Face id"
    )
    trust_remote_code: bool = Field(False, description="allow code shipped with the checkpoint")
    dtype: Dtype = Field(
        "auto",
        description="weight dtype; auto = float32 on the CPU backend (much faster there), as stored on a GPU",
    )
    max_output_tokens: Annotated[int, Option(flag="--max-tokens")] = Field(
        4096,
        ge=1,
        description="cap on generated tokens per request (also the default when a request sets none)",
    )
    max_queue: int = Field(
        64, ge=1, description="requests waiting for a slot; more are refused with RESOURCE_EXHAUSTED"
    )
    max_active: int = Field(
        16, ge=1, description="requests in flight: decoding as one batch, or preparing and prefilling"
    )
    prefill_chunk_tokens: Annotated[int, Option(flag="--prefill-chunk")] = Field(
        256, ge=1, description="prompt tokens per prefill chunk (a request's chunks are always whole)"
    )
    step_tokens: int = Field(
        256,
        ge=1,
        description="token budget of one engine step: one per decoding request plus whole prefill chunks "
        "(at least one chunk runs per step)",
    )
    # See prefix_cache.py.
    prefix_cache_min_tokens: int = Field(
        64,
        ge=0,
        description="reuse a finished request's KV cache (same partition) for a shared prompt prefix "
        "this long (0: off)",
    )
    prefix_cache_mib: int = Field(
        1024,
        ge=0,
        description="MiB of KV caches kept for prefix reuse; least recently used go first (0: off)",
    )
    # See loop/memory_budget.py.
    memory_budget_mib: int = Field(
        0,
        ge=0,
        description="memory the requests in flight may hold together (KV for prompt + max tokens at the "
        "cache's precision, images, and the vision tower's activations until the prompt is in); a request "
        "waits while it would not fit and is refused when it never can (0: three quarters of the device's "
        "memory less the model's weights)",
    )
    # See kv/layout.py.
    kv_bits: KVBits | None = Field(
        None,
        description="store the KV cache quantized to this many bits (mlx-vlm's quantized caches: the batch, "
        "prompts shared in flight and the prefix cache and its disk tier); unset: the model's own precision",
    )
    kv_quant_scheme: KVQuantScheme = Field(
        UNIFORM,
        description="how --kv-bits quantizes: uniform (mx.quantize in groups, mlx-vlm's quantized caches) or "
        "turboquant (mlx-vlm's TurboQuant: rotated vectors, codebook indices and one norm per vector; "
        "fewer bytes at the same bits, any head width)",
    )
    kv_group_size: int = Field(
        64,
        ge=32,
        description="values per quantization group with --kv-bits (a model whose head dimension it does not "
        "divide uses 32)",
    )
    # See loop/prefix_disk.py.
    prefix_cache_dir: str | None = Field(
        None,
        description="folder for the prefix cache's disk tier: entries evicted from memory and all at "
        "shutdown are written there and loaded back on a hit, also after a restart and by other engines "
        "of the same model sharing it (unset: memory only)",
    )
    prefix_cache_disk_mib: int = Field(
        8192,
        ge=0,
        description="MiB of the disk tier's folder (this model's entries); least recently used go first",
    )
    # See loop/prompt_batch.py (PromptBatch.follow_leaders) and docs/performance.md.
    shared_prefix_min_tokens: int = Field(
        16,
        ge=0,
        description="a request that starts with this many of the same prompt tokens as another one in "
        "flight (same partition) takes that one's KV for them instead of computing them (0: off)",
    )
    # See speculation/ and docs/performance.md.
    speculative: Speculation = Field(
        "auto",
        description="several tokens per forward: drafts verified in the batched step, output unchanged "
        "(greedy and seeded sampling take the very tokens they take without it); lookup = prompt "
        "lookup (n-gram matches in the row's prompt and output) and grammar fast-forward; draft = "
        "--draft-model's drafts and grammar fast-forward; auto = lookup, and the draft model's drafts "
        "where lookup has none when one is given; off = one token per forward",
    )
    draft_model: str | None = Field(
        None,
        description="mlx-vlm drafter checkpoint for the model (a directory or hub id; its kind, e.g. an "
        "MTP head, auto-detected as mlx-vlm does) proposing drafts that the model verifies",
    )
    speculative_max_draft: int = Field(
        8, ge=1, le=64, description="draft tokens a row may have verified in one forward"
    )
    speculative_position_cost: float = Field(
        0.065,
        ge=0.0,
        description="what one more position per row adds to a decode forward's cost, as a share of a "
        "one-position step (~0.065 on a CPU, ~0.01 on Apple silicon): drafts are verified only where the "
        "expected accepted tokens pay for it",
    )
    # See vision_cache.py.
    vision_cache_mib: int = Field(
        256, ge=0, description="MiB of image features kept by image content hash (0: off)"
    )
    max_images_per_request: Annotated[int, Option(flag="--max-images")] = Field(
        16, ge=1, description="images per request"
    )
    max_image_bytes: int = Field(DEFAULT_MAX_IMAGE_BYTES, ge=1, description="bytes per image")
    # From the header, before decoding: decompression bombs are refused undecoded.
    max_image_pixels: int = Field(ImageLimits().max_pixels, ge=1, description="pixels per image")
    max_request_pixels: int = Field(
        DEFAULT_MAX_REQUEST_PIXELS,
        ge=1,
        description="pixels of all of one request's images together, from their headers, before decoding",
    )
    image_decode_slots: int = Field(
        2, ge=1, description="images decoded at once, engine-wide (each may be full size while it decodes)"
    )
    prepare_workers: int = Field(
        4, ge=1, description="threads preparing requests (decode, render, tokenize) beside generation"
    )
    media: MediaSettings = Field(default_factory=MediaSettings, description="video and audio clips")
    warmup: bool = Field(
        True,
        description="before serving, run what a first turn runs (loop/warm_up.py): a short request with "
        "an image, a prompt of one whole prefill chunk and a bit, and its next turn from the prefix cache",
    )
    # See distributed.py and docs/deployment.md.
    distributed: Distribution = Field(
        "off",
        description="one model across the processes of an mx.distributed group (started by mlx.launch): "
        "tensor or pipeline parallel; rank 0 serves, the other ranks follow its batches",
    )
    # See model_lifecycle.py and docs/deployment.md ("Load on demand, free when idle").
    load: LoadWhen = Field(
        "eager",
        description="eager: read the weights before serving; lazy: serve at once (health SERVING, model "
        "info answered) and read them for the first generation, which waits meanwhile",
    )
    idle_unload_seconds: float | None = Field(
        None,
        gt=0,
        description="free the weights and caches after this many seconds without a generation; the next "
        "one reads them again (none: never)",
    )

    @model_validator(mode="after")
    def _lifecycle_not_distributed(self) -> EngineConfig:
        if self.distributed != "off" and (self.load != "eager" or self.idle_unload_seconds is not None):
            # Every rank must run the same steps; a load or unload decided by time would split them.
            raise ValueError("--load lazy and --idle-unload-seconds cannot be used with --distributed")
        return self

    @model_validator(mode="after")
    def _draft_needs_a_model(self) -> EngineConfig:
        if self.speculative == "draft" and self.draft_model is None:
            raise ValueError("--speculative draft needs --draft-model")
        return self

    @property
    def image_limits(self) -> ImageLimits:
        return ImageLimits(max_bytes=self.max_image_bytes, max_pixels=self.max_image_pixels)

    @property
    def media_limits(self) -> MediaLimits:
        media = self.media
        return MediaLimits(
            max_video_bytes=media.max_video_bytes,
            max_video_seconds=media.max_video_seconds,
            max_video_source_pixels=media.max_video_source_pixels,
            max_video_frames=media.max_video_frames,
            max_video_frame_pixels=media.max_video_frame_pixels,
            max_video_pixels=media.max_video_pixels,
            video_fps=media.video_fps,
            video_max_frames=media.video_max_frames,
            max_audio_bytes=media.max_audio_bytes,
            max_audio_seconds=media.max_audio_seconds,
            max_audio_sample_rate=media.max_audio_sample_rate,
            max_audio_channels=media.max_audio_channels,
            decode_timeout_s=media.media_decode_timeout_s,
            decode_memory_mib=media.media_decode_memory_mib,
            images=self.image_limits,
        )

"""An AudioPart -> float32 mono samples at 16 kHz, bounded before anything is decoded.

Size and signature are checked here; the header's sample rate, channels and length, then the
samples, in the bounded worker (`decoders.audio_samples` via `worker.run_bounded`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vlmserve.engine.media.limits import AUDIO_SAMPLE_RATE, MediaError, MediaLimits, check_format, over_limit
from vlmserve.engine.media.worker import run_bounded
from vlmserve.engine.metrics import MediaMetrics
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = ["DecodedAudio", "decode_audio"]


@dataclass(frozen=True, slots=True)
class DecodedAudio:
    """A clip's samples, downmixed and resampled for the model's audio encoder."""

    samples: np.ndarray  # float32 mono at `sample_rate`
    sample_rate: int  # AUDIO_SAMPLE_RATE (16 kHz)
    duration_s: float


def decode_audio(
    part: pb.AudioPart, limits: MediaLimits, *, metrics: MediaMetrics | None = None
) -> DecodedAudio:
    """The samples of `part`; MediaError (INVALID_ARGUMENT) naming the limit or rule broken."""
    try:
        decoded = _decode(part, limits)
    except MediaError as error:
        if metrics is not None:
            metrics.refused.labels("audio", error.code).inc()
        raise
    if metrics is not None:
        metrics.clips.labels("audio").inc()
        metrics.audio_seconds.inc(decoded.duration_s)
    return decoded


def _decode(part: pb.AudioPart, limits: MediaLimits) -> DecodedAudio:
    source = part.WhichOneof("source")
    if source == "file_id":
        raise MediaError(
            "a file_id is resolved to the clip's bytes before the engine; the engine takes bytes",
            code="file_id",
            field="audio.file_id",
        )
    if not part.data:
        raise MediaError("the audio has no data", code="empty", field="audio.data")
    if len(part.data) > limits.max_audio_bytes:
        raise over_limit(
            "the audio", f"{len(part.data)} bytes", "max_audio_bytes", f"{limits.max_audio_bytes} bytes",
            code="bytes", field="audio.data",
        )  # fmt: skip
    audio_format = check_format(part.data, part.media_type, "audio")
    samples, duration = run_bounded(
        "audio_samples",
        (bytes(part.data), audio_format, limits),
        what="audio",
        timeout_s=limits.decode_timeout_s,
        memory_mib=limits.decode_memory_mib,
    )
    return DecodedAudio(samples=samples, sample_rate=AUDIO_SAMPLE_RATE, duration_s=duration)
